"""Steady lateness and broker footprint: instances on many second-level jobs for a while.

    python benchmarks/steady.py [--jobs 200] [--instances 3] [--duration 120]

``--instances`` ``celery beat -S anarchon_celery.Scheduler`` processes run ``--jobs`` jobs (every
1 s, 2 s, 3 s and ``*/5 * * * * *``, jitter 0). A raw consumer on the task queue stamps each task
on arrival: lateness is arrival minus the run's slot (with jitter 0, the slot is when every
instance plans its claim). At the end it counts the live gate queues and the history streams of
the run, with the memory RabbitMQ reports for them.

Two baselines, timed the same way in the same run:

* ``bare floor``, after the schedulers stopped: the same runs, second after second, by as many
  raw py-amqp clients as instances, each racing persistent claims pipelined into gates declared
  the second before (by one of them), then publishing the tasks of the claims it won, pipelined
  and confirmed: the protocol with nothing else, under the same load;
* ``one publish a second``, beside the schedulers: a bare client that sleeps until each second
  and publishes one persistent confirmed message, the broker's answer time under that load.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
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


def due_jobs(jobs: int, slot: int) -> list[str]:
    """The jobs of ``steady_app`` due at ``slot`` (a whole second)."""
    periods = (1000, 2000, 3000, 5000)  # steady_app's schedules, aligned to the epoch
    return [f"job-{n:03d}" for n in range(jobs) if slot % periods[n % len(periods)] == 0]


def bare_racer(prefix: str, jobs: int, start: int, end: int, index: int, slot_ttl_ms: int) -> None:
    """One bare client of the floor: every second from ``start`` to ``end``, claim the due runs
    (pipelined, confirmed), then publish the tasks of those won (pipelined, confirmed). Exits
    with an error if the broker refuses a task or stops answering."""
    from anarchon_celery.backends.rabbitmq import gate_arguments, gate_name

    conn = amqp.Connection("127.0.0.1:5672", userid="guest", password="guest", connect_timeout=10)
    conn.connect()
    claims, tasks = conn.channel(), conn.channel()
    claims.confirm_select()
    tasks.confirm_select()
    pending: dict[int, str] = {}  # claim delivery tag -> job
    won: list[str] = []
    returned: set[str] = set()  # unroutable claims: RabbitMQ returns them before their ack
    tasks_acked = 0  # the highest task tag acked (tasks are acked in order here, or nacked)

    def settle(tag: int, multiple: bool, acked: bool) -> None:
        for t in [t for t in pending if t <= tag] if multiple else [tag]:
            job = pending.pop(t, None)
            if acked and job is not None and gate_name(prefix, job, slot) not in returned:
                won.append(job)

    def on_task_ack(tag: int, multiple: bool) -> None:
        nonlocal tasks_acked
        tasks_acked = max(tasks_acked, tag)

    def on_task_nack(tag: int, multiple: bool) -> None:
        raise RuntimeError(f"bare floor: task {tag} refused by the broker")

    claims.events["basic_ack"].add(lambda tag, multiple: settle(tag, multiple, True))
    claims.events["basic_nack"].add(lambda tag, multiple: settle(tag, multiple, False))
    claims.events["basic_return"].add(lambda exc, exchange, routing_key, message: returned.add(routing_key))
    tasks.events["basic_ack"].add(on_task_ack)
    tasks.events["basic_nack"].add(on_task_nack)

    def declare(slot: int) -> None:  # by one client, the second before (as lead_ms does)
        if index == 0:
            for job in due_jobs(jobs, slot):
                arguments = gate_arguments(slot_ttl_ms)
                claims.queue_declare(gate_name(prefix, job, slot), durable=True, auto_delete=False, arguments=arguments)

    claim_tag = task_tag = 0
    slot = start
    declare(slot)
    while slot < end:
        time.sleep(max(0.0, (slot - now_ms()) / 1000))
        won.clear()
        for job in due_jobs(jobs, slot):
            claim_tag += 1
            pending[claim_tag] = job
            body = json.dumps({"job": job, "slot": slot, "instance": f"bare-{index}"}).encode()
            message = amqp.Message(body, delivery_mode=2)
            claims.basic_publish(message, routing_key=gate_name(prefix, job, slot), mandatory=True)
        while pending:
            conn.drain_events(timeout=10)
        for job in won:
            task_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{prefix}{job}{slot}"))
            body = json.dumps([[job], {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}])
            headers = {"id": task_id, "task": "steady_app.tick", "anarchon_slot": slot, "anarchon_job": job}
            message = amqp.Message(body, delivery_mode=2, content_type="application/json", application_headers=headers)
            tasks.basic_publish(message, exchange=f"{prefix}tasks", routing_key=f"{prefix}tasks")
            task_tag += 1
        while tasks_acked < task_tag:
            conn.drain_events(timeout=10)
        slot += 1000
        declare(slot)
    conn.close()


def bare_floor(args: argparse.Namespace) -> tuple[list[dict[str, Any]], int, bool]:
    """The floor's arrivals (``--instances`` bare racers, ``--duration`` seconds), the runs due in
    its window, and whether every racer finished cleanly."""
    prefix = f"bench-steady-bare-{uuid.uuid4().hex[:6]}."
    tally = started_tally(f"{prefix}tasks")
    start = -(-(now_ms() + 3000) // 1000) * 1000
    end = start + round(args.duration * 1000)
    context = multiprocessing.get_context("spawn")
    racers = [
        context.Process(target=bare_racer, args=(prefix, args.jobs, start, end, i, args.slot_ttl_ms))
        for i in range(args.instances)
    ]
    deadline = time.monotonic() + 3 + args.duration + 60
    try:
        for racer in racers:
            racer.start()
        for racer in racers:
            racer.join(max(0.0, deadline - time.monotonic()))
        time.sleep(2)
    finally:
        for racer in racers:
            if racer.is_alive():
                racer.terminate()
                racer.join(5)
        tally.stop()
        delete_prefixed(prefix, BROKER)
    clean = all(racer.exitcode == 0 for racer in racers)
    # From the second second: the racers start together at the first.
    window = range(start + 1000, end, 1000)
    arrivals = [a for a in tally.arrivals if a["slot"] is not None and start + 1000 <= a["slot"] < end]
    return arrivals, sum(len(due_jobs(args.jobs, slot)) for slot in window), clean


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
    parser.add_argument(
        "--history-size",
        type=int,
        default=0,
        help="anarchon_history_size (default 0, no history, as the floor: 200 streams need about 400 open "
        "files on the broker, on top of the gates)",
    )
    parser.add_argument("--no-floor", action="store_true", help="skip the bare floor")
    parser.add_argument("--keep-logs", action="store_true")
    args = parser.parse_args(argv)
    prefix = f"bench-steady-{uuid.uuid4().hex[:6]}."
    tmp = Path(tempfile.mkdtemp(prefix="anarchon-steady-"))
    env = bench_env(
        STEADY_PREFIX=prefix,
        STEADY_JOBS=str(args.jobs),
        STEADY_SLOT_TTL_MS=str(args.slot_ttl_ms),
        STEADY_HISTORY_SIZE=str(args.history_size),
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
    ticks = [a for a in window if a["job"] == "bare"]
    expected = sum(len(due_jobs(args.jobs, slot)) for slot in range(-(-start // 1000) * 1000, end, 1000))
    floor, floor_expected, floor_clean = bare_floor(args) if not args.no_floor else ([], 0, False)
    rows = []
    for name, arrivals, due in (
        (f"anarchon_celery x{args.instances}", ours, expected),
        (f"bare floor x{args.instances}", floor, floor_expected),
        ("one publish a second (beside ours)", ticks, None),
    ):
        late = [a["at_ms"] - a["slot"] for a in arrivals]
        runs = Counter((a["job"], a["slot"]) for a in arrivals)
        rows.append(
            {
                "sender": name,
                "runs": len(runs),
                "missing": due - len(runs) if due is not None else "",
                "duplicates": sum(n - 1 for n in runs.values()),
                "p50 ms": percentile(late, 50),
                "p99 ms": percentile(late, 99),
                "max ms": max(late, default=None),
            }
        )
    # A floor that lost runs or failed would look faster than it is: no ratio then.
    complete = floor_clean and rows[1]["missing"] == 0 and rows[1]["duplicates"] == 0
    summary = {
        "instances": args.instances,
        "jobs": args.jobs,
        "duration_s": args.duration,
        "history_size": args.history_size,
        "floor complete": complete,
        "p50 / floor p50": rows[0]["p50 ms"] / rows[1]["p50 ms"] if complete else None,
        "p99 / floor p99": rows[0]["p99 ms"] / rows[1]["p99 ms"] if complete else None,
        "slot_ttl_ms": args.slot_ttl_ms,
        **used,
    }
    report("steady", rows, summary)
    if not args.keep_logs:
        remove_dir(tmp)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
