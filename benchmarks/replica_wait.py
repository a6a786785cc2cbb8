"""What waiting for a replica costs a claim, against not waiting, in the same run: Redis with
``wait_replicas=1``, and PostgreSQL with a synchronous standby.

    python benchmarks/replica_wait.py [--rounds 500] [--batch 200] [--stores redis,postgres]

Redis: a master (persisted at every write, as the lease soak's) and one replica of the benchmark's
own, on localhost; two backends on it, one waiting for the replica. PostgreSQL: a primary and a
streaming standby of the benchmark's own (``initdb``, ``pg_basebackup``); the primary's
``synchronous_standby_names`` switched between ``''`` and ``'*'`` from one round to the next. Each
round makes one winning claim each way, one after the other (which goes first turns from round to
round), then a batch of ``--batch`` winning claims each way (as a burst of jobs due together is
claimed). Prints the median and p99 of each and the ratio of waiting to not waiting. Needs
``redis-server`` and PostgreSQL's server programs.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import HERE, percentile, report

from anarchon_celery import Claim, Outcome, PostgresBackend, RedisBackend, clock

sys.path.insert(0, str(HERE.parent))
from tests.support.postgres_servers import OwnPostgres  # noqa: E402
from tests.support.redis_servers import OwnRedisServer  # noqa: E402


def timed(backend: Any, claims: list[Claim]) -> float:
    start = time.perf_counter()
    outcomes = backend.claim(claims, "bench")
    elapsed = (time.perf_counter() - start) * 1000
    assert outcomes == [Outcome.WON] * len(claims), outcomes
    return elapsed


def measure(pair: list[tuple[str, Any]], args: argparse.Namespace, before: Any = None) -> list[dict[str, Any]]:
    """Time ``pair``'s two ways of claiming (name, backend), alternated round by round; ``before``
    (name) is called before each claim, to switch a server's setting."""
    tags = {name: f"w{index}" for index, (name, _) in enumerate(pair)}  # each way's runs of its own
    times: dict[str, list[float]] = {name: [] for name, _ in pair}
    batches: dict[str, list[float]] = {name: [] for name, _ in pair}
    for n in range(args.rounds):
        for name, backend in pair if n % 2 else reversed(pair):
            if before:
                before(name)
            times[name].append(timed(backend, [Claim(f"{tags[name]}-job-{n}", clock.now_ms() - 1)]))
    for n in range(args.batch_rounds):
        for name, backend in pair if n % 2 else reversed(pair):
            if before:
                before(name)
            now = clock.now_ms() - 1
            claims = [Claim(f"{tags[name]}-burst-{n}-{k}", now) for k in range(args.batch)]
            batches[name].append(timed(backend, claims))
    rows = []
    plain = pair[0][0]
    for what, measured in (("one claim", times), (f"{args.batch} claims", batches)):
        base = percentile(measured[plain], 50), percentile(measured[plain], 99)
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
    return rows


def redis_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    folder = Path(tempfile.mkdtemp(prefix="anarchon-replica-wait-"))
    master = OwnRedisServer(folder / "master")
    replica = OwnRedisServer(folder / "replica", replica_of=master.port)
    plain = RedisBackend(master.url, prefix="plain.")
    waiting = RedisBackend(f"{master.url}?wait_replicas=1", prefix="wait.")
    try:
        for backend in (plain, waiting):
            backend.open()
        while waiting.claim([Claim("warm", clock.now_ms() - 1)], "bench") != [Outcome.WON]:
            time.sleep(0.1)  # until the replica has synced
        return measure([("Redis, no wait", plain), ("Redis, wait_replicas=1", waiting)], args)
    finally:
        for backend in (plain, waiting):
            backend.close()
        replica.kill()
        master.kill()
        shutil.rmtree(folder, ignore_errors=True)


def postgres_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    import psycopg

    primary = OwnPostgres()
    standby = None
    backend = None
    try:
        standby = OwnPostgres(standby_of=primary)
        primary.wait_streaming()
        backend = PostgresBackend(primary.url, prefix="bench.")
        backend.open()
        control = psycopg.connect(primary.url, autocommit=True)
        names = {"PostgreSQL, asynchronous standby": "", "PostgreSQL, synchronous standby": "*"}
        current: list[str] = []

        def switch(name: str) -> None:
            if current != [name]:
                control.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{names[name]}'")
                control.execute("SELECT pg_reload_conf()")
                want = "sync" if names[name] else "async"
                while control.execute("SELECT sync_state FROM pg_stat_replication").fetchone() != (want,):
                    time.sleep(0.01)
                current[:] = [name]

        try:
            return measure([(name, backend) for name in names], args, before=switch)
        finally:
            control.close()
    finally:
        if backend is not None:
            backend.close()
        for server in (standby, primary):
            if server is not None:
                server.remove()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--batch-rounds", type=int, default=30)
    parser.add_argument("--stores", default="redis,postgres")
    args = parser.parse_args(argv)
    rows = []
    stores = args.stores.split(",")
    if "redis" in stores:
        rows += redis_rows(args)
    if "postgres" in stores:
        rows += postgres_rows(args)
    report("replica_wait", rows, {})
    return 0


if __name__ == "__main__":
    sys.exit(main())
