"""What the benchmarks share: the broker, percentiles, the table and the JSON line."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the repository's root: the tests' helpers start the processes

from tests.support.processes import delete_prefixed, queue_names, start_celery, stop, wait_for_line  # noqa: E402

__all__ = [
    "BROKER",
    "HERE",
    "delete_prefixed",
    "now_ms",
    "percentile",
    "queue_names",
    "report",
    "start_celery",
    "stop",
    "wait_for_line",
]

BROKER = os.environ.get("BENCH_BROKER", os.environ.get("SOAK_BROKER", "amqp://guest:guest@127.0.0.1:5672//"))


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Tally(threading.Thread):
    """The raw consumer: every task message published to the queue, with its arrival time."""

    def __init__(self, queue: str, broker: str = BROKER, queue_arguments: dict[str, Any] | None = None) -> None:
        super().__init__(daemon=True)
        self.queue = queue
        self.broker = broker  # several nodes joined by ';': the consumer moves when its node goes
        self.queue_arguments = queue_arguments
        self.arrivals: list[dict[str, Any]] = []
        self._seen: set[str] = set()
        self._halt = threading.Event()
        self.ready = threading.Event()
        self.error: BaseException | None = None  # the last failure to consume, for a report

    def run(self) -> None:
        from kombu import Connection, Consumer, Exchange, Queue

        queue = Queue(self.queue, Exchange(self.queue), self.queue, durable=True, queue_arguments=self.queue_arguments)
        while not self._halt.is_set():
            try:
                with Connection(self.broker, connect_timeout=2) as conn:
                    conn.ensure_connection(max_retries=len(self.broker.split(";")))
                    with Consumer(conn, queues=[queue], callbacks=[self._on_message], accept=["json"]):
                        self.ready.set()
                        while not self._halt.is_set():
                            try:
                                conn.drain_events(timeout=0.5)
                            except TimeoutError:
                                pass
            except Exception as exc:  # noqa: BLE001 - a cut or a broker restart: connect again
                self.error = exc
                time.sleep(0.5)

    def _on_message(self, body: Any, message: Any) -> None:
        task_id = message.headers.get("id")
        # A redelivery (after a cut) is a message seen already, not a run; every other delivery
        # is a message published, even with a task id seen before: that is a run sent twice.
        if not (message.delivery_info.get("redelivered") and task_id in self._seen):
            self._seen.add(task_id)
            job = body[0][0] if isinstance(body, list) and body and body[0] else None
            headers = message.headers
            self.arrivals.append(
                {
                    "task_id": task_id,
                    "job": job,
                    "slot": headers.get("anarchon_slot"),
                    "trigger": headers.get("anarchon_trigger"),
                    "coalesced": headers.get("anarchon_coalesced"),
                    "instance": headers.get("anarchon_instance"),
                    "at_ms": now_ms(),
                }
            )
        message.ack()

    def stop(self) -> None:
        self._halt.set()
        self.join(10)


def bench_env(**variables: str) -> dict[str, str]:
    """The environment of a benchmark's celery processes: ours, the broker, and this directory
    on the path (for the benchmark apps)."""
    return dict(
        os.environ,
        BENCH_BROKER=BROKER,
        PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),
        **variables,
    )


def started_tally(queue: str) -> Tally:
    """A :class:`Tally` on ``queue``, consuming already."""
    tally = Tally(queue)
    tally.start()
    tally.ready.wait(30)
    return tally


def remove_dir(path: Path) -> None:
    """Remove a directory of logs (flat)."""
    for child in path.iterdir():
        child.unlink()
    path.rmdir()


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) by nearest rank."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def report(name: str, rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    """Print a table of ``rows`` and one JSON line with the rows and the summary."""
    headers = list(dict.fromkeys(key for row in rows for key in row))
    cells = [[_fmt(row.get(h, "")) for h in headers] for row in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *cells)]
    for line in [headers, *cells]:
        print("  ".join(str(v).ljust(w) for v, w in zip(line, widths)))
    for key, value in summary.items():
        print(f"{key}: {_fmt(value)}")
    print(json.dumps({"benchmark": name, "rows": rows, **summary}), flush=True)


def _fmt(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, float) else str(value)
