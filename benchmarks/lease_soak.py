"""Lease soak: the backends with leases (SQLite, Redis, PostgreSQL) beside the RabbitMQ backend
and RedBeat, in the same run, counted from a worker's executions.

    python benchmarks/lease_soak.py                                  # every impl and mode, 5 min each
    python benchmarks/lease_soak.py --impls sqlite,rabbitmq --modes kill-claim --duration 60

Each line runs 3 scheduler instances (20 jobs every 2 s by default) and one prefork worker
(2 processes) that executes the tasks; every execution appends a line (job, slot, token, time)
to a file, which is what is counted. The faults, one every ``--every`` seconds:

* ``kill-claim``: an instance is SIGKILLed right after it wins a run, before its task is written
  (the exact point, played by ``soak_faults.Scheduler``), then started again;
* ``pause-send``: an instance is SIGSTOPped right after its task is sent, before the run is
  marked sent, for the lease plus 2 s, then SIGCONTed;
* ``kill``: a random instance (RedBeat's lock holder) SIGKILLed and started again;
* ``cut``: every connection to the store closed (RabbitMQ ``close_all_connections``, Redis
  ``CLIENT KILL TYPE normal``, PostgreSQL ``pg_terminate_backend``; none for SQLite);
* ``restart``: the store restarted (RabbitMQ's application; the benchmark's own Redis, with
  ``appendonly yes`` and ``appendfsync always``; PostgreSQL's cluster, ``pg_ctlcluster restart``);
* ``outage``: the store away for ``--outage-s`` seconds (3 by default), then back with its data:
  Redis SIGKILLed and started again, PostgreSQL stopped as in a crash (``-m immediate``) and
  started again, RabbitMQ's application stopped and started again, SQLite's write lock held by
  another connection (longer than its 5 s wait: ``--outage-s 8``);
* ``failover``: (``redis-sentinel``, ``redis-sentinel-wait``) the master of a Sentinel group of the
  benchmark's own (a master, two replicas, three sentinels) SIGKILLed: a replica is promoted in
  about 2 s; the old master is started again ``--outage-s`` later and rejoins as a replica.
  ``redis-sentinel-wait`` counts a win only once a replica has it (``wait_replicas=1``);
* ``chaos``: ``kill``, ``cut`` and ``restart`` in turn (SQLite: ``kill`` only);
* ``rolling``: one instance after the other stopped with SIGTERM and started again;
* ``skew``: no fault, but one instance's clock is 60 s ahead (``none``: no fault at all).

RedBeat (celery-redbeat, on the benchmark's Redis) plays ``kill``, ``cut``, ``restart``,
``chaos`` and ``rolling``, its kills aimed at its lock holder; it has no claim or send point to
aim at. By default the modes are ``kill-claim``, ``pause-send``, ``chaos``, ``rolling`` and
``skew``.

Counted per (job, slot) for ours, per job and period-long bucket of execution time for RedBeat:
runs expected, executed, executed twice (``dup``), missed, started before their slot
(``early``), and the lateness of the executions (start - slot): over 2 s, p99 and the most. For
``kill-claim``, ``faulted late`` is the most lateness of the runs whose winner was killed. Runs are
counted from one period after the first execution, and the last ``--tail-s`` seconds are not.

Needs: RabbitMQ (the tasks, and the RabbitMQ backend), ``redis-server`` on the PATH,
PostgreSQL on 127.0.0.1:5432 with a database ``test`` (``pg_ctlcluster`` to restart it), and
celery-redbeat for the RedBeat lines.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from common import BROKER, HERE, delete_prefixed, now_ms, percentile, start_celery, stop, wait_for_line
from soak import expire_gates, rabbitmqctl, restart_broker

sys.path.insert(0, str(HERE.parent))
from tests.support.postgres_servers import system_cluster  # noqa: E402
from tests.support.redis_servers import SentinelGroup  # noqa: E402

IMPLS = ("sqlite", "redis", "postgres", "rabbitmq", "redbeat", "redis-sentinel", "redis-sentinel-wait")
MODES = ("none", "kill-claim", "pause-send", "kill", "cut", "restart", "outage", "failover", "chaos", "rolling", "skew")
#: The modes run by default: the figures of the README.
DEFAULT_MODES = ("kill-claim", "pause-send", "chaos", "rolling", "skew")
#: What each impl plays (the others are not applicable: no server to cut, no point to aim at).
PLAYS = {
    "sqlite": {"none", "kill-claim", "pause-send", "kill", "outage", "chaos", "rolling", "skew"},
    "redis": set(MODES) - {"failover"},
    "postgres": set(MODES) - {"failover"},
    "rabbitmq": set(MODES) - {"failover"},
    "redbeat": {"none", "kill", "cut", "restart", "outage", "chaos", "rolling"},
    "redis-sentinel": {"none", "failover"},
    "redis-sentinel-wait": {"none", "failover"},
}
#: ``chaos`` plays these in turn (those the store has: SQLite has no server to cut or restart).
CHAOS = ("kill", "cut", "restart")
REDIS_PORT = 6390
#: The most gates the RabbitMQ line may keep alive at once (see main()).
MAX_GATES = 600
POSTGRES = os.environ.get("SOAK_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")


class OwnRedis:
    """A Redis of the benchmark's own (persisted at every write), to restart at will."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.url = f"redis://127.0.0.1:{REDIS_PORT}/0"
        self.start()

    def start(self) -> None:
        args = ["redis-server", "--port", str(REDIS_PORT), "--bind", "127.0.0.1", "--dir", str(self.folder)]
        args += ["--appendonly", "yes", "--appendfsync", "always", "--save", "", "--daemonize", "yes"]
        args += ["--maxmemory-policy", "noeviction", "--pidfile", str(self.folder / "redis.pid")]
        subprocess.run(args, check=True, capture_output=True)
        self._await()

    def _await(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            done = subprocess.run(["redis-cli", "-p", str(REDIS_PORT), "ping"], capture_output=True, text=True)
            if done.stdout.strip() == "PONG":
                return
            time.sleep(0.1)
        raise RuntimeError("the benchmark's Redis did not start")

    def cli(self, *args: str) -> None:
        subprocess.run(["redis-cli", "-p", str(REDIS_PORT), *args], capture_output=True, check=False)

    def restart(self) -> None:
        self.cli("shutdown")  # the append-only file is written at every write: nothing lost
        time.sleep(1)
        self.start()

    def kill(self) -> None:
        """SIGKILL, as a crash (what it wrote is on disk: appendfsync always)."""
        pid = int((self.folder / "redis.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        while subprocess.run(["redis-cli", "-p", str(REDIS_PORT), "ping"], capture_output=True).returncode == 0:
            time.sleep(0.05)

    def stop(self) -> None:
        self.cli("shutdown", "nosave")


def postgres_cut() -> None:
    import psycopg

    with psycopg.connect(POSTGRES, autocommit=True) as db:
        db.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'anarchon_celery'")


def postgres_clean(prefix: str) -> None:
    import psycopg

    with psycopg.connect(POSTGRES, autocommit=True) as db:
        for table in ("anarchon_jobs", "anarchon_runs", "anarchon_events", "anarchon_peers"):
            if db.execute("SELECT to_regclass(%s)", (table,)).fetchone()[0] is not None:
                db.execute(f"DELETE FROM {table} WHERE prefix = %s", (prefix,))


class Line:
    """The instances, the worker and the faults of one (impl, mode)."""

    def __init__(self, impl: str, mode: str, args: argparse.Namespace, redis: OwnRedis) -> None:
        self.impl, self.mode, self.args, self.redis = impl, mode, args, redis
        self.prefix = f"lsoak-{uuid.uuid4().hex[:8]}."
        self.tmp = Path(tempfile.mkdtemp(prefix="anarchon-lease-soak-"))
        self.faults_dir = self.tmp / "faults"
        self.faults_dir.mkdir()
        self.executions = self.tmp / "executions.jsonl"
        self.env = dict(
            os.environ,
            SOAK_PREFIX=self.prefix,
            SOAK_IMPL="redbeat" if impl == "redbeat" else "anarchon",
            SOAK_JOBS=str(args.jobs),
            SOAK_PERIOD=str(args.period),
            SOAK_BROKER=BROKER,
            SOAK_MAX_LATE_MS=str(args.max_late_ms),
            SOAK_SLOT_TTL_MS=str(args.slot_ttl_ms),
            SOAK_LEASE_MS=str(args.lease_ms),
            SOAK_HISTORY_SIZE="0",
            SOAK_REDIS=redis.url,
            SOAK_FAULT_DIR=str(self.faults_dir),
            SOAK_EXECUTIONS=str(self.executions),
            PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),
        )
        self.group: Any = None
        if impl.startswith("redis-sentinel"):
            self.group = SentinelGroup(self.tmp / "sentinel")
        backend = {
            "sqlite": f"sqlite:///{self.tmp / 'anarchon.db'}",
            "redis": redis.url,
            "postgres": POSTGRES,
            "redis-sentinel": self.group.url() if self.group else None,
            "redis-sentinel-wait": self.group.url("wait_replicas=1") if self.group else None,
        }.get(impl)
        if backend:
            self.env["SOAK_BACKEND"] = backend
        else:
            self.env.pop("SOAK_LEASE_MS")  # RabbitMQ's backend refuses it: claim only
        self.procs: list[subprocess.Popen[bytes]] = []
        self.offsets: list[int] = []
        self.faulted: list[tuple[str, int]] = []  # kill-claim: the runs whose winner was killed
        self.faults = 0
        self.skipped = 0

    # -- processes ----------------------------------------------------------------------------

    def log(self, index: int) -> Path:
        return self.tmp / f"beat-{index}.log"

    def start(self, index: int) -> subprocess.Popen[bytes]:
        env = dict(self.env)
        if self.mode == "skew" and index == 0:
            env["SOAK_SKEW_MS"] = "60000"
        args = ["beat", "-l", "info", "--pidfile=", "-s", str(self.tmp / f"schedule-{index}")]
        if self.impl != "redbeat":
            args += ["-S", "soak_faults.Scheduler"]
        return start_celery(args, self.log(index), env, app="soak_app", cwd=HERE)

    def launch(self) -> None:
        self.worker = start_celery(
            ["worker", "--pool=prefork", "-c", "2", "-l", "info", "--without-mingle", "--without-gossip"],
            self.tmp / "worker.log",
            self.env,
            app="soak_app",
            cwd=HERE,
        )
        wait_for_line(self.tmp / "worker.log", "ready.", self.worker, 60)
        for index in range(self.args.instances):
            self.procs.append(self.start(index))
            self.offsets.append(0)
        ready = "beat: Starting..." if self.impl == "redbeat" else "anarchon: ready as"
        for index, proc in enumerate(self.procs):
            wait_for_line(self.log(index), ready, proc, 60)

    def restart_instance(self, index: int) -> None:
        self.offsets[index] = self.log(index).stat().st_size
        self.procs[index] = self.start(index)

    def target(self) -> int:
        if self.impl == "redbeat":  # the lock holder
            for index in range(len(self.procs)):
                if b"beat: Acquired lock" in self.log(index).read_bytes()[self.offsets[index] :]:
                    return index
        return random.randrange(len(self.procs))

    def text(self, index: int) -> str:
        return self.log(index).read_bytes()[self.offsets[index] :].decode(errors="replace")

    # -- faults -------------------------------------------------------------------------------

    def play(self, until: float) -> None:
        rolling = 0
        chaos = [fault for fault in CHAOS if fault in PLAYS[self.impl]]
        while time.monotonic() + self.args.every < until:
            time.sleep(self.args.every)
            mode = self.mode
            if mode in ("none", "skew"):
                return
            if mode == "chaos":
                mode = chaos[self.faults % len(chaos)]
            if mode == "kill-claim":
                self._exact("kill-claim")
            elif mode == "pause-send":
                self._exact("pause-send")
            elif mode == "kill":
                index = self.target()
                os.killpg(self.procs[index].pid, signal.SIGKILL)
                self.procs[index].wait()
                self.restart_instance(index)
            elif mode == "rolling":
                index = rolling % len(self.procs)
                rolling += 1
                self.procs[index].send_signal(signal.SIGTERM)
                self.procs[index].wait(60)
                self.restart_instance(index)
            elif mode == "cut":
                self._cut()
            elif mode == "restart":
                self._restart()
            elif mode == "outage":
                self._outage(self.args.outage_s)
            elif mode == "failover":
                master = self.group.master_port()
                self.group.server_on(master).kill()
                time.sleep(self.args.outage_s)
                self.group.server_on(master).start()  # the sentinels make it a replica
            self.faults += 1

    def _exact(self, fault: str) -> None:
        """Arm the fault in a random instance, and see it through: it happens at that instance's
        next win (given 10 s; a fault not played is counted as skipped)."""
        index = random.randrange(len(self.procs))
        proc = self.procs[index]
        trigger = self.faults_dir / f"{proc.pid}.{fault}"
        trigger.touch()
        deadline = time.monotonic() + 10
        needle = f"soak fault: {fault} "
        while needle not in self.text(index):
            if time.monotonic() > deadline:
                trigger.unlink(missing_ok=True)
                self.skipped += 1
                self.faults -= 1
                return
            time.sleep(0.05)
        line = self.text(index).split(needle, 1)[1].split("\n", 1)[0].split()
        self.faulted.append((line[0], int(line[1])))
        if fault == "kill-claim":
            proc.wait(30)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the process group, if anything is left
            self.restart_instance(index)
        else:
            time.sleep(self.args.lease_ms / 1000 + 2)
            os.kill(proc.pid, signal.SIGCONT)

    def _cut(self) -> None:
        if self.impl == "rabbitmq":
            rabbitmqctl("close_all_connections", "lease soak: cut")
        elif self.impl in ("redis", "redbeat"):
            self.redis.cli("client", "kill", "type", "normal")
        elif self.impl == "postgres":
            postgres_cut()

    def _restart(self) -> None:
        if self.impl == "rabbitmq":
            self._outage(2)
        elif self.impl in ("redis", "redbeat"):
            self.redis.restart()
        elif self.impl == "postgres":
            system_cluster("restart", "-m", "fast")

    def _outage(self, seconds: float) -> None:
        if self.impl == "rabbitmq":
            expire_gates(self.prefix, self.args.slot_ttl_ms)
            rabbitmqctl("stop_app")
            time.sleep(seconds)
            restart_broker()
        elif self.impl in ("redis", "redbeat"):
            self.redis.kill()
            time.sleep(seconds)
            self.redis.start()
        elif self.impl == "postgres":
            system_cluster("stop", "-m", "immediate")  # as a crash
            time.sleep(seconds)
            system_cluster("start")
        elif self.impl == "sqlite":
            db = sqlite3.connect(self.tmp / "anarchon.db", isolation_level=None)
            try:
                db.execute("BEGIN EXCLUSIVE")  # every claim and mark waits, 5 s at most, then fails
                time.sleep(seconds)
                db.execute("ROLLBACK")
            finally:
                db.close()

    # -- the end --------------------------------------------------------------------------------

    def finish(self) -> None:
        for proc in self.procs:
            stop(proc)
        deadline = time.monotonic() + 60
        while self._waiting() and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(2)
        stop(self.worker)

    def _waiting(self) -> int:
        from kombu import Connection

        try:
            with Connection(BROKER) as conn:
                return int(conn.default_channel.queue_declare(f"{self.prefix}tasks", passive=True).message_count)
        except Exception:  # noqa: BLE001 - no queue: nothing waits
            return 0

    def clean(self) -> None:
        for proc in [*self.procs, getattr(self, "worker", None)]:
            if proc is not None:
                stop(proc)
        delete_prefixed(self.prefix, BROKER)
        keys = f"{self.prefix}*"
        self.redis.cli("--scan", "--pattern", keys)  # (listed only: deleted below)
        subprocess.run(
            f"redis-cli -p {REDIS_PORT} --scan --pattern '{keys}' | xargs -r redis-cli -p {REDIS_PORT} del",
            shell=True,
            capture_output=True,
            check=False,
        )
        if self.impl == "postgres":
            postgres_clean(self.prefix)
        if self.group is not None:
            self.group.kill()
        if not self.args.keep_logs:
            shutil.rmtree(self.tmp, ignore_errors=True)


def count(line: Line, start: int, end: int) -> dict[str, Any]:
    args = line.args
    period_ms = round(args.period * 1000)
    runs = [json.loads(text) for text in line.executions.read_text().splitlines() if text.strip()]
    if runs:
        start = max(start, min(r["at_ms"] for r in runs) + period_ms)
    names = [f"job-{n:02d}" for n in range(args.jobs)]
    if line.impl == "redbeat":  # no slot on the message: a period-long bucket of execution time
        keyed = [((r["job"], r["at_ms"] // period_ms), r) for r in runs]
        expected = {(job, b) for job in names for b in range(-(-start // period_ms), end // period_ms)}
        late: list[int] = []
    else:
        keyed = [((r["job"], r["slot"]), r) for r in runs]
        first = -(-start // period_ms) * period_ms
        expected = {(job, slot) for job in names for slot in range(first, end, period_ms)}
        late = [r["at_ms"] - r["slot"] for key, r in keyed if key in expected]
    seen = Counter(key for key, _ in keyed)
    result: dict[str, Any] = {
        "impl": line.impl,
        "mode": line.mode,
        "faults": line.faults,
        "expected": len(expected),
        "executed": sum(1 for key in expected if seen[key]),
        "dup": sum(1 for key in expected if seen[key] > 1),
        "missed": sum(1 for key in expected if not seen[key]),
    }
    if late:
        result.update(
            early=sum(1 for ms in late if ms < 0),
            late_2s=sum(1 for ms in late if ms > 2000),
            p99_ms=round(percentile([float(ms) for ms in late], 99)),
            max_ms=max(late),
        )
    if line.faulted:
        faulted = {key for key in line.faulted if key in expected}
        lateness = [r["at_ms"] - r["slot"] for key, r in keyed if key in faulted]
        result["faulted_missed"] = sum(1 for key in faulted if not seen[key])
        result["faulted_late_ms"] = max(lateness) if lateness else None
    if line.skipped:
        result["faults_skipped"] = line.skipped
    return result


def run_line(impl: str, mode: str, args: argparse.Namespace, redis: OwnRedis) -> dict[str, Any]:
    line = Line(impl, mode, args, redis)
    try:
        line.launch()
        start = now_ms() + 3000
        until = time.monotonic() + 3 + args.duration
        line.play(until)
        time.sleep(max(0.0, until - time.monotonic()))
        end = now_ms() - args.tail_s * 1000
        line.finish()
        return count(line, start, end)
    finally:
        line.clean()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impls", default=",".join(IMPLS))
    parser.add_argument("--modes", default=",".join(DEFAULT_MODES), help=f"of {', '.join(MODES)}")
    parser.add_argument("--instances", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--period", type=float, default=2.0, help="seconds between a job's runs")
    parser.add_argument("--duration", type=float, default=300, help="seconds per line")
    parser.add_argument("--every", type=float, default=15, help="seconds between faults")
    parser.add_argument("--max-late-ms", type=int, default=10_000)
    parser.add_argument("--lease-ms", type=int, default=5_000)
    parser.add_argument("--slot-ttl-ms", type=int, default=60_000)
    parser.add_argument("--tail-s", type=int, default=5, help="runs of the last seconds are not counted")
    parser.add_argument("--outage-s", type=float, default=3.0, help="how long an outage or failover fault lasts")
    parser.add_argument("--keep-logs", action="store_true")
    args = parser.parse_args(argv)
    gates = args.jobs * args.slot_ttl_ms / 1000 / args.period
    if "rabbitmq" in args.impls.split(",") and gates > MAX_GATES:
        # Each live gate holds a file while RabbitMQ recovers it after a restart: past its open-file
        # limit (about 927 here) a restarted node hangs in its recovery.
        parser.error(
            f"the RabbitMQ line would keep about {gates:.0f} gates alive (--jobs x --slot-ttl-ms / --period), "
            f"more than {MAX_GATES}: lower --slot-ttl-ms (it must stay above lead, jitter and --max-late-ms: "
            "about 21000 with the defaults) or --jobs"
        )
    folder = Path(tempfile.mkdtemp(prefix="anarchon-lease-soak-redis-"))
    redis = OwnRedis(folder)
    results = []
    try:
        for mode in args.modes.split(","):
            for impl in args.impls.split(","):
                if mode not in PLAYS[impl]:
                    continue
                result = run_line(impl, mode, args, redis)
                print(json.dumps(result), flush=True)
                results.append(result)
    finally:
        redis.stop()
        shutil.rmtree(folder, ignore_errors=True)
    headers = list(dict.fromkeys(key for row in results for key in row))
    cells = [[str(row.get(h, "-")) for h in headers] for row in results]
    widths = [max(len(x) for x in col) for col in zip(headers, *cells)]
    for row in [headers, *cells]:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
