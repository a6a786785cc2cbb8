"""Runtime jobs at scale, beside django-celery-beat and RedBeat, in the same run.

    python benchmarks/runtime_scale.py [--jobs 10000] [--changes 20] [--only redis,postgres,...]

For each implementation, ``--jobs`` jobs are made at runtime (a daily cron each, so that none runs
during the measure), then its beats are started: three ``celery beat -S anarchon_celery.Scheduler``
for anarchon_celery (its runs decided in Redis, PostgreSQL or RabbitMQ), one beat for
django-celery-beat (its ``DatabaseScheduler``, on SQLite) and for RedBeat, which must each run once.
Measured per beat: the time from its start to its first tick (its jobs loaded), its memory (RSS)
and its CPU while idle; then ``--changes`` changes are made one after the other (a job's schedule
edited, and jobs added), each timed from the change to the moment every beat says it acted on it
(its log line's time: anarchon_celery's "runtime job ... changed", django-celery-beat's "Schedule
changed"), each made at a random moment. RedBeat reads its entries at each tick and says nothing of
a change: its latency is not measured. Needs the ``bench`` extra and django-celery-beat.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from celery import Celery
from common import BROKER, HERE, bench_env, delete_prefixed, percentile, remove_dir, report, start_celery, stop
from idle import cpu_seconds

REDIS = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/7")
POSTGRES = os.environ.get("BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
IMPLS = ("redis", "postgres", "rabbitmq", "django", "redbeat")
_LOG_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): ")


def _app(prefix: str, backend: str) -> Celery:
    """An app as the beats' (runtime_app), in this process: for the changes made through the API."""
    app = Celery("runtime_app", broker=BROKER, set_as_current=False)
    app.conf.update(task_default_queue=f"{prefix}tasks", anarchon_prefix=prefix, anarchon_backend=backend)

    @app.task(name="runtime_app.tick", shared=False)
    def tick(name: str) -> None: ...

    return app


def _entry(name: str, hour: int = 3) -> dict[str, Any]:
    return {"task": "runtime_app.tick", "schedule": f"0 {hour} * * *", "args": [name]}


def _times(log: Path, needle: str, after: int = 0) -> list[float]:
    """The epoch times of the log lines past ``after`` that hold ``needle``."""
    found = []
    for line in log.read_text(errors="replace")[after:].splitlines():
        match = _LOG_TIME.match(line)
        if match and needle in line:
            when = dt.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f")
            found.append(when.replace(tzinfo=dt.datetime.now().astimezone().tzinfo).timestamp())
    return found


