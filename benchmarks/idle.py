"""Idle cost: the CPU a beat instance uses with many jobs that are mostly waiting.

    python benchmarks/idle.py [--jobs 100] [--duration 120]

Three ``celery beat -S anarchon_celery.Scheduler`` instances run ``--jobs`` jobs on the cron
``* * * * *`` (default jitter, 2 s) for ``--duration`` seconds; beside them, in the same run, one
plain ``celery beat`` with the same entries as ``crontab`` schedules. It reads each process's CPU
time (user + system, from /proc) over the same window, after start-up.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import uuid
from pathlib import Path

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

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--instances", type=int, default=3)
    parser.add_argument("--duration", type=float, default=120)
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="anarchon-idle-"))
    runs = [("anarchon", n) for n in range(args.instances)] + [("beat", 0)]
    prefixes = {impl: f"bench-idle-{impl}-{uuid.uuid4().hex[:6]}." for impl in ("anarchon", "beat")}
    tallies = {impl: Tally(f"{prefix}tasks") for impl, prefix in prefixes.items()}
    for tally in tallies.values():
        tally.start()
        tally.ready.wait(30)
    procs = []
    try:
        for impl, index in runs:
            env = bench_env(
                BURST_PREFIX=prefixes[impl],
                BURST_JOBS=str(args.jobs),
                BURST_IMPL=impl,
                BURST_CRON="* * * * *",
                BURST_JITTER_MS="2000",
            )
            log = tmp / f"{impl}-{index}.log"
            beat_args = ["beat", "-l", "info", "--pidfile=", "-s", str(tmp / f"schedule-{impl}-{index}")]
            procs.append((impl, start_celery(beat_args, log, env, app="burst_app", cwd=HERE), log))
        for impl, proc, log in procs:
            wait_for_line(log, "anarchon: ready as" if impl == "anarchon" else "beat: Starting...", proc, 300)
        time.sleep(5)
        before = [cpu_seconds(proc.pid) for _, proc, _ in procs]
        started = time.monotonic()
        time.sleep(args.duration)
        wall = time.monotonic() - started
        used = [cpu_seconds(proc.pid) - b for (_, proc, _), b in zip(procs, before)]
    finally:
        for _, proc, _ in procs:
            stop(proc)
        for tally in tallies.values():
            tally.stop()
        for prefix in prefixes.values():
            delete_prefixed(prefix, BROKER)
    rows = []
    for (impl, _proc, _), cpu in zip(procs, used):
        name = "anarchon_celery" if impl == "anarchon" else "plain celery beat"
        rows.append({"process": f"{name} #{len(rows) + 1}", "cpu s": cpu, "% of a core": 100 * cpu / wall})
    ours = [row["cpu s"] for row, (impl, _, _) in zip(rows, procs) if impl == "anarchon"]
    beat = [row["cpu s"] for row, (impl, _, _) in zip(rows, procs) if impl == "beat"]
    tasks = {impl: len(tally.arrivals) for impl, tally in tallies.items()}
    summary = {
        "jobs": args.jobs,
        "wall s": wall,
        "anarchon mean % of a core": 100 * sum(ours) / len(ours) / wall,
        "plain beat % of a core": 100 * beat[0] / wall,
        "anarchon / plain beat": (sum(ours) / len(ours)) / beat[0] if beat and beat[0] else None,
        "tasks sent (anarchon, plain beat)": f"{tasks['anarchon']}, {tasks['beat']}",
    }
    report("idle", rows, summary)
    remove_dir(tmp)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
