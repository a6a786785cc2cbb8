"""Do the metrics tell what happened? A soak scraped by a real Prometheus, its sums set against
what a raw consumer counted on the task queue.

    python3 benchmarks/metrics_soak.py                       # RabbitMQ gates, then Redis
    python3 benchmarks/metrics_soak.py --backends redis --duration 300 --kill-every 20

For each backend: ``--instances`` beats of ``soak_app`` (``--jobs`` jobs every ``--period``
seconds), each serving its metrics, scraped by Prometheus (Debian's ``prometheus``) every
``--scrape`` seconds; one beat SIGKILLed and started again every ``--kill-every`` seconds. At the
end every job is paused, and once no task has come for a few seconds and two scrapes have
followed, the runs sent are read from Prometheus' raw samples (each series' increases, its resets
included: a restarted instance's counter starts again at 0, told by its start time) and set
against the consumer's count.

What a killed instance sent after its last scrape is lost to Prometheus, and nothing else is:
the difference must be the runs each killed instance sent after its last scrape (counted by the
consumer from the ``anarchon_instance`` header, against the scrape times Prometheus kept), give or
take a message in flight at a scrape, and the time from a last scrape to the kill is at most about
one scrape interval. Lateness, slot to send, is compared too: the histogram's mean against the
consumer's (slot to arrival, which adds the broker's delivery).
"""

from __future__ import annotations

import argparse
import importlib
import os
import random
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from common import (
    BROKER,
    HERE,
    bench_env,
    delete_prefixed,
    percentile,
    report,
    start_celery,
    started_tally,
    stop,
    wait_for_line,
)

from tests.support.prometheus import Prometheus, available  # noqa: E402 - (common puts the repository on the path)
from tests.support.proxy import free_port  # noqa: E402

BACKENDS = {"rabbitmq": None, "redis": "redis://127.0.0.1:6379/0"}


def _raw_total(prometheus: Prometheus, metric: str, seconds: int) -> float:
    """What a counter counted in the last ``seconds``, summed over its series, from the raw
    samples: each series' increases, and the whole value at a restart of its instance. A restart
    is told by ``anarchon_started_timestamp_seconds``, scraped with the counter: a fall of the
    counter alone would miss a new process whose count is already back where the old one was."""
    starts: dict[tuple[str, float], float] = {}
    for series in prometheus.api("query", query=f"anarchon_started_timestamp_seconds[{seconds}s]")["result"]:
        for at, text in series["values"]:
            starts[(series["metric"]["instance"], float(at))] = float(text)
    total = 0.0
    for series in prometheus.api("query", query=f"{metric}[{seconds}s]")["result"]:
        instance = series["metric"]["instance"]
        previous, started = 0.0, None
        for at, text in series["values"]:
            value, now_started = float(text), starts.get((instance, float(at)))
            restarted = started is not None and now_started is not None and now_started != started
            total += value if restarted or value < previous else value - previous
            previous, started = value, now_started if now_started is not None else started
    return total


def _scrape_times(prometheus: Prometheus, seconds: int) -> dict[str, list[float]]:
    """When each target was scraped, by its address."""
    found: dict[str, list[float]] = {}
    for series in prometheus.api("query", query=f"anarchon_started_timestamp_seconds[{seconds}s]")["result"]:
        found.setdefault(series["metric"]["instance"], []).extend(float(at) for at, _ in series["values"])
    return found


class Beats:
    """The beats, each on a metrics port of its own, killed and started again on the same one."""

    def __init__(self, count: int, env: dict[str, str], tmp: Path) -> None:
        self.env, self.tmp = env, tmp
        self.ports = [free_port() for _ in range(count)]
        self.procs = [self._start(index) for index in range(count)]
        self.kills: list[tuple[float, int, str]] = []  # (when, pid, its target)

    def _start(self, index: int) -> Any:
        log = self.tmp / f"beat-{index}.log"
        args = ["beat", "-l", "info", "--pidfile=", "-s", str(self.tmp / f"schedule-{index}")]
        env = dict(self.env, SOAK_METRICS_PORT=str(self.ports[index]))
        return start_celery(args, log, env, app="soak_app", cwd=HERE)

    def wait_ready(self) -> None:
        for index, proc in enumerate(self.procs):
            wait_for_line(self.tmp / f"beat-{index}.log", "anarchon: ready as", proc, 60)

    def kill_one(self) -> None:
        index = random.randrange(len(self.procs))
        proc = self.procs[index]
        os.killpg(proc.pid, signal.SIGKILL)
        self.kills.append((time.time(), proc.pid, f"127.0.0.1:{self.ports[index]}"))
        proc.wait()
        self.procs[index] = self._start(index)

    def stop(self) -> None:
        for proc in self.procs:
            stop(proc)


