"""Tasks of ``tests.apps.cli_imports_app`` found by ``app.autodiscover_tasks(["tests.apps"], related_name=...)``:
an ``@cron`` job."""

from __future__ import annotations

import anarchon_celery
from tests.apps.cli_imports_app import app


@app.task(name="cli_imports.discovered", shared=False)
@anarchon_celery.cron("*/30 * * * *", name="discovered")
def discovered() -> str:
    return "discovered"
