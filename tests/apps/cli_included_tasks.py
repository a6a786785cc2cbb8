"""Tasks of ``tests.apps.cli_imports_app`` found through its ``include`` setting: an ``@cron`` job."""

from __future__ import annotations

import anarchon_celery
from tests.apps.cli_imports_app import app


@anarchon_celery.cron("0 4 * * *")
@app.task(name="cli_imports.included", shared=False)
def included() -> str:
    return "included"
