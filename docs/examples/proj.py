# proj.py: a Celery project whose schedules anarchon_celery runs (the getting-started page).
from celery import Celery

import anarchon_celery

app = Celery("proj", broker="amqp://guest:guest@localhost//")
app.conf.timezone = "Europe/Paris"


@anarchon_celery.cron("*/5 * * * *")  # every 5 minutes, Paris time
@app.task
def refresh_prices() -> None: ...


@app.task
def report(kind: str) -> None: ...


app.conf.beat_schedule = {  # plain beat entries work too
    "nightly-report": {"task": "proj.report", "schedule": "30 2 * * *", "args": ("daily",)},
}
