"""The screenshot of the dashboard's queries in the documentation
(``docs/images/prometheus-dashboard-queries.png``): a real Prometheus scraping two beats and a
worker of ``tests.apps.history_app`` (a job every second, decided in a SQLite file) for a few
minutes, its graph page opened by a real headless Chromium on three of the dashboard's queries.
Grafana itself is not packaged for Debian: the panels are shown as Prometheus draws their queries.

Run it from the repository's root, with RabbitMQ on 127.0.0.1:5672 (the tasks' broker) and
Debian's ``prometheus``::

    python3 -m tests.support.monitoring_screenshots docs/images

Everything it makes goes with it: the processes, Prometheus' data, the SQLite file, the broker's
queues under its prefix.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import urlencode

from .broker_control import BROKER
from .processes import delete_prefixed, start_celery, stop, wait_for_line
from .prometheus import ROOT, Prometheus
from .proxy import free_port
from .web import browser

APP = "tests.apps.history_app"
#: How long the deployment runs before the screenshot.
RUNNING_S = 180
#: The panels shown, by their titles in monitoring/grafana-dashboard.json.
PANELS = ("Lateness p50 and p99, by job", "Runs sent per minute, by job", "Claims by outcome")


def queries() -> list[str]:
    """The queries of :data:`PANELS`, the job variable at its 'All' value."""
    dashboard = json.loads((ROOT / "monitoring" / "grafana-dashboard.json").read_text())
    panels = {panel["title"]: panel for panel in dashboard["panels"]}
    return [target["expr"].replace("$job", ".*") for title in PANELS for target in panels[title]["targets"]]


def take(out: Path, work: Path, seconds: float = RUNNING_S) -> Path:
    """Run the deployment, take the screenshot into ``out``; the file written."""
    prefix = f"shot-{uuid.uuid4().hex[:8]}."
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        HISTORY_APP_PREFIX=prefix,
        HISTORY_APP_EVERY="1",
        HISTORY_APP_JITTER_MS="300",
        HISTORY_APP_BACKEND=f"sqlite:///{work / 'anarchon.db'}",
    )
    ports = [free_port() for _ in range(3)]
    procs: list[subprocess.Popen[bytes]] = []
    prometheus = None
    try:
        worker_env = dict(env, HISTORY_APP_WORKER_METRICS_PORT=str(ports[2]))
        worker = ["worker", "-P", "solo", "-l", "info", "-Q", f"{prefix}tasks", "-n", f"w-{prefix}@%h"]
        procs.append(start_celery(worker, work / "worker.log", worker_env, app=APP, cwd=ROOT))
        for n in range(2):
            beat = ["beat", "-S", "anarchon_celery.Scheduler", "-l", "info", "--pidfile="]
            beat_env = dict(env, HISTORY_APP_METRICS_PORT=str(ports[n]))
            procs.append(start_celery(beat, work / f"beat-{n}.log", beat_env, app=APP, cwd=ROOT))
        wait_for_line(work / "worker.log", "ready", procs[0], timeout=60)
        prometheus = Prometheus(
            work / "prometheus",
            {"beats": [f"127.0.0.1:{port}" for port in ports[:2]], "workers": [f"127.0.0.1:{ports[2]}"]},
        )
        prometheus.wait_ready()
        time.sleep(seconds)
        params = {}
        for n, expr in enumerate(queries()):
            params.update({f"g{n}.expr": expr, f"g{n}.tab": "0", f"g{n}.range_input": "3m"})
        path = out / "prometheus-dashboard-queries.png"
        with browser() as chromium:
            page = chromium.new_page(viewport={"width": 1360, "height": 2980})  # (all four: the bar stays on top)
            page.goto(f"http://127.0.0.1:{prometheus.port}/graph?{urlencode(params)}")
            time.sleep(5)  # (the queries answered, the graphs drawn)
            page.screenshot(path=str(path))
        return path
    finally:
        if prometheus is not None:
            prometheus.stop()
        for proc in reversed(procs):
            stop(proc)
        delete_prefixed(prefix, BROKER)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="The folder the PNG file is written to (docs/images).")
    parser.add_argument("--seconds", type=float, default=RUNNING_S, help="How long it runs first.")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        path = take(args.out, Path(work), args.seconds)
    print(f"{path} ({path.stat().st_size // 1024} KiB)")


if __name__ == "__main__":
    main()