def _wait_all(logs: list[Path], needle: str, offsets: list[int], timeout: float = 30) -> list[float] | None:
    """The time each beat logged ``needle`` (past its offset), once all have; None on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = [_times(log, needle, offset) for log, offset in zip(logs, offsets)]
        if all(seen):
            return [times[0] for times in seen]
        time.sleep(0.02)
    return None


class Anarchon:
    """Runtime jobs of anarchon_celery, its runs decided at ``url``."""

    instances = 3

    def __init__(self, kind: str, url: str, prefix: str) -> None:
        from anarchon_celery.control import configure

        self.kind, self.prefix = kind, prefix
        self.app = _app(prefix, url)
        if kind == "rabbitmq":
            self.app.conf.anarchon_history_size = 0
        self.deployment = configure(self.app)
        # On RabbitMQ without history: a stream per job is a queue's files per job, more than a
        # broker holds open by default (see docs/operations.md, file limits).
        history = "0" if kind == "rabbitmq" else "10"
        self.env = {"RUNTIME_IMPL": "anarchon", "RUNTIME_BACKEND": url, "RUNTIME_HISTORY_SIZE": history}

    def make(self, jobs: int) -> None:
        import anarchon_celery

        if self.kind == "rabbitmq":  # appended to the control log as they come: no read back of each
            backend = self.deployment.backend
            backend.open()
            for n in range(jobs):
                name = f"job-{n:05d}"
                record = {"op": "put", "job": name, "base": None, "entry": _entry(name), "by": "bench", "at": 0}
                backend._control.append({**record, "id": uuid.uuid4().hex})  # noqa: SLF001 - bulk, for the benchmark
            return
        for n in range(jobs):
            name = f"job-{n:05d}"
            anarchon_celery.add_job(self.app, name, by="bench", deployment=self.deployment, **_entry(name))

    def edit(self, n: int) -> tuple[float, str]:
        import anarchon_celery

        name = f"job-{n:05d}"
        started = time.time()
        anarchon_celery.update_job(self.app, name, schedule="0 4 * * *", deployment=self.deployment)
        return started, f"runtime job '{name}' changed (version 2"

    def add(self, n: int) -> tuple[float, str]:
        import anarchon_celery

        name = f"extra-{n:05d}"
        started = time.time()
        anarchon_celery.add_job(self.app, name, deployment=self.deployment, **_entry(name))
        return started, f"runtime job '{name}' added (version 1"

    def clean(self) -> None:
        self.deployment.release()
        if self.kind == "redis":
            from tests.support.stores import delete_redis_keys

            delete_redis_keys(REDIS, self.prefix)
        elif self.kind == "postgres":
            from tests.support.stores import delete_postgres_rows

            delete_postgres_rows(POSTGRES, self.prefix)


_DJANGO = """
import os, sys, time
sys.path.insert(0, os.environ["BENCH_DIR"])
os.environ["DJANGO_SETTINGS_MODULE"] = "runtime_django_settings"
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from django_celery_beat.models import CrontabSchedule, PeriodicTask, PeriodicTasks
daily = CrontabSchedule.objects.create(minute="0", hour="3")
other = CrontabSchedule.objects.create(minute="0", hour="4")
jobs = int(sys.argv[1])
rows = [
    PeriodicTask(name=f"job-{n:05d}", task="runtime_app.tick", crontab=daily, args=f'["job-{n:05d}"]')
    for n in range(jobs)
]
PeriodicTask.objects.bulk_create(rows, batch_size=1000)
PeriodicTasks.update_changed()
print("made", flush=True)
for line in sys.stdin:  # a change per line, told when made
    kind, n = line.split()
    if kind == "edit":
        task = PeriodicTask.objects.get(name=f"job-{int(n):05d}")
        task.crontab = other
        started = time.time()
        task.save()
    else:
        started = time.time()
        PeriodicTask.objects.create(name=f"extra-{int(n):05d}", task="runtime_app.tick", crontab=daily)
    print(started, flush=True)
