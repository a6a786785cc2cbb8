"""Overlap protection under faults: workers killed, messages delivered again, a backlog, tasks that
outlive a lock; anarchon_celery's ``overlap="skip"`` beside celery-once and celery-singleton.

    python benchmarks/overlap_soak.py                        # every implementation, 180 s each
    python benchmarks/overlap_soak.py --impls anarchon-sqlite,once --seconds 60

Each line runs overlap_app (``--jobs`` jobs, 4, each every second; most runs take 0.3 to 2.5 s, one
in 15 takes 14 s) with two workers of three processes each (``acks_late``, prefetch 1) for
``--seconds``, while:

- every ``--kill-every`` seconds (25) one worker is killed whole (SIGKILL) and another started
  2 s later: its tasks' messages are delivered again to the other worker;
- at a third of the run every worker is stopped for ``--backlog-s`` seconds (15): runs wait in the
  queue, then the workers come back together.

anarchon_celery runs two beats on one store (``anarchon-sqlite``, ``-redis``, ``-postgres``); the
peers run one plain celery beat (they are not highly available), with their Redis lock expiring
after 10 s (``--lock-s``), as anarchon_celery's worker lease does (``anarchon_overlap_lease_ms``,
renewed every third of it). ``plain`` protects nothing: the baseline.

Counted, from each execution's own start and end lines (an execution whose worker was killed ends
when it was killed): executions; overlapping ones (an execution that started while another of its
job was still running), the figure to beat being 0; and the longest time a job had no execution
running and none started although one was due (its lock or hold left behind by a killed worker),
outside the backlog.

Needs: RabbitMQ (the tasks), Redis on BENCH_REDIS (db 6; the peers' locks, the Redis store),
PostgreSQL on BENCH_POSTGRES; and ``pip install -e '.[bench]'`` (celery-once, celery-singleton).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from burst import POSTGRES, REDIS, delete_store_state
from common import BROKER, bench_env, delete_prefixed, report, start_celery, stop, wait_for_line

IMPLS = ("anarchon-sqlite", "anarchon-redis", "anarchon-postgres", "once", "singleton", "plain")


class Fleet:
    """The beats and workers of one line, each with its own log in ``folder``."""

    def __init__(self, env: dict[str, str], folder: Path, unique: str) -> None:
        self.env, self.folder, self.unique = env, folder, unique
        self.procs: dict[str, Any] = {}
        self.killed: dict[int, float] = {}  # pool process pid -> when its worker was killed
        self.kills = 0
        self._count = 0

    def start(self, name: str, args: list[str]) -> Any:
        log = self.folder / f"{name}.log"
        self.procs[name] = start_celery(args, log, self.env, app="overlap_app", cwd=self.folder)
        return self.procs[name]

    def worker(self) -> str:
        self._count += 1
        name = f"w{self._count}"
        self.start(name, ["worker", "-l", "info", "-c", "3", "-n", f"{name}-{self.unique}@%h", "--without-heartbeat"])
        return name

    def wait_worker(self, name: str) -> None:
        wait_for_line(self.folder / f"{name}.log", "ready", self.procs[name], 60)

    def kill(self, name: str) -> None:
        """SIGKILL a worker whole, noting when for each of its processes."""
        proc = self.procs.pop(name)
        self.kills += 1
        children = _children(proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        at = time.time()
        for pid in [proc.pid, *children]:
            self.killed[pid] = at

    def workers(self) -> list[str]:
        return [name for name in self.procs if name.startswith("w")]

    def close(self) -> None:
        for proc in self.procs.values():
            stop(proc, timeout=15)


def _children(pid: int) -> list[int]:
    """The pids of a process's children (its pool processes)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def executions(log: Path, killed: dict[int, float], end: float) -> dict[str, list[tuple[float, float]]]:
    """Each job's executions (start, end), from the task's lines."""
    starts: dict[tuple[str, str, int], float] = {}
    ends: dict[tuple[str, str, int], float] = {}
    for line in log.read_text().splitlines() if log.exists() else []:
        record = json.loads(line)
        key = (record["job"], record["id"], record["pid"])
        (starts if record["event"] == "start" else ends)[key] = record["t"]
    found: dict[str, list[tuple[float, float]]] = {}
    for key, start in starts.items():
        found.setdefault(key[0], []).append((start, ends.get(key, killed.get(key[2], end))))
    return {job: sorted(runs) for job, runs in found.items()}


def overlapping(runs: list[tuple[float, float]]) -> int:
    """Executions that started while an earlier one of the same job was still running."""
    count, running_until = 0, float("-inf")
    for start, end in runs:
        if start < running_until - 0.001:
            count += 1
        running_until = max(running_until, end)
    return count


