"""Run one python block of the documentation (``python -m tests.support.doc_blocks PAGE LINE``):
in a fresh copy of the getting-started project (``docs/examples/proj.py``), then the app's
configuration is read and checked as the scheduler would (settings, backend, jobs), with every
backend URL the block assigns to ``anarchon_backend`` made into a backend (which connects to
nothing). Prints ``configuration checked`` when all is well; raises otherwise."""

from __future__ import annotations

import ast
import sys
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

from celery.schedules import crontab

from anarchon_celery.backends import backend_for
from anarchon_celery.jobs import collect_jobs
from anarchon_celery.settings import Settings

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"


def block_at(page: Path, line: int) -> str:
    """The body of the fenced block that opens on ``line`` (1-based) of ``page``."""
    lines = page.read_text().splitlines()
    fence = lines[line - 1][: len(lines[line - 1]) - len(lines[line - 1].lstrip("`"))]
    body = []
    for text in lines[line:]:
        if text.startswith(fence):
            return "\n".join(body) + "\n"
        body.append(text)
    raise SystemExit(f"{page}:{line}: the block does not end")


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


def main(page: str, line: str) -> None:
    warnings.simplefilter("error")
    code = block_at(Path(page), int(line))
    namespace = project()
    if code != (EXAMPLES / "proj.py").read_text():  # (the README shows the project itself)
        exec(compile(code, f"{page}:{line}", "exec"), namespace)  # noqa: S102
    check(namespace["app"], code)
    print("configuration checked")


if __name__ == "__main__":
    main(*sys.argv[1:])
