"""Soak benchmark: several scheduler instances, many second-level jobs, a fault every few seconds.

    python benchmarks/soak.py                                   # every mode, ours and the baselines
    python benchmarks/soak.py --modes kill --duration 60 --impls anarchon,redbeat

For each fault mode (none, kill, cut, restart, pause) it runs:

* ``anarchon``: N ``celery beat -S anarchon_celery.Scheduler`` instances;
* ``redbeat``: two RedBeat instances (celery-redbeat, Redis on localhost, beat_max_loop_interval=5),
  the fault aimed at RedBeat's lock holder;
* ``beat``: two plain ``celery beat`` processes (mode ``none`` only: they need no fault to fail).

A raw consumer on the task queue logs every task message by task id as it arrives. Our runs are
counted per (job, slot) from the ``anarchon_slot`` header; the baselines carry no slot, so theirs
are counted per job and period-long time bucket. It prints one JSON line per run and a table.

Faults, every ``--every`` seconds: ``kill`` SIGKILLs an instance and starts it again; ``cut`` closes
every broker connection (``rabbitmqctl close_all_connections``); ``restart`` stops and starts the
broker application (``rabbitmqctl stop_app`` / ``start_app``); ``pause`` SIGSTOPs an instance for
longer than ``max_late_ms``, then SIGCONTs it. A run missed because the killed instance had
claimed it and not yet sent it is counted apart (``lost_with_killed``), from its gate's claim (in
that mode the gates live longer than the line, so that they can be read at its end; in the others
they live ``--slot-ttl-ms``, 25 s by default). A broker restart recovers every live gate, and
RabbitMQ 3.10 holds files open for each while it does: with the 1,024 open files of Debian's
package, restarts recovering 1,161 and 1,265 gates hung its start here (see the README's
footprint section). RabbitMQ also starts each recovered gate's ``x-expires`` again, so in restart
mode the gates older than ``--slot-ttl-ms`` are deleted before each restart, as they would have
expired: without that, they would pile up.

Runs are counted from one period after the first task message of the line, so a scheduler's slow
start is not counted as a fault's misses, and the last ``--tail-s`` seconds are not counted.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from common import BROKER, HERE, Tally, delete_prefixed, now_ms, queue_names, start_celery, stop, wait_for_line

MODES = ("restart", "none", "kill", "cut", "pause")  # restart first: the one that can upset the broker
READY = {"anarchon": "anarchon: ready as", "beat": "beat: Starting...", "redbeat": "beat: Starting..."}


def rabbitmqctl(*args: str, timeout: float = 120) -> bool:
    try:
        done = subprocess.run(["rabbitmqctl", *args], capture_output=True, stdin=subprocess.DEVNULL, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


def restart_broker() -> bool:
    """Start the broker application again; if it will not start, restart the whole node, and if
    the node will not stop, kill it (RabbitMQ recovers its durable queues at the next boot).
    Returns False when the node had to be restarted. Never leaves the broker down silently."""
    if rabbitmqctl("start_app", timeout=90) and rabbitmqctl("await_startup", timeout=90):
        return True
    print("soak: RabbitMQ's application did not start again; restarting the node", file=sys.stderr, flush=True)
    if not rabbitmqctl("stop", timeout=60):
        pid = node_pid()
        print(f"soak: the node did not stop; killing it (pid {pid})", file=sys.stderr, flush=True)
        if pid is None:
            raise RuntimeError("RabbitMQ's node neither stops nor tells its pid: stop it by hand")
        os.kill(pid, signal.SIGKILL)
        time.sleep(2)
    subprocess.run(["rabbitmq-server", "-detached"], capture_output=True, stdin=subprocess.DEVNULL, check=False)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:  # await_startup fails at once until the node answers
        if rabbitmqctl("await_startup", timeout=30):
            return False
        time.sleep(3)
    raise RuntimeError("RabbitMQ did not come back after the restart fault: start it by hand")


def expire_gates(prefix: str, slot_ttl_ms: int) -> int:
    """Delete the gates of ``prefix`` whose slot is more than ``slot_ttl_ms`` old, as their
    ``x-expires`` would have. RabbitMQ starts that timer again when it recovers a queue, so with a
    restart every 15 s and a longer ``slot_ttl_ms`` no gate would ever expire, and the thousands
    piling up would hang RabbitMQ 3.10's recovery on its open-file limit. Every claim of those
    runs is past its deadline (max_late_ms is shorter than slot_ttl_ms): nothing is decided by them."""
    import amqp

    oldest = now_ms() - slot_ttl_ms
    stale = [name for name in queue_names(prefix) if ".slot." in name and int(name.rsplit(".", 1)[1]) < oldest]
    conn = amqp.Connection("127.0.0.1:5672", userid="guest", password="guest", connect_timeout=10)
    conn.connect()
    try:
        channel = conn.channel()
        for name in stale:
            channel.queue_delete(name)
    finally:
        conn.close()
    return len(stale)


def node_pid() -> int | None:
    """The operating-system pid of the local RabbitMQ node (it answers this even while its
    application hangs starting)."""
    try:
        command = ["rabbitmqctl", "eval", "os:getpid()."]
        done = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=30)
    except subprocess.TimeoutExpired:
        return None
    digits = done.stdout.strip().strip('"')
    return int(digits) if done.returncode == 0 and digits.isdigit() else None


class Fleet:
    """The scheduler instances of one run, and the faults played on them."""

    def __init__(self, impl: str, count: int, env: dict[str, str], tmp: Path) -> None:
        self.impl, self.env, self.tmp = impl, env, tmp
        self.prefix, self.slot_ttl_ms = env["SOAK_PREFIX"], int(env["SOAK_SLOT_TTL_MS"])
        self.procs: list[subprocess.Popen[bytes]] = []
        self.started_at: list[int] = []  # log offsets, to read only the current process's lines
        self.killed_pids: set[int] = set()
        for index in range(count):
            self.procs.append(self._start(index))
            self.started_at.append(0)

    def log(self, index: int) -> Path:
        return self.tmp / f"{self.impl}-{index}.log"

    def _start(self, index: int) -> subprocess.Popen[bytes]:
        args = ["beat", "-l", "info", "--pidfile=", "-s", str(self.tmp / f"schedule-{index}")]
        return start_celery(args, self.log(index), self.env, app="soak_app", cwd=HERE)

    def wait_ready(self) -> None:
        for index, proc in enumerate(self.procs):
            wait_for_line(self.log(index), READY[self.impl], proc, 60)

    def target(self) -> int:
        """The instance a fault is aimed at: RedBeat's lock holder, else any."""
        if self.impl == "redbeat":
            for index in range(len(self.procs)):
                text = self.log(index).read_bytes()[self.started_at[index] :]
                if b"beat: Acquired lock" in text:
                    return index
        return random.randrange(len(self.procs))

    def kill(self) -> str:
        index = self.target()
        proc = self.procs[index]
        self.killed_pids.add(proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        self.started_at[index] = self.log(index).stat().st_size
        self.procs[index] = self._start(index)
        return f"killed {self.impl}-{index} (pid {proc.pid})"

    def pause(self, seconds: float) -> str:
        index = self.target()
        proc = self.procs[index]
        os.killpg(proc.pid, signal.SIGSTOP)
        time.sleep(seconds)
        os.killpg(proc.pid, signal.SIGCONT)
        return f"paused {self.impl}-{index} for {seconds:.0f}s"

    def stop(self) -> None:
        for proc in self.procs:
            stop(proc)


def play(mode: str, fleet: Fleet, every: float, until: float, pause_s: float, log: list[dict[str, Any]]) -> None:
    """The fault schedule: one fault every `every` seconds until the monotonic time `until`."""
    while time.monotonic() + every < until:
        time.sleep(every)
        at = now_ms()
        if mode == "kill":
            what = fleet.kill()
        elif mode == "pause":
            what = fleet.pause(pause_s)
        elif mode == "cut":
            rabbitmqctl("close_all_connections", "soak benchmark: cut")
            what = "closed every connection"
        elif mode == "restart":
            expire_gates(fleet.prefix, fleet.slot_ttl_ms)
            rabbitmqctl("stop_app")
            time.sleep(2)
            what = "broker restarted" if restart_broker() else "broker restarted, the node had to be restarted"
        else:
            return
        log.append({"at_ms": at, "back_ms": now_ms(), "fault": what})


def count(impl: str, arrivals: list[dict[str, Any]], jobs: int, period_ms: int, start: int, end: int) -> dict[str, Any]:
    """Runs expected in [start, end), executed, duplicated and missed."""
    names = [f"job-{n:02d}" for n in range(jobs)]
    if impl == "anarchon":
        key = [(a["job"], a["slot"]) for a in arrivals]
        first = -(-start // period_ms) * period_ms
        expected = {(job, slot) for job in names for slot in range(first, end, period_ms)}
    else:  # no slot on the message: one period-long bucket of arrival time is one run
        key = [(a["job"], a["at_ms"] // period_ms) for a in arrivals]
        expected = {(job, b) for job in names for b in range(-(-start // period_ms), end // period_ms)}
    seen = Counter(key)
    executed = {k for k in expected if seen[k]}
    return {
        "expected": len(expected),
        "executed": len(executed),
        "duplicates": sum(1 for k, n in seen.items() if n > 1 and k in expected),
        "missed": sorted(expected - executed),
    }


def claimed_by(prefix: str, missed: list[tuple[str, int]]) -> dict[tuple[str, int], int | None]:
    """For missed runs of ours: the pid of the instance that holds each one's gate, if any.

    Read only once every claim's deadline is long past, so reading a gate cannot let anyone in.
    """
    from kombu import Connection

    from anarchon_celery.backends.rabbitmq import gate_name

    holders: dict[tuple[str, int], int | None] = {}
    with Connection(BROKER) as conn:
        for job, slot in missed:
            channel = conn.channel()
            try:
                message = channel.basic_get(gate_name(prefix, job, slot), no_ack=False)
                holders[(job, slot)] = int(json.loads(message.body)["instance"].rsplit(":", 1)[1]) if message else None
            except Exception:  # noqa: BLE001 - no gate: nobody claimed it
                holders[(job, slot)] = None
            finally:
                try:
                    channel.close()
                except Exception:  # noqa: BLE001 - a channel closed by a 404 is gone already
                    pass
    return holders


def soak(impl: str, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    prefix = f"soak-{uuid.uuid4().hex[:8]}."
    tmp = Path(tempfile.mkdtemp(prefix="anarchon-soak-"))
    count_instances = args.instances if impl == "anarchon" else 2
    env = dict(
        os.environ,
        SOAK_PREFIX=prefix,
        SOAK_IMPL=impl,
        SOAK_JOBS=str(args.jobs),
        SOAK_PERIOD=str(args.period),
        SOAK_BROKER=BROKER,
        SOAK_MAX_LATE_MS=str(args.max_late_ms),
        SOAK_SLOT_TTL_MS=str(round((args.duration + 180) * 1000) if mode == "kill" else args.slot_ttl_ms),
        PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),
    )
    tally = Tally(f"{prefix}tasks")
    tally.start()
    tally.ready.wait(30)
    faults: list[dict[str, Any]] = []
    fleet = Fleet(impl, count_instances, env, tmp)
    try:
        fleet.wait_ready()
        start = now_ms() + 3000
        until = time.monotonic() + 3 + args.duration
        play(mode, fleet, args.every, until, (args.max_late_ms + 2000) / 1000, faults)
        time.sleep(max(0.0, until - time.monotonic()))
        end = now_ms()
        fleet.stop()
        time.sleep(2)
    finally:
        fleet.stop()
        tally.stop()
    period_ms = round(args.period * 1000)
    if tally.arrivals:  # count from the first run sent on: a slow start is not a fault's effect
        start = max(start, min(a["at_ms"] for a in tally.arrivals) + period_ms)
    counted = count(impl, tally.arrivals, args.jobs, period_ms, start, end - args.tail_s * 1000)
    result: dict[str, Any] = {
        "impl": impl,
        "mode": mode,
        "instances": count_instances,
        "jobs": args.jobs,
        "period_s": args.period,
        "duration_s": round((end - start) / 1000),
        "faults": len(faults),
        **{k: v for k, v in counted.items() if k != "missed"},
        "missed": len(counted["missed"]),
    }
    if impl == "anarchon" and mode == "kill":
        holders = claimed_by(prefix, counted["missed"])
        result["lost_with_killed"] = sum(1 for pid in holders.values() if pid in fleet.killed_pids)
        result["missed_other"] = result["missed"] - result["lost_with_killed"]
    if mode == "restart":  # seconds from the broker's return to the first task after it
        waits = []
        for fault in faults:
            after = [a["at_ms"] for a in tally.arrivals if a["at_ms"] >= fault["back_ms"]]
            waits.append((min(after) - fault["back_ms"]) / 1000 if after else None)
        result["recovery_s_max"] = max((w for w in waits if w is not None), default=None)
        result["recoveries"] = waits
        result["node_restarts"] = sum("node had to be restarted" in fault["fault"] for fault in faults)
    delete_prefixed(prefix, BROKER)
    if impl == "redbeat":
        import redis

        client = redis.Redis.from_url(os.environ.get("SOAK_REDIS", "redis://127.0.0.1:6379/0"))
        for key in client.scan_iter(f"{prefix}*"):
            client.delete(key)
    if not args.keep_logs:
        for path in tmp.iterdir():
            path.unlink()
        tmp.rmdir()
    return result


def table(results: list[dict[str, Any]]) -> str:
    headers = [
        "impl",
        "mode",
        "inst",
        "faults",
        "expected",
        "executed",
        "dup",
        "missed",
        "lost w/ killed",
        "recovery s",
    ]
    rows = [
        [
            r["impl"],
            r["mode"],
            r["instances"],
            r["faults"],
            r["expected"],
            r["executed"],
            r["duplicates"],
            r["missed"],
            r.get("lost_with_killed", "-"),
            r.get("recovery_s_max", "-"),
        ]
        for r in results
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    return "\n".join("  ".join(str(v).ljust(w) for v, w in zip(row, widths)) for row in [headers, *rows])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated fault modes")
    parser.add_argument("--impls", default="anarchon,redbeat,beat", help="anarchon, redbeat, beat")
    parser.add_argument("--instances", type=int, default=3, help="anarchon instances (baselines run 2)")
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--period", type=float, default=2.0, help="seconds between a job's runs")
    parser.add_argument("--duration", type=float, default=300, help="seconds per (impl, mode)")
    parser.add_argument("--every", type=float, default=15, help="seconds between faults")
    parser.add_argument("--max-late-ms", type=int, default=10_000)
    parser.add_argument("--slot-ttl-ms", type=int, default=25_000, help="gates' lifetime, except in kill mode")
    parser.add_argument("--tail-s", type=int, default=5, help="runs of the last seconds are not counted")
    parser.add_argument("--keep-logs", action="store_true")
    args = parser.parse_args(argv)
    results = []
    for mode in args.modes.split(","):
        for impl in args.impls.split(","):
            if impl == "beat" and mode != "none":
                continue  # two plain beats duplicate everything already
            result = soak(impl, mode, args)
            print(json.dumps(result), flush=True)
            results.append(result)
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