def _pause_all(env: dict[str, str], jobs: int) -> None:
    """Pause every job of the soak app, through the package's API, in this process."""
    os.environ.update({k: v for k, v in env.items() if k.startswith("SOAK_")})
    import soak_app

    import anarchon_celery

    soak_app = importlib.reload(soak_app)  # this line's prefix and backend (read at import)

    for n in range(jobs):
        anarchon_celery.pause(soak_app.app, f"job-{n:02d}", note="end of the metrics soak")


def _quiet(tally: Any, seconds: float, timeout: float = 60) -> None:
    """Until no task has come for ``seconds``; RuntimeError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        last = tally.arrivals[-1]["at_ms"] / 1000 if tally.arrivals else 0
        if time.time() - last >= seconds:
            return
        time.sleep(0.5)
    raise RuntimeError(f"tasks still came {timeout}s after every job was paused")


def soak(backend: str, args: argparse.Namespace) -> dict[str, Any]:
    prefix = f"msoak-{uuid.uuid4().hex[:6]}."
    env = bench_env(
        SOAK_PREFIX=prefix,
        SOAK_JOBS=str(args.jobs),
        SOAK_PERIOD=str(args.period),
        SOAK_IMPL="anarchon",
        SOAK_BROKER=BROKER,
        **({"SOAK_BACKEND": BACKENDS[backend]} if BACKENDS[backend] else {}),
    )
    tmp = Path(tempfile.mkdtemp(prefix="metrics-soak-"))
    tally = started_tally(f"{prefix}tasks")
    beats = Beats(args.instances, env, tmp)
    prometheus = Prometheus(tmp / "prometheus", {"beats": [f"127.0.0.1:{port}" for port in beats.ports]}, args.scrape)
    started = time.time()
    try:
        beats.wait_ready()
        prometheus.wait_ready()
        until = time.monotonic() + args.duration
        while time.monotonic() + args.kill_every < until:
            time.sleep(args.kill_every)
            beats.kill_one()
        time.sleep(max(0.0, until - time.monotonic()))
        _pause_all(env, args.jobs)
        _quiet(tally, 3 * args.period)
        time.sleep(2 * args.scrape + 1)
        window = int(time.time() - started) + 60
        counted = _raw_total(prometheus, "anarchon_runs_sent_total", window)
        timed = _raw_total(prometheus, "anarchon_lateness_seconds_count", window)
        late_sum = _raw_total(prometheus, "anarchon_lateness_seconds_sum", window)
        scraped = _scrape_times(prometheus, window)
    finally:
        beats.stop()
        prometheus.stop()
        tally.stop()
        delete_prefixed(prefix, BROKER)
    runs = [a for a in tally.arrivals if a["slot"] is not None]
    # What each killed instance sent after its last scrape: what Prometheus cannot have.
    lost, gaps = 0, []
    for killed_at, pid, target in beats.kills:
        last = max(at for at in scraped[target] if at < killed_at)
        gaps.append(killed_at - last)
        lost += sum(1 for a in runs if (a["instance"] or "").endswith(f":{pid}") and a["at_ms"] / 1000 > last)
    arrival_lateness = [(a["at_ms"] - a["slot"]) / 1000 for a in runs]
    return {
        "backend": backend,
        "instances": args.instances,
        "kills": len(beats.kills),
        "sent (consumer)": len(runs),
        "sent (prometheus)": int(counted),
        "missing": len(runs) - int(counted),
        "sent after a last scrape": lost,
        "longest from a last scrape to a kill (s)": round(max(gaps, default=0.0), 2),
        "within": abs(len(runs) - int(counted) - lost) <= len(beats.kills),
        "timed": int(timed),
        "lateness mean, metrics (ms)": round(late_sum / timed * 1000, 1) if timed else None,
        "lateness mean, consumer (ms)": round(sum(arrival_lateness) / len(runs) * 1000, 1) if runs else None,
        "consumer p99 (ms)": round(percentile(arrival_lateness, 99) * 1000, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="rabbitmq,redis", help="rabbitmq, redis (comma-separated)")
    parser.add_argument("--instances", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--period", type=float, default=1.0, help="seconds between two runs of a job")
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of each soak")
    parser.add_argument("--kill-every", type=float, default=15.0, help="seconds between two kills")
    parser.add_argument("--scrape", type=int, default=1, help="Prometheus' scrape interval, seconds")
    args = parser.parse_args(argv)
    if not available():
        print("needs Debian's prometheus (apt-get install prometheus)", file=sys.stderr)
        return 2
    rows = [soak(backend, args) for backend in args.backends.split(",")]
    report("metrics_soak", rows, {"all within": all(row["within"] for row in rows)})
    return 0 if all(row["within"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
