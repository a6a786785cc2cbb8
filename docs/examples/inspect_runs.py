"""A project's runs, read and started from Python (the history page).

Run it beside a beat of ``proj``: ``python3 inspect_runs.py``.
"""

# --- example
from proj import app

import anarchon_celery

for run in anarchon_celery.history(app, "refresh_prices", limit=10):  # newest first (at most history_size)
    print(run.slot, run.status, run.instance, run.worker)

latest = anarchon_celery.last_run(app, "refresh_prices")  # the latest Run, or None
manual = anarchon_celery.run_now(app, "refresh_prices")  # sent now: trigger "manual", its own run id
print(latest.status if latest else "none", manual.run_id, manual.task_id)
