"""Steady lateness and broker footprint: instances on many second-level jobs for a while.

    python benchmarks/steady.py [--jobs 200] [--instances 3] [--duration 120]

``--instances`` ``celery beat -S anarchon_celery.Scheduler`` processes run ``--jobs`` jobs (every
1 s, 2 s, 3 s and ``*/5 * * * * *``, jitter 0). A raw consumer on the task queue stamps each task
on arrival: lateness is arrival minus the run's slot (with jitter 0, the slot is when every
instance plans its claim). The baseline, in the same run and on the same machine: a bare client
that sleeps until each second and publishes one persistent confirmed message (raw py-amqp), timed
the same way. At the end it counts the live gate queues and the history streams of the run, with
the memory RabbitMQ reports for them.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import amqp
from common import (
    BROKER,
    HERE,
    bench_env,
    delete_prefixed,
    now_ms,
    percentile,
    queue_names,
    remove_dir,
    report,
    start_celery,
    started_tally,
    stop,
    wait_for_line,
)


def bare_ticker(queue: str, until_ms: int, halt: threading.Event) -> None:
    """A publish of one persistent confirmed message at every whole second, as bare as it gets."""
    conn = amqp.Connection("127.0.0.1:5672", userid="guest", password="guest", confirm_publish=True)
    conn.connect()
    channel = conn.channel()
    slot = -(-now_ms() // 1000) * 1000
    while slot < until_ms and not halt.is_set():
        time.sleep(max(0.0, (slot - now_ms()) / 1000))
        headers = {"id": f"bare-{slot}", "anarchon_slot": slot}
        message = amqp.Message(
            b'[["bare"], {}, {}]', delivery_mode=2, content_type="application/json", application_headers=headers
        )
        channel.basic_publish(message, exchange=queue, routing_key=queue)
        slot += 1000
    conn.close()


def footprint(prefix: str) -> dict[str, Any]:
    """Live gates and history streams of ``prefix``, with the memory the broker reports. The
    counts come from the broker's metadata; the memory from the queues that answered
    ``list_queues`` (a busy queue process may not), as a mean per queue."""
    names = queue_names(prefix)
    listing = subprocess.run(
        ["rabbitmqctl", "-q", "list_queues", "--no-table-headers", "name", "memory"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    memory = {}
    for line in listing.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].startswith(prefix) and parts[1].isdigit():
            memory[parts[0]] = int(parts[1])
    gates = [n for n in names if ".slot." in n]
    streams = [n for n in names if n.endswith(".history")]

    def mean_kib(group: list[str]) -> float | None:
        known = [memory[n] for n in group if n in memory]
        return sum(known) / len(known) / 1024 if known else None

    per_gate, per_stream = mean_kib(gates), mean_kib(streams)
    return {
        "live gates": len(gates),
        "KiB per gate": per_gate,
        "gate memory MiB": len(gates) * per_gate / 1024 if per_gate else None,
        "history streams": len(streams),
        "KiB per stream": per_stream,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--instances", type=int, default=3)
    parser.add_argument("--duration", type=float, default=120)
    parser.add_argument("--slot-ttl-ms", type=int, default=60_000)
    parser.add_argument("--keep-logs", action="store_true")
    args = parser.parse_args(argv)
    prefix = f"bench-steady-{uuid.uuid4().hex[:6]}."
    tmp = Path(tempfile.mkdtemp(prefix="anarchon-steady-"))
    env = bench_env(
        STEADY_PREFIX=prefix,
        STEADY_JOBS=str(args.jobs),
        STEADY_SLOT_TTL_MS=str(args.slot_ttl_ms),
    )
    tally = started_tally(f"{prefix}tasks")
    procs = []
    halt = threading.Event()
    try:
        for index in range(args.instances):
            log = tmp / f"beat-{index}.log"
            beat_args = ["beat", "-l", "info", "--pidfile=", "-s", str(tmp / f"schedule-{index}")]
            procs.append((start_celery(beat_args, log, env, app="steady_app", cwd=HERE), log))
        for proc, log in procs:
            wait_for_line(log, "anarchon: ready as", proc, 300)
        start = now_ms() + 12_000  # past the first lead: every gate of the window was made ahead
        end = start + round(args.duration * 1000)
        bare = threading.Thread(target=bare_ticker, args=(f"{prefix}tasks", end, halt), daemon=True)
        time.sleep((start - now_ms()) / 1000)
        bare.start()
        time.sleep((end - now_ms()) / 1000 + 3)
        used = footprint(prefix)
    finally:
        halt.set()
        for proc, _ in procs:
            stop(proc)
        tally.stop()
        delete_prefixed(prefix, BROKER)
    window = [a for a in tally.arrivals if a["slot"] is not None and start <= a["slot"] < end]
    ours = [a for a in window if a["job"] != "bare"]
    bare_runs = [a for a in window if a["job"] == "bare"]
    counted = Counter((a["job"], a["slot"]) for a in ours)
    rows = []
    for name, arrivals in (("anarchon_celery", ours), ("bare confirmed publish", bare_runs)):
        late = [a["at_ms"] - a["slot"] for a in arrivals]
        rows.append(
            {
                "sender": name,
                "runs": len(arrivals),
                "p50 ms": percentile(late, 50),
                "p99 ms": percentile(late, 99),
                "max ms": max(late, default=None),
            }
        )
    summary = {
        "instances": args.instances,
        "jobs": args.jobs,
        "duration_s": args.duration,
        "duplicates": sum(n - 1 for n in counted.values()),
        "p99 / bare p99": rows[0]["p99 ms"] / rows[1]["p99 ms"] if rows[1]["p99 ms"] else None,
        "slot_ttl_ms": args.slot_ttl_ms,
        **used,
    }
    report("steady", rows, summary)
    if not args.keep_logs:
        remove_dir(tmp)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
