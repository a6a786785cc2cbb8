"""Claim cost: one claim by the library against the bare protocol, in the same run.

    python benchmarks/claim_cost.py [--rounds 500]

Each round makes three winning claims on new gates, one after the other (which goes first turns
from round to round), so that all three see the same broker: the library's
``RabbitMQBackend.claim`` (declare the gate, publish the claim, wait for its confirm), the same
with the gate declared ahead by ``prepare`` and its answer read (what the scheduler does with
``anarchon_lead_ms``; only the claim is timed), and the bare protocol with raw py-amqp (a durable
queue declare, then a persistent, mandatory, confirmed publish). It prints the median and p99 of
each and the library's ratio to the bare protocol.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid

import amqp
from common import BROKER, delete_prefixed, percentile, report
from kombu.utils.url import url_to_parts

from anarchon_celery import Claim, RabbitMQBackend
from anarchon_celery.backends.rabbitmq import gate_arguments, gate_name


def bare_connection() -> amqp.Connection:
    parts = url_to_parts(BROKER)
    conn = amqp.Connection(
        f"{parts.hostname}:{parts.port or 5672}",
        userid=parts.username,
        password=parts.password,
        virtual_host=parts.path or "/",
    )
    conn.connect()
    return conn


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=500)
    args = parser.parse_args(argv)
    prefix = f"bench-claim-{uuid.uuid4().hex[:8]}."
    slot_ttl_ms = 60_000
    backend = RabbitMQBackend(BROKER, prefix=prefix, slot_ttl_ms=slot_ttl_ms)
    backend.open()
    raw = bare_connection()
    channel = raw.channel()
    channel.confirm_select()
    arguments = gate_arguments(slot_ttl_ms)
    times: dict[str, list[float]] = {"library": [], "library, gate made ahead": [], "bare py-amqp": []}
    try:

        def library(n: int) -> float:
            started = time.perf_counter()
            outcome = backend.claim([Claim("lib", n)], "bench")[0]
            took = time.perf_counter() - started
            assert outcome.value == "won", outcome
            return took

        def ahead(n: int) -> float:
            backend.prepare([Claim("ahead", n)])
            backend.await_prepared(5)  # the scheduler declares lead_ms ahead: answered long before the slot
            started = time.perf_counter()
            outcome = backend.claim([Claim("ahead", n)], "bench")[0]
            took = time.perf_counter() - started
            assert outcome.value == "won", outcome
            return took

        def bare(n: int) -> float:
            gate = gate_name(prefix, "bare", n)
            body = json.dumps({"job": "bare", "slot": n, "instance": "bench"}).encode()
            started = time.perf_counter()
            channel.queue_declare(gate, durable=True, auto_delete=False, arguments=arguments)
            channel.basic_publish_confirm(
                amqp.Message(body, delivery_mode=2, content_type="application/json"), routing_key=gate, mandatory=True
            )
            return time.perf_counter() - started

        claims = list(zip(times, (library, ahead, bare)))
        for n in range(-20, args.rounds):  # the first 20 rounds warm up, and are not counted
            # Each in turn goes first: none always follows the same one.
            for name, claim in claims[n % 3 :] + claims[: n % 3]:
                took = claim(n)
                if n >= 0:
                    times[name].append(took * 1000)
    finally:
        backend.close()
        raw.close()
        delete_prefixed(prefix, BROKER)
    rows = [
        {"claim": name, "rounds": len(ms), "median ms": percentile(ms, 50), "p99 ms": percentile(ms, 99)}
        for name, ms in times.items()
    ]
    bare_row = rows[-1]
    for row in rows:
        row["median / bare"] = row["median ms"] / bare_row["median ms"]
        row["p99 / bare"] = row["p99 ms"] / bare_row["p99 ms"]
    report("claim_cost", rows, {"ratio_median": rows[0]["median / bare"], "ratio_p99": rows[0]["p99 / bare"]})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
