"""Runtime jobs at scale, beside django-celery-beat and RedBeat, in the same run.

    python benchmarks/runtime_scale.py [--jobs 10000] [--changes 20] [--only redis,postgres,...]

For each implementation, ``--jobs`` jobs are made at runtime, each a daily cron: the first
``--burst`` of them (``--rabbitmq-burst`` on RabbitMQ, where each run is a queue) due at one minute
a little after the beats start (``--burst-after``), the others at 03:00. Then its beats are
started: three ``celery beat -S anarchon_celery.Scheduler`` for anarchon_celery (its runs decided
in Redis, PostgreSQL or RabbitMQ), one beat for django-celery-beat (its ``DatabaseScheduler``, on
SQLite) and for RedBeat, which must each run once. Measured per beat: the time from its start to
its first tick (its jobs loaded), its memory (RSS) and its CPU while idle. Then the burst: the time
from the slot to the last of its runs in the task queue, and how many were sent more than once.
Then ``--changes`` changes of each kind, one after the other, each at a random moment: a job's
schedule edited, a job added, a job paused; each timed from the change to the moment every beat
says it acted on it (its log line's time: anarchon_celery's "runtime job ... changed" and, on
RabbitMQ, "job ... paused"; django-celery-beat's "Schedule changed"). On Redis and PostgreSQL a pause
is a row or key that each claim reads where it is decided: it is in effect on every beat once the
call returns, and the call's time is what is measured. RedBeat says nothing of a change and has no
pause: a change to it (``--redbeat-changes`` of each) makes the job due at the next minute, and is
timed from that minute to its "Sending due task" line. Needs the ``bench`` extra and
django-celery-beat.
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


def _entry(name: str, at: tuple[int, int] = (3, 0)) -> dict[str, Any]:
    return {"task": "runtime_app.tick", "schedule": f"{at[1]} {at[0]} * * *", "args": [name]}


def _made(n: int, burst: int, slot: dt.datetime) -> tuple[int, int]:
    """The (hour, minute) of job ``n``: the burst's slot for the first ``burst``, else 03:00."""
    return (slot.hour, slot.minute) if n < burst else (3, 0)


