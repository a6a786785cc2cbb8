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


def keeps_nothing(url: str) -> bool:
    """Whether the Redis at ``url`` keeps nothing on disk: no append-only file, no ``save`` rule
    (as .ci/run starts the suite's Redis)."""
    import redis

    with redis.Redis.from_url(url) as client:
        return not int(client.info("persistence")["aof_enabled"]) and not client.config_get("save")["save"].strip()


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
        args += ["--appendonly", "yes", "--appendfsync", "always", "--save", "", "--repl-diskless-sync-delay", "0"]
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


class SentinelGroup:
    """A master (persisted at every write), two replicas and three sentinels (quorum 2) watching
    it as ``main``: a failover of the master to a replica takes about 2 s, and the other replica
    follows the new master."""

    MASTER = "main"

    def __init__(self, folder: Path) -> None:
        self.servers: list[OwnRedisServer] = []
        self.sentinels: list[OwnRedisServer] = []
        try:
            master = OwnRedisServer(folder / "master")
            self.servers.append(master)
            for n in range(2):
                self.servers.append(OwnRedisServer(folder / f"replica-{n}", replica_of=master.port))
            for n in range(3):
                self.sentinels.append(OwnRedisServer(folder / f"sentinel-{n}", sentinel_of=master.port))
            self.wait_ready()
        except BaseException:
            self.kill()
            raise

    def url(self, query: str = "") -> str:
        """The ``sentinel://`` URL of the group's master, database 0."""
        chunks = ";".join(f"sentinel://127.0.0.1:{s.port}/0" for s in self.sentinels)
        return f"{chunks}?master_name={self.MASTER}" + (f"&{query}" if query else "")

    def _ask(self, sentinel: OwnRedisServer, *command: str) -> object:
        import redis

        client = redis.Redis(port=sentinel.port, socket_timeout=2, decode_responses=True)
        try:
            return client.execute_command(*command)
        finally:
            client.close()

    def master_port(self) -> int:
        """The master's port, as the first sentinel sees it."""
        _, port = self._ask(self.sentinels[0], "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.MASTER)  # type: ignore[misc]
        return int(port)

    def server_on(self, port: int) -> OwnRedisServer:
        return next(server for server in self.servers if server.port == port)

    def wait_ready(self, timeout: float = 60) -> None:
        """Until every sentinel knows the two others and a replica in sync with the master."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                ready = all(
                    len(self._ask(s, "SENTINEL", "SENTINELS", self.MASTER)) == 2  # type: ignore[arg-type]
                    and any(
                        replica.get("master-link-status") == "ok"  # type: ignore[union-attr]
                        for replica in self._ask(s, "SENTINEL", "REPLICAS", self.MASTER)  # type: ignore[union-attr]
                    )
                    for s in self.sentinels
                )
            except Exception:  # noqa: BLE001 - not up yet
                ready = False
            if ready:
                return
            assert time.monotonic() < deadline, "the sentinels did not all see each other and the replica"
            time.sleep(0.2)

    def wait_failover(self, old_port: int, timeout: float = 60) -> int:
        """Until the sentinels name another master than ``old_port``; returns its port."""
        deadline = time.monotonic() + timeout
        while (port := self.master_port()) == old_port:
            assert time.monotonic() < deadline, "no failover"
            time.sleep(0.1)
        return port

    def kill(self) -> None:
        for server in [*self.sentinels, *self.servers]:
            server.kill()