"""


class DjangoCeleryBeat:
    """django-celery-beat's rows and DatabaseScheduler, on SQLite; changes made with its models."""

    instances = 1

    def __init__(self, tmp: Path) -> None:
        database = tmp / "django.sqlite3"
        self.env = {"RUNTIME_IMPL": "django", "RUNTIME_DJANGO_DB": str(database)}
        self.helper: subprocess.Popen[str] | None = None
        self._env = dict(bench_env(**self.env), BENCH_DIR=str(HERE))

    def make(self, jobs: int) -> None:
        self.helper = subprocess.Popen(
            [sys.executable, "-c", _DJANGO, str(jobs)],
            env=self._env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.helper.stdout is not None
        assert self.helper.stdout.readline().strip() == "made"

    def _change(self, line: str) -> float:
        assert self.helper is not None and self.helper.stdin is not None and self.helper.stdout is not None
        self.helper.stdin.write(line + "\n")
        self.helper.stdin.flush()
        return float(self.helper.stdout.readline())

    def edit(self, n: int) -> tuple[float, str]:
        return self._change(f"edit {n}"), "DatabaseScheduler: Schedule changed."

    def add(self, n: int) -> tuple[float, str]:
        return self._change(f"add {n}"), "DatabaseScheduler: Schedule changed."

    def clean(self) -> None:
        if self.helper is not None:
            self.helper.kill()
            self.helper.wait()


class RedBeat:
    """RedBeat's entries in Redis; its latency is not measured (see the module)."""

    instances = 1

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.env = {"RUNTIME_IMPL": "redbeat", "RUNTIME_REDIS": REDIS}
        self.app = Celery("runtime_app", broker=BROKER, set_as_current=False)
        self.app.conf.update(redbeat_redis_url=REDIS, redbeat_key_prefix=prefix)

    def make(self, jobs: int) -> None:
        from celery.schedules import crontab
        from redbeat import RedBeatSchedulerEntry

        for n in range(jobs):
            name = f"job-{n:05d}"
            RedBeatSchedulerEntry(name, "runtime_app.tick", crontab(minute=0, hour=3), args=[name], app=self.app).save()

    edit = add = None

    def clean(self) -> None:
        from tests.support.stores import delete_redis_keys

        delete_redis_keys(REDIS, self.prefix)


def measure(impl: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    prefix = f"bench-rt-{impl}-{uuid.uuid4().hex[:6]}."
    runner: Any
    if impl == "django":
        runner = DjangoCeleryBeat(tmp)
    elif impl == "redbeat":
        runner = RedBeat(prefix)
    else:
        url = {"redis": REDIS, "postgres": POSTGRES, "rabbitmq": BROKER}[impl]
        runner = Anarchon(impl, url, prefix)
    row: dict[str, Any] = {"impl": impl, "jobs": args.jobs, "beats": runner.instances}
    procs: list[tuple[Any, Path]] = []
    try:
        started = time.monotonic()
        runner.make(args.jobs)
        row["made_s"] = time.monotonic() - started
        env = bench_env(RUNTIME_PREFIX=prefix, **runner.env)
        spawned = time.time()
        for n in range(runner.instances):
            log = tmp / f"{impl}-{n}.log"
            beat = ["beat", "-l", "debug", "--pidfile=", "-s", str(tmp / f"schedule-{impl}-{n}")]
            procs.append((start_celery(beat, log, env, app="runtime_app", cwd=HERE), log))
        logs = [log for _, log in procs]
        ready = _wait_all(logs, "beat: Ticking with max interval", [0] * len(logs), timeout=600)
        assert ready is not None, f"{impl}: a beat did not start"
        row["start_s"] = max(ready) - spawned
        time.sleep(5)
        row["rss_mib"] = max(_rss_kib(proc.pid) for proc, _ in procs) / 1024
        before = [cpu_seconds(proc.pid) for proc, _ in procs]
        time.sleep(args.idle)
        row["idle_cpu_pct"] = max(cpu_seconds(proc.pid) - b for (proc, _), b in zip(procs, before)) / args.idle * 100
        if runner.edit is not None:
            for kind, change in (("edit", runner.edit), ("add", runner.add)):
                latencies = []
                for n in range(args.changes):
                    time.sleep(random.uniform(0, 1))  # (not in step with the beats' looks)
                    offsets = [len(log.read_text(errors="replace")) for log in logs]
                    made, needle = change(n)
                    acted = _wait_all(logs, needle, offsets)
                    assert acted is not None, f"{impl}: {kind} {n} was not acted on within 30 s"
                    latencies += [max(0.0, when - made) for when in acted]
                row[f"{kind}_p50_ms"] = percentile(latencies, 50) * 1000
                row[f"{kind}_p99_ms"] = percentile(latencies, 99) * 1000
                row[f"{kind}_max_ms"] = max(latencies) * 1000
    finally:
        for proc, _ in procs:
            stop(proc)
        runner.clean()
        delete_prefixed(prefix, BROKER)
    return row


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--changes", type=int, default=20)
    parser.add_argument("--idle", type=float, default=30)
    parser.add_argument("--only", default=",".join(IMPLS))
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE.parent))  # tests.support, for the clean-up of the stores
    rows = []
    for impl in args.only.split(","):
        tmp = Path(tempfile.mkdtemp(prefix=f"anarchon-runtime-{impl}-"))
        try:
            rows.append(measure(impl, args, tmp))
        finally:
            remove_dir(tmp)
        print(rows[-1], flush=True)
    report("runtime_scale", rows, {"jobs": args.jobs, "changes": args.changes})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
