"""Worker history cost: what writing a run's ``running`` and ``succeeded`` events adds to a short task.

    python benchmarks/worker_history.py [--tasks 2000] [--rounds 2] [--pools threads:16,prefork:4,solo:1]
                                        [--also-signals OLD_SIGNALS_PY]

For each pool, ``--tasks`` no-op tasks carrying a run's headers are queued, then one
``celery worker`` of that pool runs them all and is stopped (SIGTERM). The variants, taken in
turn ``--rounds`` times (each going first in turn), differ only in the job the runs belong to:

* ``baseline``: a job with ``history_size`` 0 (the signals run, and write nothing);
* ``history``: a job that keeps history, so that each task writes two events to its stream;
* with ``--also-signals FILE``, ``history`` again with that file in place of the package's
  history writer, ``anarchon_celery/worker/history.py`` (``anarchon_celery/signals.py`` before
  it moved; ``git show REV:PATH > FILE``: a before and after in one run).

Each task notes when its function started and ended (monotonic clock). On a thread (or process)
kept busy by a full queue, the gap from one task's end to the next one's start is what the worker
spends between two task bodies: the signals, the acknowledgement, fetching the next. The table
gives its median, p99 and mean per variant and throughput (tasks a second, the first tenth left
out as warm-up), and for ``history`` the events found in the stream afterwards (every one of them
must be there), the CPU time of the processes that ran the tasks (start-up included) per task,
how long after the last task the buffered writer still held events (``history lag s``: the
history written in the background is not waited for by the tasks, so it must keep up), and how
long the worker took to stop (its flush included). A run with a gap over a
second (a stall of this shared machine or broker, seen in baseline runs too) is measured again, up
to twice; ``stalls`` and ``tries`` say so. The summary is the added gap, p50 and p99
(history minus baseline, medians of the rounds), and the throughput ratio of each pool, over the
rounds where no run stalled. (Solo workers here now and then wait exactly 10 s for their next
task, Celery's timer interval, with or without history: those are the stalls.)

The same file is the workers' Celery app (``celery -A worker_history``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

from celery import Celery
from celery.signals import worker_process_shutdown, worker_shutdown
from common import BROKER, HERE, bench_env, delete_prefixed, percentile, remove_dir, report, start_celery, stop

PREFIX = os.environ.get("WH_PREFIX", "bench-wh.")
#: A gap longer than this (ms) is a stall of the machine or the broker (shared here): such a run is
#: measured again, up to twice, and the row says how many tries it took.
STALL_MS = 1000
OUT = os.environ.get("WH_OUT")

app = Celery("worker_history", broker=BROKER)
app.conf.update(
    imports=("anarchon_celery",),
    task_default_queue=f"{PREFIX}tasks",
    task_acks_late=True,
    task_ignore_result=True,
    worker_prefetch_multiplier=4,
    broker_connection_retry_on_startup=True,
    anarchon_prefix=PREFIX,
    beat_schedule={
        # Never due while the benchmark runs: the runs are queued by the benchmark itself.
        "kept": {"task": "worker_history.tick", "schedule": "0 3 1 1 *", "history_size": 10_000},
        "quiet": {"task": "worker_history.tick", "schedule": "0 3 1 1 *", "history_size": 0},
    },
)

if os.environ.get("WH_SIGNALS"):
    # Another history writer (an older one, with --also-signals) writes the history instead of the package's.
    import importlib.util

    from celery.signals import task_postrun, task_prerun, task_revoked

    import anarchon_celery.worker.history as current

    for signal, name in ((task_prerun, "_on_prerun"), (task_postrun, "_on_postrun"), (task_revoked, "_on_revoked")):
        if hasattr(current, name):
            signal.disconnect(getattr(current, name))
    spec = importlib.util.spec_from_file_location("anarchon_celery._signals_measured", os.environ["WH_SIGNALS"])
    assert spec is not None and spec.loader is not None
    measured = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = measured
    spec.loader.exec_module(measured)

_times: list[tuple[int, int, int]] = []  # (thread, start ns, end ns) of every task of this process
_counter_pid: int | None = None


def _count_out() -> None:
    """Write this process's count of finished tasks every 0.1 s, for the driver to wait on, with
    the history events its writer still holds (a peek at the package's internals)."""
    from anarchon_celery.worker import history as signals

    path = Path(OUT or ".") / f"count-{os.getpid()}"
    while True:
        writers = [w for (pid, _), w in getattr(signals, "_writers", {}).items() if pid == os.getpid()]
        held = sum(w._waiting + w._writing for w in writers)
        path.write_text(f"{len(_times)} {held}")
        time.sleep(0.1)


@app.task(name="worker_history.tick")
def tick() -> None:
    global _counter_pid
    started = time.monotonic_ns()
    if _counter_pid != os.getpid():
        _counter_pid = os.getpid()
        threading.Thread(target=_count_out, daemon=True).start()
    _times.append((threading.get_ident(), started, time.monotonic_ns()))


@worker_shutdown.connect
@worker_process_shutdown.connect
def _dump(**_: Any) -> None:
    if OUT and _times:
        cpu = os.times()
        (Path(OUT) / f"times-{os.getpid()}.json").write_text(json.dumps(_times))
        (Path(OUT) / f"cpu-{os.getpid()}").write_text(str(cpu.user + cpu.system))


# -- the driver ---------------------------------------------------------------------------------


def queue_runs(prefix: str, job: str, count: int) -> None:
    """``count`` tasks of ``job``, with the headers the scheduler gives a run, on the task queue."""
    sender = Celery("worker_history_sender", broker=BROKER, set_as_current=False)
    sender.conf.task_default_queue = f"{prefix}tasks"
    with sender.producer_or_acquire() as producer:
        for n in range(count):
            run = str(uuid.uuid4())
            headers = {"anarchon_job": job, "anarchon_slot": n, "anarchon_run": run, "anarchon_trigger": "manual"}
            sender.send_task("worker_history.tick", task_id=run, headers=headers, producer=producer)


def counts(out: Path) -> tuple[int, int]:
    """Tasks done, and history events held by the writers, over the worker's processes."""
    done = held = 0
    for path in out.glob("count-*"):
        text = path.read_text().split()
        if len(text) == 2:
            done, held = done + int(text[0]), held + int(text[1])
    return done, held


def wait_done(out: Path, count: int, proc: subprocess.Popen[bytes], log: Path, timeout: float = 600) -> float:
    """Wait until the ``count`` tasks are done; return how many seconds later the writers held no
    more events (0 when none was held then)."""
    deadline = time.monotonic() + timeout
    while (done := counts(out)[0]) < count:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{done}/{count} tasks done; worker log:\n{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.05)
    finished = time.monotonic()
    while counts(out)[1] and time.monotonic() < deadline:
        time.sleep(0.05)
    return time.monotonic() - finished


def measure(times: list[list[int]], warmup: int) -> dict[str, Any]:
    """Gaps between task bodies on each thread, and throughput, without the first ``warmup`` tasks."""
    ordered = sorted(times, key=lambda t: t[2])
    after = ordered[warmup][2]
    by_thread: dict[tuple[int, int], list[list[int]]] = defaultdict(list)
    for pid, thread, start, end in ordered:
        by_thread[pid, thread].append([start, end])
    gaps = [
        (b[0] - a[1]) / 1e6
        for spans in by_thread.values()
        for a, b in zip(spans, spans[1:])
        if a[0] >= after  # both after the warm-up
    ]
    counted = ordered[warmup:]
    seconds = (max(t[3] for t in counted) - counted[0][2]) / 1e9
    return {
        "gap p50 ms": percentile(gaps, 50),
        "gap p99 ms": percentile(gaps, 99),
        "gap mean ms": statistics.fmean(gaps),
        "tasks/s": len(counted) / seconds if seconds > 0 else float("nan"),
        "stalls": sum(gap > STALL_MS for gap in gaps),
    }


def one_run(pool: str, concurrency: int, variant: str, args: argparse.Namespace, prefix: str) -> dict[str, Any]:
    from anarchon_celery import RabbitMQBackend

    job = "quiet" if variant == "baseline" else "kept"
    out = Path(tempfile.mkdtemp(prefix="anarchon-wh-"))
    log = out / "worker.log"
    backend = RabbitMQBackend(BROKER, prefix=prefix)
    try:
        if job == "kept":
            backend.ensure_history("kept", 10_000)  # made beforehand: its creation is not timed
        queue_runs(prefix, job, args.tasks)
        env = bench_env(WH_PREFIX=prefix, WH_OUT=str(out))
        if variant != "history" and variant != "baseline":
            env["WH_SIGNALS"] = args.also_signals
        worker_args = ["worker", f"--pool={pool}", f"--concurrency={concurrency}", "-l", "warning"]
        worker_args += ["-n", f"{prefix}{pool}@%h", "--without-mingle", "--without-gossip", "--without-heartbeat"]
        proc = start_celery(worker_args, log, env, app="worker_history", cwd=HERE)
        try:
            lag_s = wait_done(out, args.tasks, proc, log)
        finally:
            stopping = time.monotonic()
            stop(proc, timeout=120)
            stop_s = time.monotonic() - stopping
        times = [[int(p.stem.split("-")[1]), *t] for p in out.glob("times-*.json") for t in json.loads(p.read_text())]
        if len(times) != args.tasks:
            raise RuntimeError(f"{len(times)} task times for {args.tasks} tasks:\n{log.read_text()[-3000:]}")
        row = {"pool": f"{pool}:{concurrency}", "variant": variant, **measure(times, args.tasks // 10)}
        cpu_s = sum(float(p.read_text()) for p in out.glob("cpu-*"))
        row["task process cpu ms/task"] = cpu_s * 1000 / args.tasks
        row["history lag s"] = lag_s
        row["stop s"] = stop_s
        if job == "kept":
            events = backend.read_history(["kept"])["kept"]
            row["events"] = len({(e["run"], e["event"]) for e in events})
            row["missing"] = 2 * args.tasks - row["events"]
            row["written twice"] = len(events) - row["events"]
            with backend.connection.clone() as conn:
                conn.default_channel.queue_delete(f"{prefix}kept.history")  # the next round starts empty
        warnings = [line for line in log.read_text(errors="replace").splitlines() if "anarchon" in line]
        row["anarchon log lines"] = len(warnings)
        return row
    finally:
        backend.close()
        if args.keep_logs:
            print(f"logs kept in {out}")
        else:
            remove_dir(out)


def steady_run(pool: str, concurrency: int, variant: str, args: argparse.Namespace, prefix: str) -> dict[str, Any]:
    """:func:`one_run`, again (up to twice) while it stalls."""
    tries = 0
    while True:
        tries += 1
        row = one_run(pool, concurrency, variant, args, prefix)
        if not row["stalls"] or tries == 3:
            row["tries"] = tries
            return row


def summarize(name: str, variants: list[str], rounds: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """Each variant against the baseline of its round: medians over the rounds where no run
    stalled (all of them if every round had a stall)."""
    clean = [r for r in rounds if not any(row["stalls"] for row in r.values())] or rounds
    summary: dict[str, Any] = {f"{name} rounds counted": len(clean)}
    for variant in variants[1:]:
        label = name if variant == "history" else f"{name} ({variant})"
        for q in ("p50", "p99"):
            added = [r[variant][f"gap {q} ms"] - r["baseline"][f"gap {q} ms"] for r in clean]
            summary[f"{label} added {q} ms"] = statistics.median(added)
        ratios = [r[variant]["tasks/s"] / r["baseline"]["tasks/s"] for r in clean]
        summary[f"{label} throughput ratio"] = statistics.median(ratios)
        summary[f"{label} events missing"] = sum(r[variant]["missing"] for r in rounds)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--pools", default="threads:16,prefork:4,solo:1", help="pool:concurrency, comma-separated")
    parser.add_argument(
        "--also-signals", metavar="FILE", help="also measure this history writer (an older anarchon_celery/signals.py)"
    )
    parser.add_argument("--keep-logs", action="store_true")
    args = parser.parse_args(argv)
    variants = ["baseline", "history"] + ([f"history, {Path(args.also_signals).name}"] if args.also_signals else [])
    prefix = f"bench-wh-{uuid.uuid4().hex[:8]}."
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {"tasks": args.tasks, "rounds": args.rounds}
    try:
        for spec in args.pools.split(","):
            pool, _, concurrency = spec.partition(":")
            pairs = []
            for n in range(args.rounds):
                order = variants[n % len(variants) :] + variants[: n % len(variants)]  # each goes first in turn
                got = {v: steady_run(pool, int(concurrency or 1), v, args, prefix) for v in order}
                rows += [got[v] for v in order]
                pairs.append(got)
            summary.update(summarize(f"{pool}:{concurrency}", variants, pairs))
    finally:
        delete_prefixed(prefix, BROKER)
    report("worker_history", rows, summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
