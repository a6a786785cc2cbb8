"""Local RabbitMQ nodes beside the system's: the 3.10 of this machine's packages, or 4.x from
Debian's forky package installed into a chroot on first use. Each node has a node name, ports,
an epmd port and a data folder of its own, listens on 127.0.0.1 only, and runs as root so that
it gets the open-file limit set here (Debian's wrapper goes through `su`, which resets it to
1,024). Used by `scripts/rabbitmq4` and `scripts/rabbitmq-cluster`; nothing here touches the
system node on 5672."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

STATE = Path(os.environ.get("ANARCHON_RABBITMQ_STATE", "/var/lib/anarchon-rabbitmq"))
CHROOT = Path(os.environ.get("ANARCHON_RABBITMQ4_CHROOT", str(STATE / "forky")))
MIRROR = os.environ.get("ANARCHON_DEBIAN_MIRROR", "http://deb.debian.org/debian")
BIN = "/usr/lib/rabbitmq/bin"  # the real scripts, not Debian's su wrappers
OPEN_FILES = 20_000
START_TIMEOUT_S = 180


def say(text: str) -> None:
    print(f"{Path(sys.argv[0]).name}: {text}", file=sys.stderr, flush=True)


#: The exit status of `start` when the cluster (or its ports) is in use: nothing was started, so
#: the caller has nothing to stop.
BUSY = 3


def fail(text: str, status: int = 1) -> None:
    say(text)
    raise SystemExit(status)


@dataclass(frozen=True)
class Version:
    """Where a version's RabbitMQ runs from: the host, or the forky chroot."""

    name: str  # "3.10" or "4"
    root: Path | None  # the chroot, or None for the host
    epmd_port: int

    def ensure_installed(self) -> None:
        if self.root is None:
            if not Path(BIN, "rabbitmq-server").exists():
                fail("RabbitMQ is not installed on this machine: apt-get install rabbitmq-server")
            return
        install_forky(self.root)

    def path(self, inside: str) -> Path:
        """A path as the host sees it, for one as the node sees it."""
        return Path(inside) if self.root is None else self.root / inside.lstrip("/")

    def command(self, env: dict[str, str], *args: str) -> list[str]:
        """``args`` run with ``env`` (and nothing else of ours) where this version runs."""
        assignments = [f"{key}={value}" for key, value in env.items()]
        prefix = [] if self.root is None else ["chroot", str(self.root)]
        return [*prefix, "/usr/bin/env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", *assignments, *args]


def version(name: str) -> Version:
    if name in ("3", "3.10", "system"):
        return Version("3.10", None, 4370)
    if name in ("4", "4.3", "forky"):
        return Version("4", CHROOT, 4371)
    fail(f"unknown RabbitMQ version {name!r}: give 3.10 (this machine's) or 4 (Debian forky's, in a chroot)")
    raise AssertionError