def _depth(queue: str) -> int:
    """The messages ready in ``queue`` (0 while it does not exist)."""
    from kombu import Connection

    with Connection(BROKER) as conn:
        try:
            return conn.default_channel.queue_declare(queue=queue, passive=True).message_count
        except Exception:  # noqa: BLE001 - not declared yet: nothing sent
            return 0


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

    def make(self, jobs: int, burst: int, slot: dt.datetime) -> None:
        import anarchon_celery

        if self.kind == "rabbitmq":  # appended to the control log as they come: no read back of each
            backend = self.deployment.backend
            backend.open()
            for n in range(jobs):
                name = f"job-{n:05d}"
                entry = _entry(name, _made(n, burst, slot))
                record = {"op": "put", "job": name, "base": None, "entry": entry, "by": "bench", "at": 0}
                backend._control.append({**record, "id": uuid.uuid4().hex})  # noqa: SLF001 - bulk, for the benchmark
            return
        for n in range(jobs):
            name = f"job-{n:05d}"
            entry = _entry(name, _made(n, burst, slot))
            anarchon_celery.add_job(self.app, name, by="bench", deployment=self.deployment, **entry)

    def edit(self, n: int) -> tuple[float, str]:
        import anarchon_celery

        name = f"job-{n:05d}"
        started = time.time()
        anarchon_celery.update_job(self.app, name, schedule="0 4 * * *", deployment=self.deployment)
        return started, f"runtime job '{name}' changed (version 2"

    def pause(self, n: int) -> tuple[float, str | None]:
        import anarchon_celery

        name = f"job-{n:05d}"
        started = time.time()
        anarchon_celery.pause(self.app, name, note="bench", deployment=self.deployment)
        if self.kind == "rabbitmq":  # each beat follows the control log
            return started, f"job '{name}' paused by"
        return started, None  # read by each claim in the store: in effect once the call returned

    def add(self, n: int) -> tuple[float, str]:
        import anarchon_celery

        name = f"extra-{n:05d}"
        started = time.time()
        anarchon_celery.add_job(self.app, name, deployment=self.deployment, **_entry(name))
        return started, f"runtime job '{name}' added (version 1"

    def fresh(self) -> None:
        """New connections for the changes: those the jobs were made on idled through the beats'
        start and the burst, and a broker drops a connection whose heartbeats stopped."""
        from anarchon_celery.control import configure

        self.deployment.release()
        self.deployment = configure(self.app)

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
jobs, burst, hour, minute = map(int, sys.argv[1:5])
at_slot = CrontabSchedule.objects.create(minute=str(minute), hour=str(hour))
rows = [
    PeriodicTask(
        name=f"job-{n:05d}", task="runtime_app.tick", crontab=at_slot if n < burst else daily, args=f'["job-{n:05d}"]'
    )
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
    elif kind == "pause":
        task = PeriodicTask.objects.get(name=f"job-{int(n):05d}")
        task.enabled = False
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

    def make(self, jobs: int, burst: int, slot: dt.datetime) -> None:
        self.helper = subprocess.Popen(
            [sys.executable, "-c", _DJANGO, str(jobs), str(burst), str(slot.hour), str(slot.minute)],
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

    def pause(self, n: int) -> tuple[float, str]:
        return self._change(f"pause {n}"), "DatabaseScheduler: Schedule changed."

    def clean(self) -> None:
        if self.helper is not None:
            self.helper.kill()
            self.helper.wait()


class RedBeat:
    """RedBeat's entries in Redis; a change makes its job due at once, timed to its sending."""

    instances = 1

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.env = {"RUNTIME_IMPL": "redbeat", "RUNTIME_REDIS": REDIS}
        self.app = Celery("runtime_app", broker=BROKER, set_as_current=False)
        self.app.conf.update(redbeat_redis_url=REDIS, redbeat_key_prefix=prefix)

    def make(self, jobs: int, burst: int, slot: dt.datetime) -> None:
        from celery.schedules import crontab
        from redbeat import RedBeatSchedulerEntry

        for n in range(jobs):
            name = f"job-{n:05d}"
            hour, minute = _made(n, burst, slot)
            entry = RedBeatSchedulerEntry(
                name, "runtime_app.tick", crontab(minute=minute, hour=hour), args=[name], app=self.app
            )
            entry.save()

    def edit(self, n: int) -> tuple[float, str]:
        """Its schedule made daily at the next minute (see :meth:`_next_minute`)."""
        from redbeat import RedBeatSchedulerEntry

        name = f"job-{n:05d}"
        entry = RedBeatSchedulerEntry.from_key(RedBeatSchedulerEntry.generate_key(self.app, name), app=self.app)
        due, entry.schedule = self._next_minute()
        entry.save()
        return due, f"Sending due task {name} "

    def add(self, n: int) -> tuple[float, str]:
        """A job daily at the next minute (see :meth:`_next_minute`)."""
        from redbeat import RedBeatSchedulerEntry

        name = f"extra-{n:05d}"
        due, schedule = self._next_minute()
        RedBeatSchedulerEntry(name, "runtime_app.tick", schedule, args=[name], app=self.app).save()
        return due, f"Sending due task {name} "

    @staticmethod
    def _next_minute() -> tuple[float, Any]:
        """A daily crontab at the next minute (at least 5 s away), and that minute's time: a change
        is timed from it, when RedBeat has the job due. (RedBeat keeps an entry's last run, and
        gives a new one the time it is made: no change can make a job due at once.)"""
        from celery.schedules import crontab

        due = (time.time() + 5) // 60 * 60 + 60
        at = dt.datetime.fromtimestamp(due, dt.timezone.utc)
        return due, crontab(minute=at.minute, hour=at.hour)

    pause = None

    def clean(self) -> None:
        from tests.support.stores import delete_redis_keys

        delete_redis_keys(REDIS, self.prefix)


def measure(impl: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    prefix = f"bench-rt-{impl}-{uuid.uuid4().hex[:6]}."
    burst = min(args.jobs, args.rabbitmq_burst if impl == "rabbitmq" else args.burst)
    slot = dt.datetime.fromtimestamp((time.time() + args.burst_after) // 60 * 60 + 60, dt.timezone.utc)
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
        runner.make(args.jobs, burst, slot)
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
        row.update(_burst(f"{prefix}tasks", burst, slot.timestamp()))
        getattr(runner, "fresh", lambda: None)()
        changes = args.redbeat_changes if impl == "redbeat" else args.changes
        timeout = 420 if impl == "redbeat" else 30  # (RedBeat sleeps up to beat_max_loop_interval, 300 s)
        for kind in ("edit", "add", "pause"):
            change = getattr(runner, kind)
            if change is None:
                continue
            latencies = []
            for n in range(changes):
                time.sleep(random.uniform(0, 1))  # (not in step with the beats' looks)
                offsets = [len(log.read_text(errors="replace")) for log in logs]
                made, needle = change(n)
                if needle is None:  # in effect once the call returned
                    latencies.append(time.time() - made)
                    continue
                acted = _wait_all(logs, needle, offsets, timeout)
                assert acted is not None, f"{impl}: {kind} {n} was not acted on within {timeout} s"
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


def _burst(queue: str, runs: int, slot: float, settle: float = 10) -> dict[str, Any]:
    """The burst of ``runs`` due at ``slot``: the seconds from the slot to the last of them in
    ``queue``, and the messages beyond them once none came for ``settle`` seconds."""
    assert time.time() < slot - 1, "the burst's slot passed before the beats were measured: raise --burst-after"
    time.sleep(slot - time.time())
    depth, last, changed = 0, None, time.monotonic()
    while time.monotonic() - changed < (settle if depth >= runs else 180):
        now = _depth(queue)
        if now != depth:
            depth, changed = now, time.monotonic()
            if depth >= runs and last is None:
                last = time.time() - slot
        time.sleep(0.05)
    return {"burst": runs, "burst_all_sent_s": last, "burst_sent": depth, "burst_extra": max(0, depth - runs)}


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
    parser.add_argument("--burst", type=int, default=10_000, help="jobs due at the burst's slot")
    parser.add_argument("--rabbitmq-burst", type=int, default=2_000, help="the same on RabbitMQ: a queue per run")
    parser.add_argument("--burst-after", type=float, default=150, help="seconds from the start to the burst")
    parser.add_argument("--redbeat-changes", type=int, default=3)
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
    report("runtime_scale", rows, {"jobs": args.jobs, "changes": args.changes, "redbeat_changes": args.redbeat_changes})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
