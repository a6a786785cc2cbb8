"""Catch-up: every beat stopped for a minute, then started together; the runs each policy sends.

    python benchmarks/catch_up.py                      # SQLite, Redis, PostgreSQL; latest and all
    python benchmarks/catch_up.py --stores sqlite --policies latest --gap-s 20

Each line runs ``--instances`` beats (3) of soak_app: ``--jobs`` jobs (20) every 2 s, lateness 1 s,
jitter 0.3 s, with ``anarchon_catch_up`` set to the line's policy, on one store (the tasks on
RabbitMQ, counted by a raw consumer as they arrive). The phases:

1. the beats run ``--warm-s`` seconds (10), then are all stopped (SIGTERM);
2. ``--gap-s`` seconds (60) later they are started again together, with two changes: a job the
   store has never seen (``fresh``), and ``job-00`` on another schedule (every 4 s). They run
   ``--run-s`` seconds (15), then are stopped;
3. they are started again at once (a restart shorter than the lateness of the job ``patient``,
   30 s), run ``--run-s`` seconds, and are stopped.

Counted: runs sent twice (``dup``); for each of the 19 unchanged jobs, whether phase 2 sent exactly
what the policy says for the runs of the gap (the slots between the last run of phase 1 and the
first run of phase 2 sent as scheduled): ``latest``, one run of catch-up for the newest of them,
standing for all of them; ``all``, one per slot. Then the catch-up runs of ``fresh`` and
``job-00`` in phase 2 and of ``patient`` in phase 3 (each should be 0), and the time from the first
instance ready in phase 2 to the first caught-up run's arrival.

Plain celery beat (one instance, its schedule file kept) is measured beside it in the same run, on
phases 1 and 2: the runs it sends in the first second after it starts again, per job (it sends
each overdue entry once: its only policy).

Needs: RabbitMQ (the tasks), Redis on BENCH_REDIS (db 6) and PostgreSQL on BENCH_POSTGRES.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import statistics
import subprocess
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from burst import POSTGRES, REDIS, delete_store_state
from common import (
    BROKER,
    HERE,
    Tally,
    bench_env,
    delete_prefixed,
    remove_dir,
    report,
    start_celery,
    stop,
    wait_for_line,
)

PERIOD_MS = 2_000
_READY = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): INFO/MainProcess\] anarchon: ready as", re.M)


def _ready_ms(log: Path) -> int:
    """When the beat of ``log`` said it was ready (its log's own time stamp, local time)."""
    found = _READY.search(log.read_text(errors="replace"))
    assert found, log
    stamp = dt.datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f").astimezone()
    return int(stamp.timestamp() * 1000)


class Beats:
    """The phase's beats, started together."""

    def __init__(self, env: dict[str, str], folder: Path, phase: str, count: int) -> None:
        self.logs = [folder / f"{phase}-{n}.log" for n in range(count)]
        args = ["beat", "-l", "info", "--pidfile="]
        self.procs: list[subprocess.Popen[bytes]] = []
        for n, log in enumerate(self.logs):
            plain = env.get("SOAK_IMPL") == "beat"  # plain celery beat, its schedule file kept
            extra = ["-s", str(folder / f"schedule-{n}")] if plain else []
            self.procs.append(start_celery(args + extra, log, env, app="soak_app", cwd=HERE))

    def wait_ready(self, line: str = "anarchon: ready as") -> None:
        for proc, log in zip(self.procs, self.logs):
            wait_for_line(log, line, proc, 120)

    def first_ready_ms(self) -> int:
        return min(_ready_ms(log) for log in self.logs)

    def stop(self) -> None:
        for proc in self.procs:
            stop(proc)


def _env(prefix: str, store: str, policy: str, args: argparse.Namespace, **extra: str) -> dict[str, str]:
    return bench_env(
        SOAK_PREFIX=prefix,
        SOAK_JOBS=str(args.jobs),
        SOAK_PERIOD=str(PERIOD_MS / 1000),
        SOAK_BACKEND=store,
        SOAK_MAX_LATE_MS="1000",
        SOAK_JITTER_MS="300",
        SOAK_CATCH_UP=policy,
        SOAK_HISTORY_SIZE="0",
        **extra,
    )


def run_line(kind: str, policy: str, args: argparse.Namespace) -> dict[str, Any]:
    prefix = f"bench-catchup-{kind}-{uuid.uuid4().hex[:6]}."
    folder = Path(tempfile.mkdtemp(prefix="anarchon-catchup-"))
    store = {"sqlite": f"sqlite:///{folder / 'anarchon.db'}", "redis": REDIS, "postgres": POSTGRES}[kind]
    tally = Tally(f"{prefix}tasks")
    tally.start()
    tally.ready.wait(30)
    marks: dict[str, int] = {}
    try:
        first = Beats(_env(prefix, store, policy, args), folder, "first", args.instances)
        first.wait_ready()
        time.sleep(args.warm_s)
        first.stop()
        marks["stopped"] = int(time.time() * 1000)
        time.sleep(args.gap_s)
        changed = _env(prefix, store, policy, args, SOAK_FRESH="1", SOAK_CHANGED="1")
        marks["second"] = int(time.time() * 1000)
        second = Beats(changed, folder, "second", args.instances)
        second.wait_ready()
        marks["ready"] = second.first_ready_ms()
        time.sleep(args.run_s)
        second.stop()
        marks["third"] = int(time.time() * 1000)
        third = Beats(changed, folder, "third", args.instances)
        third.wait_ready()
        time.sleep(args.run_s)
        third.stop()
        time.sleep(2)  # the last messages in
    finally:
        tally.stop()
        delete_prefixed(prefix, BROKER)
        delete_store_state(kind, prefix)
    row = judge(tally.arrivals, marks, policy, args)
    if not args.keep_logs:
        remove_dir(folder)
    return {"store": kind, "policy": policy, **row}


def judge(
    arrivals: list[dict[str, Any]], marks: dict[str, int], policy: str, args: argparse.Namespace
) -> dict[str, Any]:
    """What each phase sent, against what the policy says (see the module's text)."""
    sent = Counter((a["job"], a["slot"]) for a in arrivals)
    second = [a for a in arrivals if marks["second"] <= a["at_ms"] < marks["third"]]
    third = [a for a in arrivals if a["at_ms"] >= marks["third"]]
    exact, gap_sizes = 0, []
    for n in range(1, args.jobs):
        job = f"job-{n:02d}"
        before = [a["slot"] for a in arrivals if a["job"] == job and a["at_ms"] < marks["second"]]
        regular = sorted(a["slot"] for a in second if a["job"] == job and a["trigger"] == "schedule")
        caught = sorted((a["slot"], a["coalesced"]) for a in second if a["job"] == job and a["trigger"] == "catch_up")
        if not before or not regular:
            continue
        gap = list(range(max(before) + PERIOD_MS, regular[0], PERIOD_MS))
        gap_sizes.append(len(gap))
        if policy == "latest":
            exact += caught == [(gap[-1], len(gap))] if gap else caught == []
        else:
            exact += caught == [(slot, 1) for slot in gap]
    caught_up = [a for a in second if a["trigger"] == "catch_up"]
    first_caught = min((a["at_ms"] for a in caught_up), default=None)
    return {
        "sent": len(arrivals),
        "dup": sum(n - 1 for n in sent.values() if n > 1),
        "jobs exact": f"{exact}/{args.jobs - 1}",
        "gap runs": statistics.median(gap_sizes) if gap_sizes else 0,
        "caught-up runs": len(caught_up),
        "fresh caught": sum(a["job"] == "fresh" for a in caught_up),
        "changed caught": sum(a["job"] == "job-00" for a in caught_up),
        "patient caught (restart)": sum(a["job"] == "patient" and a["trigger"] == "catch_up" for a in third),
        "first caught ms after ready": None if first_caught is None else first_caught - marks["ready"],
    }


def plain_beat(args: argparse.Namespace) -> dict[str, Any]:
    """Plain celery beat x1, its schedule file kept over the stop: what it sends at start."""
    prefix = f"bench-catchup-beat-{uuid.uuid4().hex[:6]}."
    folder = Path(tempfile.mkdtemp(prefix="anarchon-catchup-"))
    env = bench_env(SOAK_PREFIX=prefix, SOAK_JOBS=str(args.jobs), SOAK_PERIOD=str(PERIOD_MS / 1000), SOAK_IMPL="beat")
    tally = Tally(f"{prefix}tasks")
    tally.start()
    tally.ready.wait(30)
    try:
        first = Beats(env, folder, "first", 1)
        first.wait_ready("beat: Starting...")
        time.sleep(args.warm_s)
        first.stop()
        time.sleep(args.gap_s)
        second = Beats(env, folder, "second", 1)
        second.wait_ready("beat: Starting...")
        started = int(time.time() * 1000)
        time.sleep(args.run_s)
        second.stop()
        time.sleep(2)
    finally:
        tally.stop()
        delete_prefixed(prefix, BROKER)
    sent = Counter(a["job"] for a in tally.arrivals if started - 1_000 <= a["at_ms"] < started + 1_000)
    if not args.keep_logs:
        remove_dir(folder)
    return {
        "store": "plain celery beat x1",
        "policy": "(its own)",
        "sent": len(tally.arrivals),
        "dup": "n/a",
        "runs per job at start": statistics.median([sent.get(f"job-{n:02d}", 0) for n in range(args.jobs)]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stores", default="sqlite,redis,postgres")
    parser.add_argument("--policies", default="latest,all")
    parser.add_argument("--instances", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--warm-s", type=float, default=10)
    parser.add_argument("--gap-s", type=float, default=60)
    parser.add_argument("--run-s", type=float, default=15)
    parser.add_argument("--no-beat", action="store_true", help="leave plain celery beat out")
    parser.add_argument("--keep-logs", action="store_true")
    args = parser.parse_args(argv)
    os.environ.setdefault("SOAK_BROKER", BROKER)
    rows = [run_line(kind, policy, args) for kind in args.stores.split(",") for policy in args.policies.split(",")]
    if not args.no_beat:
        rows.append(plain_beat(args))
    ours = [row for row in rows if row["policy"] in ("latest", "all")]
    summary = {
        "duplicates": sum(row["dup"] for row in ours),
        "surprise runs (fresh, changed, patient)": sum(
            row["fresh caught"] + row["changed caught"] + row["patient caught (restart)"] for row in ours
        ),
        "lines with every job exact": sum(row["jobs exact"] == f"{args.jobs - 1}/{args.jobs - 1}" for row in ours),
        "lines": len(ours),
    }
    report("catch_up", rows, summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
