"""Run one python block of the documentation, given on stdin (``python -m tests.support.doc_blocks
WHERE``, WHERE naming it in tracebacks): in a fresh copy of the getting-started project
(``docs/examples/proj.py``), then the app's configuration is read and checked as the scheduler
would (settings, backend, jobs), with every backend URL the block assigns to ``anarchon_backend``
made into a backend (which connects to nothing). Prints ``configuration checked`` when all is
well; raises otherwise."""

from __future__ import annotations

import ast
import sys
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

from celery.schedules import crontab

from anarchon_celery.backends import Backend, backend_for
from anarchon_celery.jobs import collect_jobs
from anarchon_celery.settings import Settings

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"


def project() -> dict[str, Any]:
    """The getting-started project, as a module named proj would be."""
    namespace: dict[str, Any] = {"__name__": "proj"}
    source = EXAMPLES / "proj.py"
    exec(compile(source.read_text(), str(source), "exec"), namespace)  # noqa: S102
    namespace.update(crontab=crontab, timedelta=timedelta)
    return namespace


def check(app: Any, code: str) -> None:
    settings = Settings.from_app(app)
    collect_jobs(app, settings, backend_for(app, settings))
    for node in ast.walk(ast.parse(code)):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant)
            and any(isinstance(target, ast.Attribute) and target.attr == "anarchon_backend" for target in node.targets)
        ):
            backend_for(app, Settings(backend=node.value.value, prefix=settings.prefix))


def main(where: str) -> None:
    warnings.simplefilter("error")
    code = sys.stdin.read()
    namespace = project()
    if code != (EXAMPLES / "proj.py").read_text():  # (the README shows the project itself)
        exec(compile(code, where, "exec"), namespace)  # noqa: S102
    for value in list(namespace.values()):  # a backend shown whole implements the whole contract
        if isinstance(value, type) and issubclass(value, Backend) and value.__module__ == "proj":
            missing = sorted(getattr(value, "__abstractmethods__", ()))
            assert not missing, f"{where}: {value.__name__} does not implement {missing}"
    check(namespace["app"], code)
    print("configuration checked")


if __name__ == "__main__":
    main(*sys.argv[1:])
