"""Tasks of ``tests.apps.cli_imports_app`` found through its ``imports`` setting: the task of its
``beat_schedule`` entry ``imported``."""

from __future__ import annotations

from tests.apps.cli_imports_app import app


@app.task(name="cli_imports.imported", shared=False)
def imported() -> str:
    return "imported"
