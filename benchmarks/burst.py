"""Burst: 1,000 jobs due at the same slot, from the slot to the last task published.

    python benchmarks/burst.py [--jobs 1000] [--instances 3] [--rounds 3]

Three measurements, each at its own minute boundary (the slot), timed by a raw consumer on the
task queue (not by a worker) from the slot to the arrival of the last task, taken in turn
``--rounds`` times:

* ``bare floor``: three raw py-amqp clients racing pipelined persistent claims into gates declared
  beforehand, each then publishing the tasks of the claims it won, pipelined and confirmed;
* ``anarchon_celery``: ``--instances`` ``celery beat -S anarchon_celery.Scheduler`` processes,
  jitter 0, gates declared ahead (``anarchon_lead_ms``), no history by default (``--history-size``);
* ``plain beat``: one ``celery beat`` with the same entries as ``crontab`` schedules;
* ``sqlite``, ``redis``, ``postgres`` (with ``--only ...,sqlite,redis,postgres``): the
  ``--instances`` beats deciding their runs in one SQLite file, in the local Redis
  (``BENCH_REDIS``) or PostgreSQL (``BENCH_POSTGRES``), instead of RabbitMQ; the tasks still on
  RabbitMQ. With ``--catch-up latest`` (or ``--overlap skip``), each store is measured again with
  that catch-up (or overlap) policy on every job, beside it without (what a policy costs the
  claims).

It checks that every job ran once (no duplicate, none missing), and prints the ratios of each
round's measurements and their median.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from common import (
    BROKER,
    HERE,
    Tally,
    bench_env,
    delete_prefixed,
    now_ms,
    remove_dir,
    report,
    start_celery,
    started_tally,
    stop,
    wait_for_line,
)

MINUTE = 60_000
REDIS = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/6")
POSTGRES = os.environ.get("BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
STORES = {"sqlite": "SQLite", "redis": "Redis", "postgres": "PostgreSQL"}


def next_boundary(margin_ms: int) -> int:
    """The first minute boundary at least ``margin_ms`` from now."""
    return -(-(now_ms() + margin_ms) // MINUTE) * MINUTE


def sleep_until(at_ms: int) -> None:
    while (left := at_ms - now_ms()) > 0:
        time.sleep(min(left / 1000, 0.5))


def measure(tally: Tally, slot: int, jobs: int, wait_s: float, by_slot: bool) -> dict[str, Any]:
    """Wait for the burst to land, then: its spread after the slot, and runs once each."""
    deadline = time.monotonic() + (slot - now_ms()) / 1000 + wait_s
    while time.monotonic() < deadline:
        arrivals = _of_slot(tally, slot, by_slot)
        if len(arrivals) >= jobs and time.monotonic() > deadline - wait_s + 3:
            break
        time.sleep(0.5)
    time.sleep(2)  # duplicates, if any, come after the last of the first copies
    arrivals = _of_slot(tally, slot, by_slot)
    counted = Counter(a["job"] for a in arrivals)
    times = sorted(a["at_ms"] - slot for a in arrivals)
    return {
        "tasks": len(arrivals),
        "jobs run": len(counted),
        "duplicates": sum(n - 1 for n in counted.values()),
        "missing": jobs - len(counted),
        "first s": times[0] / 1000 if times else None,
        "last s": times[-1] / 1000 if times else None,
    }


def _of_slot(tally: Tally, slot: int, by_slot: bool) -> list[dict[str, Any]]:
    if by_slot:
        return [a for a in tally.arrivals if a["slot"] == slot]
    return [a for a in tally.arrivals if slot - 1000 <= a["at_ms"] < slot + MINUTE - 1000]


# -- the bare floor -------------------------------------------------------------------------------


def _bare_client(prefix: str, jobs: int, slot: int, index: int) -> None:
    import amqp

    from anarchon_celery.backends.rabbitmq import gate_name

    conn = amqp.Connection("127.0.0.1:5672", userid="guest", password="guest")
    conn.connect()
    channel = conn.channel()
    channel.confirm_select()
    pending: set[int] = set(range(1, jobs + 1))  # delivery tag n + 1 is the claim of job n
    acked: set[int] = set()

    def settle(tag: int, multiple: bool, won: bool) -> None:
        for t in [t for t in pending if t <= tag] if multiple else [tag]:
            pending.discard(t)
            if won:
                acked.add(t)

    channel.events["basic_ack"].add(lambda tag, multiple: settle(tag, multiple, True))
    channel.events["basic_nack"].add(lambda tag, multiple: settle(tag, multiple, False))
    sleep_until(slot)
    for n in range(jobs):
        body = json.dumps({"job": f"job-{n:04d}", "slot": slot, "instance": f"bare-{index}"}).encode()
        message = amqp.Message(body, delivery_mode=2)
        amqp.Channel._basic_publish(
            channel, message, routing_key=gate_name(prefix, f"job-{n:04d}", slot), mandatory=True
        )
    while pending:
        conn.drain_events(timeout=10)
    won = sorted(acked)
    tasks = conn.channel()
    tasks.confirm_select()
    done: list[int] = []
    tasks.events["basic_ack"].add(lambda tag, multiple: done.append(tag))
    for tag in won:
        job = f"job-{tag - 1:04d}"
        task_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{prefix}{job}{slot}"))
        body = json.dumps([[job], {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}])
        headers = {"id": task_id, "task": "burst_app.tick", "anarchon_slot": slot, "anarchon_job": job}
        message = amqp.Message(body, delivery_mode=2, content_type="application/json", application_headers=headers)
        amqp.Channel._basic_publish(tasks, message, exchange=f"{prefix}tasks", routing_key=f"{prefix}tasks")
    while won and max(done, default=0) < len(won):
        conn.drain_events(timeout=10)
    conn.close()


def bare_floor(args: argparse.Namespace) -> dict[str, Any]:
    import amqp

    from anarchon_celery.backends.rabbitmq import gate_arguments, gate_name

    prefix = f"bench-burst-bare-{uuid.uuid4().hex[:6]}."
    tally = started_tally(f"{prefix}tasks")
    slot = next_boundary(25_000)
    conn = amqp.Connection("127.0.0.1:5672", userid="guest", password="guest")
    conn.connect()
    channel = conn.channel()
    for n in range(args.jobs):  # declared beforehand, as prepare() does: not timed
        channel.queue_declare(
            gate_name(prefix, f"job-{n:04d}", slot), durable=True, auto_delete=False, arguments=gate_arguments(300_000)
        )
    conn.close()
    context = multiprocessing.get_context("spawn")
    clients = [context.Process(target=_bare_client, args=(prefix, args.jobs, slot, i)) for i in range(3)]
    for client in clients:
        client.start()
    try:
        result = measure(tally, slot, args.jobs, 60, by_slot=True)
    finally:
        for client in clients:
            client.join(30)
        tally.stop()
        delete_prefixed(prefix, BROKER)
    return {"scheduler": "bare floor (3 raw py-amqp clients)", **result}


# -- the schedulers -------------------------------------------------------------------------------


def delete_postgres_rows(prefix: str) -> None:
    """The rows a run on the PostgreSQL backend left."""
    import psycopg

    with psycopg.connect(POSTGRES) as db:
        for table in ("anarchon_jobs", "anarchon_runs", "anarchon_events", "anarchon_peers"):
            db.execute(f"DELETE FROM {table} WHERE prefix = %s", (prefix,))


def delete_store_state(kind: str, prefix: str) -> None:
    """What a run left under ``prefix`` in the store of ``kind`` (Redis keys, PostgreSQL rows; a
    SQLite file goes with its folder)."""
    if kind == "redis":
        delete_redis_keys(prefix)
    elif kind == "postgres":
        delete_postgres_rows(prefix)


def delete_redis_keys(prefix: str) -> None:
    """The keys a run on the Redis backend left (cursors, run records)."""
    import redis

    client = redis.Redis.from_url(REDIS)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        for start in range(0, len(keys), 1000):
            client.delete(*keys[start : start + 1000])
    finally:
        client.close()


def scheduler_run(
    impl: str,
    instances: int,
    args: argparse.Namespace,
    backend: str = "rabbitmq",
    catch_up: str = "",
    overlap: str = "",
) -> dict[str, Any]:
    prefix = f"bench-burst-{impl}-{uuid.uuid4().hex[:6]}."
    tmp = Path(tempfile.mkdtemp(prefix="anarchon-burst-"))
    env = bench_env(
        BURST_PREFIX=prefix,
        BURST_JOBS=str(args.jobs),
        BURST_IMPL=impl,
        BURST_BACKEND={"sqlite": f"sqlite:///{tmp / 'anarchon.db'}", "redis": REDIS, "postgres": POSTGRES}.get(
            backend, ""
        ),
        BURST_CATCH_UP=catch_up,
        BURST_OVERLAP=overlap,
    )
    tally = started_tally(f"{prefix}tasks")
    procs = []
    ready = "anarchon: ready as" if impl == "anarchon" else "beat: Starting..."
    try:
        for index in range(instances):
            log = tmp / f"{impl}-{index}.log"
            args_ = ["beat", "-l", "info", "--pidfile=", "-s", str(tmp / f"schedule-{index}")]
            procs.append((start_celery(args_, log, env, app="burst_app", cwd=HERE), log))
        started = time.monotonic()
        started_ms = now_ms()
        for proc, log in procs:
            wait_for_line(log, ready, proc, 600)
        startup_s = time.monotonic() - started
        slot = next_boundary(args.lead_ms + 5_000)
        result = measure(tally, slot, args.jobs, 60, by_slot=impl == "anarchon")
        # A fresh deployment: no run due before its first instance started is sent (a job that did
        # not exist then has no missed run); every task that arrived, of any slot, is counted.
        result["before start"] = sum(1 for a in tally.arrivals if a.get("slot") is not None and a["slot"] < started_ms)
        result["tasks in all"] = len(tally.arrivals)
    finally:
        for proc, _ in procs:
            stop(proc)
        tally.stop()
        delete_prefixed(prefix, BROKER)
        delete_store_state(backend, prefix)
    name = f"anarchon_celery x{instances}" if impl == "anarchon" else "plain celery beat x1"
    if backend != "rabbitmq":
        name += f" on {STORES[backend]}"
    if catch_up:
        name += f", catch_up {catch_up}"
    if overlap:
        name += f", overlap {overlap}"
    if not args.keep_logs:
        remove_dir(tmp)
    return {"scheduler": name, **result, "startup s": round(startup_s, 1)}


def _on(label: str) -> Any:
    return lambda name: name.endswith(f" on {label}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--instances", type=int, default=3)
    parser.add_argument("--lead-ms", type=int, default=10_000, help="anarchon_lead_ms of the instances")
    parser.add_argument(
        "--history-size",
        type=int,
        default=0,
        help="anarchon_history_size (default 0, no history: a stream per job, 1,000 of them, needs about "
        "2,000 open files on the broker, more than a packaged RabbitMQ allows by default)",
    )
    parser.add_argument("--only", default="bare,anarchon,beat", help=f"of bare, anarchon, beat, {', '.join(STORES)}")
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="measurements of each, taken in turn; the ratios pair each round's (default 3: runs here "
        "vary from one minute to the next, the floor's as much as ours)",
    )
    parser.add_argument(
        "--catch-up",
        default="",
        metavar="POLICY",
        help="also run each store with anarchon_catch_up = POLICY (latest or all), beside it without",
    )
    parser.add_argument(
        "--overlap",
        default="",
        metavar="POLICY",
        help="also run each store with anarchon_overlap = POLICY (skip, buffer_one, buffer_all), beside it without",
    )
    parser.add_argument("--keep-logs", action="store_true")
    args = parser.parse_args(argv)
    os.environ["BURST_LEAD_MS"] = str(args.lead_ms)
    os.environ["BURST_HISTORY_SIZE"] = str(args.history_size)
    rows = []
    only = args.only.split(",")
    ratios: dict[str, list[float]] = {
        "anarchon / bare floor": [],
        "plain beat / anarchon": [],
        **{f"anarchon on {label} / anarchon": [] for label in STORES.values()},
        **{f"on {label} with catch_up / without": [] for label in STORES.values()},
        **{f"on {label} with overlap / without": [] for label in STORES.values()},
    }
    for round_ in range(1, args.rounds + 1):
        by_name: dict[str, dict[str, Any]] = {}
        if "bare" in only:
            by_name["floor"] = bare_floor(args)
        if "anarchon" in only:
            by_name["ours"] = scheduler_run("anarchon", args.instances, args)
        if "beat" in only:
            by_name["beat"] = scheduler_run("beat", 1, args)
        for store in STORES:
            if store in only:
                by_name[store] = scheduler_run("anarchon", args.instances, args, backend=store)
                if args.catch_up:
                    by_name[f"{store}+"] = scheduler_run(
                        "anarchon", args.instances, args, backend=store, catch_up=args.catch_up
                    )
                if args.overlap:
                    by_name[f"{store}o"] = scheduler_run(
                        "anarchon", args.instances, args, backend=store, overlap=args.overlap
                    )
        rows += [{"round": round_, **row} for row in by_name.values()]
        last = {name: row["last s"] for name, row in by_name.items() if row["last s"]}
        if "ours" in last and "floor" in last:
            ratios["anarchon / bare floor"].append(last["ours"] / last["floor"])
        if "ours" in last and "beat" in last:
            ratios["plain beat / anarchon"].append(last["beat"] / last["ours"])
        for store, label in STORES.items():
            if "ours" in last and store in last:
                ratios[f"anarchon on {label} / anarchon"].append(last[store] / last["ours"])
            if store in last and f"{store}+" in last:
                ratios[f"on {label} with catch_up / without"].append(last[f"{store}+"] / last[store])
            if store in last and f"{store}o" in last:
                ratios[f"on {label} with overlap / without"].append(last[f"{store}o"] / last[store])
    summary: dict[str, Any] = {}
    for name, values in ratios.items():
        if values:
            summary[f"{name}, median of {len(values)}"] = statistics.median(values)
            summary[f"{name}, each round"] = ", ".join(f"{v:.2f}" for v in values)
    kinds = {
        "bare": lambda n: n.startswith("bare"),
        "anarchon_celery": lambda n: n.startswith("anarchon_celery") and " on " not in n,
        **{f"anarchon_celery on {label}": _on(label) for label in STORES.values()},
        **{
            f"anarchon_celery on {label} with catch_up": _on(f"{label}, catch_up {args.catch_up}")
            for label in STORES.values()
        },
        **{
            f"anarchon_celery on {label} with overlap": _on(f"{label}, overlap {args.overlap}")
            for label in STORES.values()
        },
        "plain": lambda n: n.startswith("plain"),
    }
    for name, kind in kinds.items():
        lasts = [row["last s"] for row in rows if kind(row["scheduler"]) and row["last s"]]
        if lasts:
            summary[f"{name} last s, median of {len(lasts)}"] = statistics.median(lasts)
    report("burst", rows, summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