def install_forky(root: Path) -> None:
    """Debian forky with its rabbitmq-server (4.x, with its own Erlang) in ``root``, made once.
    bookworm's debootstrap has no script for forky: sid's is the same."""
    if (root / BIN.lstrip("/") / "rabbitmq-server").exists():
        return
    if shutil.which("debootstrap") is None:
        say("installing debootstrap")
        run(["apt-get", "install", "-y", "-q", "debootstrap"])
    script = Path("/usr/share/debootstrap/scripts/sid")
    partial = root.with_name(root.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    say(f"installing Debian forky's rabbitmq-server into {root} (a minute or two, once)")
    run(
        ["debootstrap", "--variant=minbase", "--include=rabbitmq-server", "forky", str(partial), MIRROR, str(script)],
        quiet=True,
    )
    partial.rename(root)


def prepare_chroot(root: Path) -> None:
    """What a node in the chroot needs from the host: its /etc/hosts (else epmd cannot resolve
    localhost: nxdomain) and /proc."""
    shutil.copyfile("/etc/hosts", root / "etc/hosts")
    proc = root / "proc"
    if not os.path.ismount(proc):
        run(["mount", "-t", "proc", "proc", str(proc)])


def release_chroot(root: Path, wait_s: float = 5) -> None:
    """Unmount the chroot's /proc once no process runs in the chroot (an epmd told to stop may
    take a moment: it is waited for up to ``wait_s`` seconds)."""
    proc = root / "proc"
    deadline = time.monotonic() + wait_s
    while os.path.ismount(proc):
        if not _rooted_in(root):
            subprocess.run(["umount", "-l", str(proc)], check=False, capture_output=True)
            return
        if time.monotonic() > deadline:
            return  # a node still runs there: its /proc stays
        time.sleep(0.2)


def _rooted_in(root: Path) -> bool:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/root") == str(root):
                return True
        except OSError:
            continue
    return False


def run(args: list[str], *, quiet: bool = False, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=timeout, check=False)
    if done.returncode != 0:
        output = (done.stdout + done.stderr).strip().splitlines()
        fail(f"{' '.join(args[:3])} ... failed (status {done.returncode}): " + " | ".join(output[-5:]))
    if not quiet and done.stdout.strip():
        print(done.stdout.strip(), flush=True)
    return done


@dataclass(frozen=True)
class Node:
    """One RabbitMQ node of ours. ``home`` is its folder as the node sees it."""

    version: Version
    name: str  # the node name's first part, e.g. "anarchon-c1"
    amqp_port: int
    home: str  # data, logs, config, cookie
    cookie: str

    @property
    def node(self) -> str:
        return f"{self.name}@localhost"

    @property
    def dist_port(self) -> int:
        return self.amqp_port + 20_000

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.amqp_port}//"

    def env(self) -> dict[str, str]:
        home = self.home
        return {
            "HOME": home,
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_PORT": str(self.amqp_port),
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "ERL_EPMD_PORT": str(self.version.epmd_port),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            # Schedulers that do not spin while idle: several nodes share this machine's cores.
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": (
                "-kernel inet_dist_use_interface {127,0,0,1} +sbwt none +sbwtdcpu none +sbwtdio none"
            ),
            "RABBITMQ_CONF_ENV_FILE": f"{home}/rabbitmq-env.conf",
            "RABBITMQ_CONFIG_FILE": f"{home}/rabbitmq",
            "RABBITMQ_ENABLED_PLUGINS_FILE": f"{home}/enabled_plugins",
            "RABBITMQ_MNESIA_BASE": f"{home}/mnesia",
            "RABBITMQ_LOG_BASE": f"{home}/log",
            "RABBITMQ_PID_FILE": f"{home}/pid",
        }

    def folder(self) -> Path:
        return self.version.path(self.home)

    def write_config(self, config: str) -> None:
        folder = self.folder()
        (folder / "log").mkdir(parents=True, exist_ok=True)
        (folder / "rabbitmq-env.conf").write_text("")  # not the host's /etc/rabbitmq one
        (folder / "enabled_plugins").write_text("[].\n")
        (folder / "rabbitmq.conf").write_text(config)
        cookie = folder / ".erlang.cookie"
        cookie.write_text(self.cookie)
        cookie.chmod(0o600)

    def processes(self) -> list[int]:
        """The pids of this node's Erlang VMs, found by the node name in their environment: a
        node still booting (no AMQP port yet) or left without a pid file is found too."""
        needle = f"RABBITMQ_NODENAME={self.node}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if b"beam" in (entry / "cmdline").read_bytes() and needle in (entry / "environ").read_bytes().split(
                    b"\0"
                ):
                    found.append(int(entry.name))
            except OSError:  # gone meanwhile, or not ours to read
                continue
        return found

    def ports_taken(self) -> list[int]:
        """This node's ports (AMQP, distribution) that something else listens on."""
        taken = []
        for port in (self.amqp_port, self.dist_port):
            with socket.socket() as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    probe.bind(("127.0.0.1", port))
                except OSError:
                    taken.append(port)
        return taken

    def answers(self) -> bool:
        """Whether the node takes AMQP connections (a TCP connect is enough here)."""
        try:
            with socket.create_connection(("127.0.0.1", self.amqp_port), timeout=1):
                return True
        except OSError:
            return False

    def ctl(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = self.version.command(
            {"HOME": self.home, "ERL_EPMD_PORT": str(self.version.epmd_port)},
            f"{BIN}/rabbitmqctl",
            "-n",
            self.node,
            *args,
        )
        done = subprocess.run(
            command, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=timeout, check=False
        )
        if check and done.returncode != 0:
            fail(f"rabbitmqctl {' '.join(args)} on {self.node} failed: {(done.stdout + done.stderr).strip()}")
        return done

    def pid(self) -> int | None:
        try:
            return int(self.version.path(f"{self.home}/pid").read_text().strip())
        except (OSError, ValueError):
            return None

    def start(self) -> None:
        """Start the node (if it is not running) and return once it answers."""
        if self.answers():
            return
        if self.version.root is not None:
            prepare_chroot(self.version.root)
        command = self.version.command(
            self.env(), "sh", "-c", f'ulimit -n {OPEN_FILES}; exec "{BIN}/rabbitmq-server" -detached'
        )
        subprocess.run(command, check=False, capture_output=True, stdin=subprocess.DEVNULL, timeout=60)
        self.await_started()

    def await_started(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.answers():
            if time.monotonic() > deadline:
                fail(
                    f"{self.node} did not answer on 127.0.0.1:{self.amqp_port} within {START_TIMEOUT_S}s: "
                    f"see {self.folder() / 'log'}"
                )
            time.sleep(0.5)
        self.ctl("await_startup", "--timeout", str(START_TIMEOUT_S), timeout=START_TIMEOUT_S + 10)

    def stop(self) -> None:
        """Stop the node cleanly, or kill it if it will not stop: no process of it is left."""
        pid = self.pid()
        if self.ctl("stop", timeout=90, check=False).returncode != 0 and pid is not None:
            kill(pid)
        deadline = time.monotonic() + 30
        while (self.answers() or self.processes()) and time.monotonic() < deadline:
            time.sleep(0.2)
        for left in self.processes():
            kill(left)

    def kill(self) -> None:
        """SIGKILL the node's Erlang VM, as a machine lost at once."""
        pid = self.pid()
        if pid is None or not self.answers():
            fail(f"{self.node} is not running")
        kill(pid)
        while self.answers():
            time.sleep(0.05)


def kill(pid: int) -> None:
    """SIGKILL ``pid`` if it is still an Erlang VM (a stale pid file may name another process)."""
    try:
        if b"beam" not in Path(f"/proc/{pid}/cmdline").read_bytes():
            return
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, FileNotFoundError):
        pass


def stop_nodes(nodes: list[Node]) -> None:
    """Stop the nodes that run (all of one version), then their epmd."""
    for node in nodes:
        if node.answers() or node.pid() is not None or node.processes():
            node.stop()
    stop_epmd(nodes[0].version)


def pass_to_ctl(node: Node, args: list[str]) -> None:
    """Run rabbitmqctl ``args`` on ``node`` as if called directly: its output, its status."""
    done = node.ctl(*args, check=False)
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    raise SystemExit(done.returncode)


def stop_epmd(version: Version) -> None:
    """The version's epmd, started by its first node, once no node of ours uses it."""
    command = version.command({"ERL_EPMD_PORT": str(version.epmd_port)}, "epmd", "-kill")
    for _ in range(20):  # "Killing not allowed - living nodes in database" while a node unregisters
        done = subprocess.run(
            command, check=False, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=30
        )
        if "not allowed" not in done.stdout + done.stderr:
            break
        time.sleep(0.5)
    if version.root is not None:
        release_chroot(version.root)
