"""Redis servers of a test's own, to kill, restart and fail over: a server persisted at every write
(optionally a replica of another), and Redis Sentinel processes watching a master."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

from .proxy import free_port


def _answers(port: int) -> bool | None:
    """True when the server on ``port`` answers; None while it loads its data (it listens, and
    answers every command with LOADING); False when nothing listens."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    client = redis.Redis(port=port, socket_timeout=1, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))
    try:
        return bool(client.ping())
    except redis.BusyLoadingError:  # (a ConnectionError)
        return None
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        return False
    finally:
        client.close()


def wait_until(port: int, up: bool, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while _answers(port) is not up:
        assert time.monotonic() < deadline, f"Redis on port {port} did not {'start' if up else 'stop'}"
        time.sleep(0.05)


class OwnRedisServer:
    """``redis-server`` (or ``redis-server --sentinel``) as a child process of the test, in a folder
    of its own: :meth:`kill` is a crash (SIGKILL), :meth:`start` brings it back on the same port
    with the data it persisted."""

    def __init__(self, folder: Path, *, replica_of: int | None = None, sentinel_of: int | None = None) -> None:
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.replica_of = replica_of
        self.sentinel_of = sentinel_of
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def _args(self) -> list[str]:
        if self.sentinel_of is not None:
            config = self.folder / "sentinel.conf"
            if not config.exists():  # the sentinel rewrites it with what it learns
                config.write_text(
                    f"port {self.port}\nbind 127.0.0.1\ndir {self.folder}\n"
                    f"sentinel monitor main 127.0.0.1 {self.sentinel_of} 2\n"
                    "sentinel down-after-milliseconds main 1000\n"
                    "sentinel failover-timeout main 10000\n"
                    "sentinel parallel-syncs main 1\n"
                )
            return ["redis-server", str(config), "--sentinel"]
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.folder)]
        args += ["--appendonly", "yes", "--appendfsync", "always", "--save", ""]
        if self.replica_of is not None:
            args += ["--replicaof", "127.0.0.1", str(self.replica_of)]
        return args

    def start(self) -> None:
        log = (self.folder / "server.log").open("ab")
        self.proc = subprocess.Popen(self._args(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        wait_until(self.port, True)

    def kill(self) -> None:
        """SIGKILL, as a crash; nothing when it is not running."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self.proc = None
        wait_until(self.port, False)
