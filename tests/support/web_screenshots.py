"""The screenshots of the schedules page in the documentation (``docs/images/web-*.png``), taken
by a real headless Chromium of a real deployment: ``tests.apps.web_app`` on a SQLite file, a beat
and a worker running its tasks for a minute, and ``celery anarchon web``.

Run it from the repository's root, with RabbitMQ on 127.0.0.1:5672 (the tasks' broker)::

    python3 -m tests.support.web_screenshots docs/images

Everything it makes goes with it: the processes, the SQLite file, the broker's queues under its
prefix.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from zoneinfo import ZoneInfo

import anarchon_celery

from ..apps.web_app import FOREIGN_JOB, RUNTIME_JOB, make
from .broker_control import BROKER
from .processes import delete_prefixed, start_celery, stop, wait_for_line
from .web import browser, start_web, web_port

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.apps.web_app"
#: How long the beat and the worker run before the screenshots: runs enough for a chart.
RUNNING_S = 70


def take(out: Path, work: Path) -> list[Path]:
    """Start the deployment, take the screenshots into ``out``; the files written."""
    prefix = f"shot-{uuid.uuid4().hex[:8]}."
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        WEB_APP_PREFIX=prefix,
        WEB_APP_BACKEND=f"sqlite:///{work / 'anarchon.db'}",
        WEB_APP_JITTER_MS="400",
    )
    env.pop("ANARCHON_WEB_PASSWORD", None)
    app = make(env)
    anarchon_celery.add_job(app, RUNTIME_JOB, task="shop.report", schedule="0 7 * * 1-5", args=["customer-42"])
    anarchon_celery.add_job(make(dict(env, WEB_APP_EXTRA="1")), FOREIGN_JOB, task="shop.import_legacy", schedule=900)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        worker_args = ["worker", "-l", "info", "-c", "2", "-n", "worker-1@%h", "--pidfile="]
        procs.append(start_celery(worker_args, work / "worker.log", env, app=APP, cwd=ROOT))
        beat_args = ["beat", "-S", "anarchon_celery.Scheduler", "-l", "info", "--pidfile="]
        procs.append(start_celery(beat_args, work / "beat.log", env, app=APP, cwd=ROOT))
        wait_for_line(work / "worker.log", "ready", procs[0], timeout=60)
        procs.append(start_web(env, work / "web.log", app=APP))
        port = web_port(work / "web.log", procs[-1])
        time.sleep(RUNNING_S)
        anarchon_celery.pause(app, "nightly-report", note="ledger migration, OPS-42", by="ann@ops-1")
        anarchon_celery.run_now(app, "refresh_prices")
        return _shoot(out, f"http://127.0.0.1:{port}", app)
    finally:
        for proc in reversed(procs):
            stop(proc)
        delete_prefixed(prefix, BROKER)


def _shoot(out: Path, site: str, app: object) -> list[Path]:
    written = []
    with browser() as chromium:
        page = chromium.new_page(viewport={"width": 1360, "height": 900})
        page.goto(site + "/")
        written.append(out / "web-index.png")
        page.screenshot(path=str(written[-1]), full_page=True)
        page.set_viewport_size({"width": 1360, "height": 1500})  # the definition to the runs' first rows
        page.goto(site + "/jobs/refresh_prices")
        written.append(out / "web-job.png")
        page.screenshot(path=str(written[-1]))
        page.set_viewport_size({"width": 1360, "height": 1040})
        page.goto(f"{site}/jobs/{RUNTIME_JOB}")
        page.locator("details.edit summary").click()
        page.fill("input[name=schedule]", "30 6 * * 1-5")
        anarchon_celery.update_job(app, RUNTIME_JOB, kwargs={"format": "pdf"}, by="bob@ops-2")
        with page.expect_navigation():
            page.get_by_role("button", name="Save", exact=True).click()
        written.append(out / "web-conflict.png")
        page.screenshot(path=str(written[-1]))
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="The folder the PNG files are written to (docs/images).")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    started = dt.datetime.now(ZoneInfo("UTC"))
    with tempfile.TemporaryDirectory() as work:
        for path in take(args.out, Path(work)):
            print(f"{path} ({path.stat().st_size // 1024} KiB)")
    print(f"taken in {(dt.datetime.now(ZoneInfo('UTC')) - started).seconds} s")


if __name__ == "__main__":
    main()
