"""Cluster soak: the soak benchmark's line on a 3-node RabbitMQ cluster whose nodes fail, with a
single node beside it, in the same run.

    python3 benchmarks/cluster_soak.py                         # kill and rolling, on 3.10 and 4
    python3 benchmarks/cluster_soak.py --versions 3.10 --modes kill --duration 60

For each version and mode, two lines run one after the other, each on brokers of its own:

* ``cluster``: a 3-node cluster (``scripts/rabbitmq-cluster``); 3 ``celery beat -S
  anarchon_celery.Scheduler`` instances, instance i given the nodes' URLs starting at node i;
* ``single``: one node of the same version (its own ports and data); 3 instances on it.

20 jobs every 2 s (the soak's line), with the product's defaults otherwise (``max_late_ms`` 60 s,
``lead_ms`` 10 s, or ``--lead-ms``), except history: off by default (``--history-size``). History
streams are replicated to every node, and on RabbitMQ 3.10 a node killed every 30 s sent the stream
coordinator into a loop of replica restarts (thousands of errors in a few minutes, about half a
core per node, and a node's start slowed from 20 s to 80 s): that is the broker's streams, not the
claims, which is what this measures. The task queue is a quorum queue, so that on the cluster it outlives a node;
a raw consumer counts the task messages per (job, slot), as the soak benchmark does.

Faults: ``kill`` SIGKILLs a node every ``--every`` seconds (nodes 1, 2, 3 in turn) and starts it
again ``--down`` seconds later; ``rolling`` stops each node cleanly and starts it again, one at a
time, round after round (``--down`` seconds between two nodes). On the single node, the same
faults hit its only node.

Reported per line: runs expected, executed, duplicated, missed; the missed runs whose gate lived
on a node that was down during the run's window (slot to slot + max_late_ms), and the others;
lateness of the runs sent (from the slot to the task message); and, for every instance whose
claims' node went down, the seconds until it claimed again from another node (its "claims moved"
line), with the count of instances that never did.

Gates older than two minutes are deleted before each fault (every claim of theirs is past its
deadline), so that a restarting node recovers few; their homes are read first, to tell where the
gates of missed runs lived.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import amqp
from common import HERE, Tally, now_ms, percentile, start_celery, stop, wait_for_line

ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "scripts"))

from rabbitnodes import STATE, Node, stop_nodes, version  # noqa: E402

CLUSTER = str(ROOT / "scripts" / "rabbitmq-cluster")
JOBS, PERIOD_S, MAX_LATE_MS = 20, 2.0, 60_000
_LINE_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): ")
_MOVED = re.compile(r"claims (?:on RabbitMQ at (\S+)|moved from RabbitMQ at (\S+) to (\S+))")
_PORT = re.compile(r":(\d+)/")
_HOME = re.compile(r"<([^.<>]+@[^.<>]+)\.")
_RUN = re.compile(r"job '(job-\d+)' slot (\d+):")


def say(text: str) -> None:
    print(f"cluster_soak: {text}", file=sys.stderr, flush=True)


# -- brokers --------------------------------------------------------------------------------------


class Cluster:
    """The 3-node cluster of scripts/rabbitmq-cluster."""

    def __init__(self, name: str) -> None:
        self.version = name
        self.urls = self._run("start", timeout=600).split(";")
        self.nodes = [f"anarchon-{'a' if name == '3.10' else 'b'}{n}@localhost" for n in (1, 2, 3)]

    def _run(self, *args: str, timeout: float = 300) -> str:
        done = subprocess.run(
            [CLUSTER, "--version", self.version, *args],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"rabbitmq-cluster {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout.strip()

    def kill(self, n: int) -> None:
        self._run("kill", str(n))

    def stop_node(self, n: int) -> None:
        self._run("stop-node", str(n))

    def start_node(self, n: int) -> None:
        self._run("start-node", str(n))

    def list_queues(self, alive: int) -> str:
        return self._run("ctl", str(alive), "list_queues", "-q", "--no-table-headers", "name", "pid", timeout=120)

    def close(self) -> None:
        self._run("stop", timeout=300)


class Single:
    """One node of the same version, on ports and a data folder of its own."""

    def __init__(self, name: str) -> None:
        self.version = name
        v = version(name)
        if v.root is None:
            v = dataclasses.replace(v, epmd_port=4373)
            node = Node(v, "anarchon-s3", 5721, str(STATE / "single-3.10"), cookie="anarchon-single-s3")
        else:
            v = dataclasses.replace(v, epmd_port=4374)
            node = Node(v, "anarchon-s4", 5722, "/var/lib/anarchon/single-soak", cookie="anarchon-single-s4")
        self.node = node
        v.ensure_installed()
        if node.answers():
            stop_nodes([node])
        shutil.rmtree(node.folder(), ignore_errors=True)
        node.write_config(f"listeners.tcp.1 = 127.0.0.1:{node.amqp_port}\nlog.file.level = info\n")
        node.start()
        self.urls = [node.url]
        self.nodes = [node.node]

    def kill(self, n: int) -> None:
        self.node.kill()

    def stop_node(self, n: int) -> None:
        self.node.stop()

    def start_node(self, n: int) -> None:
        self.node.start()

    def list_queues(self, alive: int) -> str:
        return self.node.ctl("list_queues", "-q", "--no-table-headers", "name", "pid").stdout

    def close(self) -> None:
        stop_nodes([self.node])


# -- one line -------------------------------------------------------------------------------------


@dataclasses.dataclass
class Fault:
    node: int  # 1-based
    down_ms: int
    up_ms: int | None = None


class Line:
    """One line (cluster or single) of one mode: its brokers, instances, faults and counts."""

    def __init__(self, kind: str, broker: Cluster | Single, mode: str, args: argparse.Namespace) -> None:
        self.kind, self.broker, self.mode, self.args = kind, broker, mode, args
        self.prefix = f"csoak-{uuid.uuid4().hex[:8]}."
        self.tmp = Path(tempfile.mkdtemp(prefix=f"anarchon-cluster-soak-{kind}-"))
        self.faults: list[Fault] = []
        self.homes: dict[str, str] = {}  # gate: the node it lived on
        self.result: dict[str, Any] = {}
        self.error: BaseException | None = None

    def env(self, index: int) -> dict[str, str]:
        urls = self.broker.urls
        rotated = urls[index % len(urls) :] + urls[: index % len(urls)]
        return dict(
            os.environ,
            SOAK_PREFIX=self.prefix,
            SOAK_IMPL="anarchon",
            SOAK_JOBS=str(JOBS),
            SOAK_PERIOD=str(PERIOD_S),
            SOAK_BROKER=";".join(rotated),
            SOAK_MAX_LATE_MS=str(MAX_LATE_MS),
            SOAK_SLOT_TTL_MS="300000",
            SOAK_QUORUM="1",
            SOAK_LEAD_MS=str(self.args.lead_ms),
            SOAK_HISTORY_SIZE=str(self.args.history_size),
            PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),
        )

    def log(self, index: int) -> Path:
        return self.tmp / f"beat-{index}.log"

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # noqa: BLE001 - reported by the caller, after the other line
            self.error = exc

    def _run(self) -> None:
        # A quorum task queue: on the cluster it outlives a node.
        tally = Tally(f"{self.prefix}tasks", ";".join(self.broker.urls), {"x-queue-type": "quorum"})
        tally.start()
        if not tally.ready.wait(180):  # a quorum queue on a cluster just formed can take a while
            raise RuntimeError(f"{self.kind}: the task queue's consumer did not start ({tally.error!r})")
        procs = []
        try:
            for index in range(self.args.instances):
                args = ["beat", "-l", "info", "--pidfile=", "-s", str(self.tmp / f"schedule-{index}")]
                procs.append(start_celery(args, self.log(index), self.env(index), app="soak_app", cwd=HERE))
            for index, proc in enumerate(procs):
                wait_for_line(self.log(index), "anarchon: ready as", proc, 90)
            start = now_ms() + 3000
            until = time.monotonic() + 3 + self.args.duration
            self._play(until)
            time.sleep(max(0.0, until - time.monotonic()))
            end = now_ms()
        finally:
            for proc in procs:
                stop(proc)
            tally.stop()
        self._read_homes()
        self.result = self._count(tally.arrivals, start, end - self.args.tail_s * 1000)

    def _play(self, until: float) -> None:
        """The faults, until the monotonic time ``until``: kills every ``--every`` seconds (the
        next one at once when a restart took longer), or one clean restart after another."""
        size = len(self.broker.nodes)
        turn = 0
        next_at = time.monotonic() + (self.args.every if self.mode == "kill" else self.args.down)
        while True:
            if next_at + self.args.down >= until:
                return
            time.sleep(max(0.0, next_at - time.monotonic()))
            next_at += self.args.every if self.mode == "kill" else 0
            node = turn % size + 1
            turn += 1
            self._read_homes()
            fault = Fault(node, now_ms())
            self.faults.append(fault)
            if self.mode == "kill":
                self.broker.kill(node)
                say(f"{self.kind} {self.broker.version}: killed node {node}")
                time.sleep(self.args.down)
            else:
                self.broker.stop_node(node)
                say(f"{self.kind} {self.broker.version}: stopped node {node}")
            self.broker.start_node(node)
            fault.up_ms = now_ms()
            say(
                f"{self.kind} {self.broker.version}: node {node} back after {(fault.up_ms - fault.down_ms) / 1000:.1f}s"
            )
            if self.mode != "kill":
                next_at = max(next_at, time.monotonic() + self.args.down)

    def _read_homes(self) -> None:
        """Note the node of every gate of ours, then delete those of runs long past their deadline."""
        down = {f.node for f in self.faults if f.up_ms is None}
        alive = next(n for n in range(1, len(self.broker.nodes) + 1) if n not in down)
        try:
            listing = self.broker.list_queues(alive)
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - a listing missed now is taken at the next fault
            say(f"{self.kind}: could not list the queues ({exc})")
            return
        old = now_ms() - 120_000
        stale = []
        for line in listing.splitlines():
            parts = line.split()
            if len(parts) < 2 or not parts[0].startswith(self.prefix) or ".slot." not in parts[0]:
                continue
            home = _HOME.search(parts[1])
            if home:
                self.homes[parts[0]] = home.group(1)
            if int(parts[0].rsplit(".", 1)[1]) < old:
                stale.append(parts[0])
        self._delete(stale, alive)

    def _delete(self, names: list[str], alive: int) -> None:
        if not names:
            return
        url = self.broker.urls[alive - 1]
        port = int(_PORT.search(url).group(1))  # type: ignore[union-attr]
        conn = amqp.Connection(
            f"127.0.0.1:{port}", userid="guest", password="guest", connect_timeout=10, read_timeout=30, write_timeout=30
        )
        try:
            conn.connect()
            channel = conn.channel()
            for name in names:
                channel.queue_delete(name)
        except Exception as exc:  # noqa: BLE001 - left for the next fault, or for the cluster's stop
            say(f"{self.kind}: could not delete old gates ({exc})")
        finally:
            try:
                conn.close()
            except Exception:  # noqa: BLE001
                pass

    def _count(self, arrivals: list[dict[str, Any]], start: int, end: int) -> dict[str, Any]:
        period_ms = round(PERIOD_S * 1000)
        if arrivals:  # from the first run sent on: a slow start is not a fault's effect
            start = max(start, min(a["at_ms"] for a in arrivals) + period_ms)
        names = [f"job-{n:02d}" for n in range(JOBS)]
        first = -(-start // period_ms) * period_ms
        expected = {(job, slot) for job in names for slot in range(first, end, period_ms)}
        seen = Counter((a["job"], a["slot"]) for a in arrivals)
        firsts: dict[tuple[str, int], int] = {}
        for a in arrivals:
            key = (a["job"], a["slot"])
            firsts[key] = min(firsts.get(key, a["at_ms"]), a["at_ms"])
        executed = {k for k in expected if seen[k]}
        missed = sorted(expected - executed)
        lateness = [(firsts[k] - k[1]) / 1000 for k in executed]
        on_downed = 0
        for job, slot in missed:
            home = self.homes.get(f"{self.prefix}{job}.slot.{slot}")
            windows = [f for f in self.faults if f.down_ms <= slot + MAX_LATE_MS and (f.up_ms or end) >= slot]
            if home is not None and any(self.broker.nodes[f.node - 1] == home for f in windows):
                on_downed += 1
        moves = self._moves() if len(self.broker.nodes) > 1 else {"delays": [], "never": None}
        return {
            "line": self.kind,
            "version": self.broker.version,
            "mode": self.mode,
            "lead_ms": self.args.lead_ms,
            "faults": len(self.faults),
            "expected": len(expected),
            "executed": len(executed),
            "duplicates": sum(1 for k, n in seen.items() if n > 1 and k in expected),
            "missed": len(missed),
            "missed_gate_on_downed_node": on_downed,
            "missed_other": len(missed) - on_downed,
            "late_p50_s": round(percentile(lateness, 50), 3) if lateness else None,
            "late_max_s": round(max(lateness), 3) if lateness else None,
            "late_over_2s": sum(1 for late in lateness if late > 2),
            "moves": len(moves["delays"]),
            "move_max_s": round(max(moves["delays"]), 2) if moves["delays"] else None,
            "never_moved": moves["never"],
            **self._causes(missed),
        }

    def _causes(self, missed: list[tuple[str, int]]) -> dict[str, Any]:
        """Why each missed run was missed, from what the beats logged about it: the answer to
        its claim was lost with its connection (the claim may have filled the gate: never
        claimed again, by the seed's rule), its task was written but not confirmed (never sent
        twice), its gate was gone when claimed (a node that lost it in a crash; never declared
        again, since a gate gone may have held a win), or nothing that says (``other``)."""
        said: dict[tuple[str, int], list[str]] = {}
        for index in range(self.args.instances):
            for line in self.log(index).read_text(errors="replace").splitlines():
                found = _RUN.search(line)
                if found:
                    said.setdefault((found.group(1), int(found.group(2))), []).append(line)
        causes: Counter[str] = Counter()
        runs = []
        for job, slot in missed:
            lines = said.get((job, slot), [])
            if any("won, but sending task" in line for line in lines):
                cause = "task_unconfirmed"
            elif any("no answer to the claim" in line for line in lines):
                cause = "claim_answer_lost"
            elif any("returned as unroutable" in line for line in lines):
                cause = "gate_vanished"
            else:
                cause = "other"
            causes[cause] += 1
            runs.append(f"{job}@{slot} on {self.homes.get(f'{self.prefix}{job}.slot.{slot}', '?')}: {cause}")
        return {"missed_causes": dict(causes), "missed_runs": runs[:20]}

    def _moves(self) -> dict[str, Any]:
        """For each fault, each instance whose claims were on the downed node then: the seconds
        until its line saying its claims moved to another node."""
        ports = [int(_PORT.search(url).group(1)) for url in self.broker.urls]  # type: ignore[union-attr]
        delays: list[float] = []
        never = 0
        for index in range(self.args.instances):
            events = []  # (ms, port now)
            for line in self.log(index).read_text(errors="replace").splitlines():
                stamp, moved = _LINE_TIME.search(line), _MOVED.search(line)
                if not stamp or not moved:
                    continue
                at = round(datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() * 1000)
                to = moved.group(1) or moved.group(3)
                events.append((at, int(_PORT.search(to).group(1))))  # type: ignore[union-attr]
            for fault in self.faults:
                before = [port for at, port in events if at <= fault.down_ms]
                if not before or before[-1] != ports[fault.node - 1]:
                    continue  # its claims were elsewhere
                after = [at for at, _ in events if at > fault.down_ms]
                if after:
                    delays.append((after[0] - fault.down_ms) / 1000)
                else:
                    never += 1
        return {"delays": delays, "never": never}

    def clean(self) -> None:
        if not self.args.keep_logs:
            shutil.rmtree(self.tmp, ignore_errors=True)


def one_version(name: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    results = []
    for mode in args.modes.split(","):
        say(f"RabbitMQ {name}, {mode}: starting a 3-node cluster and a single node")
        cluster = Cluster(name)
        single = Single(name) if not args.no_single else None
        try:
            lines = [Line("cluster", cluster, mode, args)]
            if single is not None:
                lines.append(Line("single", single, mode, args))
            for line in lines:  # one after the other: two at once starve each other's nodes here
                line.run()
            for line in lines:
                if line.error is not None:
                    raise RuntimeError(f"{line.kind} line failed (logs in {line.tmp})") from line.error
                print(json.dumps(line.result), flush=True)
                results.append(line.result)
                line.clean()
        finally:
            cluster.close()
            if single is not None:
                single.close()
    return results


def table(results: list[dict[str, Any]]) -> str:
    headers = ["version", "mode", "line", "faults", "expected", "executed", "dup", "missed", "on downed node",
               "late p50 s", "late max s", "late > 2 s", "moved", "move max s", "never moved"]  # fmt: skip
    keys = ["version", "mode", "line", "faults", "expected", "executed", "duplicates", "missed",
            "missed_gate_on_downed_node", "late_p50_s", "late_max_s", "late_over_2s", "moves", "move_max_s",
            "never_moved"]  # fmt: skip
    rows = [[str(r.get(k, "-")) for k in keys] for r in results]
    widths = [max(len(x) for x in col) for col in zip(headers, *rows)]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in [headers, *rows])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--versions", default="3.10,4", help="comma-separated: 3.10, 4")
    parser.add_argument("--modes", default="kill,rolling", help="comma-separated: kill, rolling")
    parser.add_argument("--instances", type=int, default=3)
    parser.add_argument("--duration", type=float, default=300, help="seconds per (version, mode)")
    parser.add_argument("--every", type=float, default=30, help="kill: seconds between two kills")
    parser.add_argument("--down", type=float, default=10, help="kill: seconds a node stays down; rolling: pause")
    parser.add_argument("--tail-s", type=int, default=5, help="runs of the last seconds are not counted")
    parser.add_argument("--no-single", action="store_true", help="the cluster only")
    parser.add_argument("--lead-ms", type=int, default=10_000, help="anarchon_lead_ms (10 s: the default)")
    parser.add_argument("--history-size", type=int, default=0, help="anarchon_history_size (0: no history streams)")
    parser.add_argument("--keep-logs", action="store_true")
    args = parser.parse_args(argv)
    results = []
    for name in args.versions.split(","):
        results += one_version(name, args)
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
