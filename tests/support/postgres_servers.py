"""PostgreSQL servers of a test's own: a primary made with ``initdb`` in a folder, and a streaming
standby of it (``pg_basebackup``), to stop as in a crash and promote. They run as the ``postgres``
user (PostgreSQL refuses root), on free ports of 127.0.0.1, with trust authentication."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from .proxy import free_port


def _bin(name: str) -> str:
    """A PostgreSQL program of this machine's newest version (Debian keeps them out of the PATH)."""
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name))
    if not versions:
        raise FileNotFoundError(f"no {name}: PostgreSQL's server programs are not installed")
    return str(versions[-1] / name)


def available() -> bool:
    try:
        _bin("initdb")
    except FileNotFoundError:
        return False
    return _user() is not None


def _user() -> list[str] | None:
    """How to run a command as the ``postgres`` user (or as we are, when we are not root)."""
    if os.geteuid() != 0:
        return []
    if shutil.which("runuser") is None:
        return None
    return ["runuser", "-u", "postgres", "--"]


def _run(*args: str) -> None:
    done = subprocess.run([*(_user() or []), *args], capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")


class OwnPostgres:
    """A PostgreSQL server in a folder of its own (in the system's temporary folder, which the
    ``postgres`` user can reach) on a free port; :meth:`remove` stops it and deletes the folder.
    ``standby_of`` makes it a streaming standby of that server (a copy of its data, following it)."""

    def __init__(self, *, standby_of: OwnPostgres | None = None) -> None:
        self.folder = folder = Path(tempfile.mkdtemp(prefix="anarchon-postgres-"))
        self.data = folder / "data"
        self.port = free_port()
        if _user():
            shutil.chown(folder, "postgres", "postgres")
        if standby_of is None:
            _run(_bin("initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
            with (self.data / "postgresql.conf").open("a") as conf:
                conf.write(
                    f"port = {self.port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{folder}'\n"
                    "wal_level = replica\nmax_wal_senders = 5\nhot_standby = on\nfsync = on\n"
                )
            with (self.data / "pg_hba.conf").open("a") as hba:
                hba.write("host replication all 127.0.0.1/32 trust\n")
        else:
            _run(
                _bin("pg_basebackup"),
                *("-D", str(self.data), "-h", "127.0.0.1", "-p", str(standby_of.port), "-U", "postgres"),
                *("-R", "-X", "stream", "--checkpoint=fast"),
            )
            with (self.data / "postgresql.auto.conf").open("a") as conf:
                conf.write(f"port = {self.port}\nunix_socket_directories = '{folder}'\n")
        self.start()

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        _run(_bin("pg_ctl"), "-D", str(self.data), "-l", str(self.folder / "server.log"), "-w", "-t", "60", "start")

    def crash(self) -> None:
        """Stopped at once, as in a crash (``-m immediate``); nothing when it is not running."""
        if (self.data / "postmaster.pid").exists():
            _run(_bin("pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def remove(self) -> None:
        """Stopped as in a crash, and its folder deleted."""
        try:
            self.crash()
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)

    def promote(self) -> None:
        _run(_bin("pg_ctl"), "-D", str(self.data), "-w", "-t", "60", "promote")

    def sql(self, statement: str) -> list[tuple[object, ...]]:
        import psycopg

        with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as db:
            cursor = db.execute(statement)  # type: ignore[arg-type]
            return cursor.fetchall() if cursor.description else []

    def wait_streaming(self, timeout: float = 30) -> None:
        """Until a standby streams from this server."""
        deadline = time.monotonic() + timeout
        while not self.sql("SELECT 1 FROM pg_stat_replication WHERE state = 'streaming'"):
            assert time.monotonic() < deadline, "no standby streams from the primary"
            time.sleep(0.1)


def system_cluster(action: str, *options: str) -> None:
    """``pg_ctlcluster`` on this machine's PostgreSQL cluster (the suite's), then, unless it was
    stopped, wait until it answers again."""
    version = sorted(os.listdir("/etc/postgresql"))[0]
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", action, *options],
        check=True,
        capture_output=True,
    )
    if action != "stop":
        deadline = time.monotonic() + 60
        while not system_cluster_answers():
            assert time.monotonic() < deadline, "PostgreSQL did not come back"
            time.sleep(0.2)


def system_cluster_answers() -> bool:
    return subprocess.run(["pg_isready", "-q", "-h", "127.0.0.1"], check=False).returncode == 0
