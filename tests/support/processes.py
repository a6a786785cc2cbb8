"""Real ``celery`` processes for the tests, the benchmarks and the demo: start one with its output
in a log, wait for a line of it, stop it; and the broker's queues of a prefix, listed and deleted."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["delete_prefixed", "queue_names", "start_celery", "stop", "wait_for_line"]

# Queue names straight from the broker's metadata: `rabbitmqctl list_queues` asks every queue
# process for its name, and leaves out those too busy to answer (many just made at once).
_QUEUE_NAMES = '[io:format("queue:~s~n", [N]) || {resource, <<"/">>, queue, N} <- rabbit_amqqueue:list_names()], ok.'
# The queues and the exchanges in one call: each rabbitmqctl call starts an Erlang VM (~0.6 s).
_NAMES = (
    '[io:format("queue:~s~n", [N]) || {resource, <<"/">>, queue, N} <- rabbit_amqqueue:list_names()], '
    '[io:format("exchange:~s~n", [N]) || {resource, <<"/">>, exchange, N} <- rabbit_exchange:list_names()], ok.'
)


def _rabbitmqctl(*args: str) -> subprocess.CompletedProcess[str]:
    """rabbitmqctl, or the command in ANARCHON_RABBITMQCTL (as for `celery anarchon prune`)."""
    command = shlex.split(os.environ.get("ANARCHON_RABBITMQCTL", "rabbitmqctl"))
    return subprocess.run(
        [*command, "-q", *args], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60, check=False
    )


def queue_names(prefix: str = "") -> list[str]:
    """Every queue whose name starts with ``prefix``, as the broker's metadata knows them."""
    listing = _rabbitmqctl("eval", _QUEUE_NAMES)
    if listing.returncode == 0:
        names = [line[6:] for line in listing.stdout.splitlines() if line.startswith("queue:")]
    else:
        names = _rabbitmqctl("list_queues", "--no-table-headers", "name").stdout.split()
    return sorted({n for n in names if n.startswith(prefix)})


def delete_prefixed(prefix: str, broker: str) -> int:
    """Delete every queue and exchange whose name starts with ``prefix``; return how many."""
    from kombu import Connection

    listing = _rabbitmqctl("eval", _NAMES)
    if listing.returncode == 0:
        lines = listing.stdout.splitlines()
        queues = [line[6:] for line in lines if line.startswith("queue:")]
        exchanges = [line[9:] for line in lines if line.startswith("exchange:")]
    else:
        queues = queue_names()
        exchanges = _rabbitmqctl("list_exchanges", "--no-table-headers", "name").stdout.split()
    names = {
        "queues": sorted({n for n in queues if n.startswith(prefix)}),
        "exchanges": sorted({n for n in exchanges if n.startswith(prefix)}),
    }
    with Connection(broker) as conn:
        channel = conn.default_channel
        for queue in names["queues"]:
            channel.queue_delete(queue)
        for exchange in names["exchanges"]:
            channel.exchange_delete(exchange)
    return len(names["queues"]) + len(names["exchanges"])


def start_celery(args: list[str], log: Path, env: dict[str, str], *, app: str, cwd: Path) -> subprocess.Popen[bytes]:
    """Start `celery -A app ...` in its own process group, its output appended to `log`."""
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", app, *args],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def wait_for_line(path: Path, needle: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Wait until the log at ``path`` holds ``needle``; RuntimeError, with the log's end, when the
    process exits first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and needle in path.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            raise RuntimeError(f"{path.name}: process exited early:\n{path.read_text(errors='replace')[-3000:]}")
        time.sleep(0.2)
    raise RuntimeError(f"{path.name}: no {needle!r} within {timeout}s:\n{path.read_text(errors='replace')[-3000:]}")


def stop(proc: subprocess.Popen[bytes], timeout: float = 20) -> None:
    """SIGTERM, then SIGKILL to its process group after ``timeout`` seconds."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
