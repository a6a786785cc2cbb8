"""What waiting for a replica costs a Redis claim: ``wait_replicas=1`` against no wait, in the same run.

    python benchmarks/replica_wait.py [--rounds 500] [--batch 200]

A Redis master (persisted at every write, as the lease soak's) and one replica of the benchmark's
own, on localhost. Each round makes one winning claim with each backend, one after the other (which
goes first turns from round to round), then a batch of ``--batch`` winning claims with each (as a
burst of jobs due together is claimed). Prints the median and p99 of each and the ratio of waiting
to not waiting. Needs ``redis-server`` on the PATH.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from common import HERE, percentile, report

from anarchon_celery import Claim, Outcome, RedisBackend, clock

sys.path.insert(0, str(HERE.parent))
from tests.redis_servers import OwnRedisServer  # noqa: E402


def timed(backend: RedisBackend, claims: list[Claim]) -> float:
    start = time.perf_counter()
    outcomes = backend.claim(claims, "bench")
    elapsed = (time.perf_counter() - start) * 1000
    assert outcomes == [Outcome.WON] * len(claims), outcomes
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--batch-rounds", type=int, default=30)
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="anarchon-replica-wait-"))
    master = OwnRedisServer(folder / "master")
    replica = OwnRedisServer(folder / "replica", replica_of=master.port)
    plain = RedisBackend(master.url, prefix="plain.")
    waiting = RedisBackend(f"{master.url}?wait_replicas=1", prefix="wait.")
    times: dict[str, list[float]] = {"no wait": [], "wait_replicas=1": []}
    batches: dict[str, list[float]] = {"no wait": [], "wait_replicas=1": []}
    try:
        for backend in (plain, waiting):
            backend.open()
        while waiting.claim([Claim("warm", clock.now_ms() - 1)], "bench") != [Outcome.WON]:
            time.sleep(0.1)  # until the replica has synced
        pair = [("no wait", plain), ("wait_replicas=1", waiting)]
        for n in range(args.rounds):
            for name, backend in pair if n % 2 else reversed(pair):
                times[name].append(timed(backend, [Claim(f"job-{n}", clock.now_ms() - 1)]))
        for n in range(args.batch_rounds):
            for name, backend in pair if n % 2 else reversed(pair):
                now = clock.now_ms() - 1
                batches[name].append(timed(backend, [Claim(f"burst-{n}-{k}", now) for k in range(args.batch)]))
    finally:
        for backend in (plain, waiting):
            backend.close()
        replica.kill()
        master.kill()
    rows = []
    for what, measured in (("one claim", times), (f"{args.batch} claims", batches)):
        base = percentile(measured["no wait"], 50), percentile(measured["no wait"], 99)
        for name, values in measured.items():
            median, p99 = percentile(values, 50), percentile(values, 99)
            rows.append(
                {
                    "what": what,
                    "backend": name,
                    "median ms": median,
                    "p99 ms": p99,
                    "median / no wait": median / base[0],
                    "p99 / no wait": p99 / base[1],
                }
            )
    report("replica_wait", rows, {"ratio_median_one": rows[1]["median / no wait"]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