def longest_wedge(runs: list[tuple[float, float]], period: float, outside: tuple[float, float]) -> float:
    """The longest time the job had nothing running and started nothing though a run was due (a
    run every ``period``), outside the backlog window ``outside``."""
    longest, running_until = 0.0, None
    for start, end in runs:
        if running_until is not None and start > running_until:
            gap_from, gap_to = running_until, start
            if not (gap_from < outside[1] and gap_to > outside[0]):
                longest = max(longest, gap_to - gap_from - period)
        running_until = end if running_until is None else max(running_until, end)
    return max(0.0, longest)


def run_line(impl: str, args: argparse.Namespace) -> dict[str, Any]:
    unique = uuid.uuid4().hex[:6]
    prefix = f"bench-overlap-{unique}."
    folder = Path(tempfile.mkdtemp(prefix="anarchon-overlap-"))
    log = folder / "executions.jsonl"
    store = impl.split("-", 1)[1] if impl.startswith("anarchon-") else None
    backend = {"sqlite": f"sqlite:///{folder / 'anarchon.db'}", "redis": REDIS, "postgres": POSTGRES}.get(store or "")
    env = bench_env(
        OV_PREFIX=prefix,
        OV_IMPL=impl.split("-", 1)[0],
        OV_JOBS=str(args.jobs),
        OV_LOG=str(log),
        OV_REDIS=REDIS,
        OV_LOCK_S=str(args.lock_s),
        OV_LEASE_MS=str(args.lock_s * 1000),
        **({"OV_BACKEND": backend} if backend else {}),
    )
    fleet = Fleet(env, folder, unique)
    begun = time.time()
    backlog = (begun + args.seconds / 3, begun + args.seconds / 3 + args.backlog_s)
    try:
        for name in (fleet.worker(), fleet.worker()):
            fleet.wait_worker(name)
        beats = 2 if impl.startswith("anarchon") else 1
        for n in range(beats):
            scheduler = (
                ["-S", "anarchon_celery.Scheduler"]
                if impl.startswith("anarchon")
                else ["-s", str(folder / f"schedule-{n}")]
            )
            fleet.start(f"beat-{n}", ["beat", "-l", "info", "--pidfile=", *scheduler])
        begun = time.time()
        backlog = (begun + args.seconds / 3, begun + args.seconds / 3 + args.backlog_s)
        next_kill = begun + args.kill_every
        backlog_done = False
        while time.time() < begun + args.seconds:
            now = time.time()
            if not backlog_done and now >= backlog[0]:
                for name in fleet.workers():
                    fleet.kill(name)
                time.sleep(args.backlog_s)
                for name in (fleet.worker(), fleet.worker()):
                    fleet.wait_worker(name)
                backlog_done = True
                next_kill = time.time() + args.kill_every
            elif now >= next_kill:
                victim = fleet.workers()[0]
                fleet.kill(victim)
                time.sleep(2)
                fleet.wait_worker(fleet.worker())
                next_kill = time.time() + args.kill_every
            time.sleep(0.2)
        ended = time.time()
    finally:
        fleet.close()
        delete_prefixed(prefix, BROKER)
        delete_store_state(store or "", prefix)
        _delete_locks(prefix)
    found = executions(log, fleet.killed, ended)
    row = {
        "impl": impl,
        "executions": sum(len(runs) for runs in found.values()),
        "overlapping": sum(overlapping(runs) for runs in found.values()),
        "longest wedge s": max((longest_wedge(runs, 1.0, backlog) for runs in found.values()), default=0.0),
        "workers killed": fleet.kills,
    }
    if not args.keep_logs:
        shutil.rmtree(folder, ignore_errors=True)
    else:
        row["logs"] = str(folder)
    return row


def _delete_locks(prefix: str) -> None:
    """The peers' lock keys (celery-once's ``qo_*``, celery-singleton's under the prefix)."""
    import redis

    client = redis.Redis.from_url(REDIS)
    for pattern in ("qo_overlap_app.work*", f"{prefix}singleton:*"):
        keys = list(client.scan_iter(match=pattern, count=1000))
        if keys:
            client.delete(*keys)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impls", default=",".join(IMPLS))
    parser.add_argument("--seconds", type=float, default=180)
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--kill-every", type=float, default=25)
    parser.add_argument("--backlog-s", type=float, default=15)
    parser.add_argument("--lock-s", type=int, default=10)
    parser.add_argument("--keep-logs", action="store_true")
    args = parser.parse_args(argv)
    rows = [run_line(impl, args) for impl in args.impls.split(",")]
    ours = [row for row in rows if row["impl"].startswith("anarchon")]
    summary = {
        "anarchon overlapping": sum(row["overlapping"] for row in ours),
        "anarchon executions": sum(row["executions"] for row in ours),
    }
    report("overlap_soak", rows, summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
