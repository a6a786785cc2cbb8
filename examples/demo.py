"""Demo: several `celery beat -S anarchon_celery.Scheduler` instances and one worker, on the local
RabbitMQ. Every scheduled run is executed exactly once.

    python examples/demo.py                      # 3 beats, 60 s
    python examples/demo.py --beats 5 --duration 30 --json

It starts a worker and the beat instances of ``demo_app`` under a fresh queue prefix, lets them
run, stops them, then prints each run in the window: job, slot, the instance that won it and how
many times the task executed. Everything it created in RabbitMQ is deleted at the end.

The broker is ``ANARCHON_DEMO_BROKER`` (default: the local RabbitMQ, guest/guest). When it is not
set and no RabbitMQ answers on this machine, the demo says so in one line and runs on the SQLite
backend with kombu's ``filesystem://`` transport instead, which need nothing installed;
``--backend rabbitmq`` or ``--backend sqlite`` chooses. What the demo is doing, and every few
seconds the runs executed so far, goes to stderr; the table (or, with ``--json``, one JSON line) to
stdout.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the repository's root: its tests' helpers start the processes

from tests.support.processes import delete_prefixed, start_celery, stop  # noqa: E402

LOCAL_RABBITMQ = "amqp://guest:guest@127.0.0.1:5672//"
BROKER = os.environ.get("ANARCHON_DEMO_BROKER", LOCAL_RABBITMQ)
#: The demo's backends: claims in RabbitMQ (the broker), or in a SQLite file with the tasks as files.
BACKENDS = ("rabbitmq", "sqlite")
WON = re.compile(r"anarchon: job '([^']+)' slot (\d+): won")
#: A backup that took a run over (its winner did not send it within its lease): it also logs "won".
TAKEN = re.compile(r"anarchon: job '([^']+)' slot (\d+): not sent by its winner within its lease; taken over")
#: A run won and sent, with its task id (a "won, but sending ... failed" line is not one).
SENT = re.compile(r"anarchon: job '[^']+' slot (\d+): won, sent \S*\[([^\]]+)\]")
#: Slots this close to the end of the window are not expected yet (jitter plus a safety margin).
END_MARGIN_MS = 3_000
#: The latest a run may be sent after its slot: demo_app's anarchon_jitter_ms + anarchon_max_late_ms.
LATEST_SEND_MS = 5_500
#: Seconds between two progress lines while the demo runs.
PROGRESS_EVERY_S = 5


class DemoError(RuntimeError):
    """The demo could not run; the message says why, for the user."""


class BrokerUnreachable(DemoError):
    """The broker does not answer (or refuses the demo); the URL in the message hides the password."""

    def __init__(self, url: str, reason: str, when: str = "") -> None:
        from kombu.utils.url import maybe_sanitize_url, url_to_parts

        password = url_to_parts(url).password
        if password:
            reason = reason.replace(password, "**")
        self.url = maybe_sanitize_url(url)
        super().__init__(
            f"cannot use the broker at {self.url}{when} ({reason}). Start RabbitMQ with `rabbitmq-server -detached`, "
            "or set ANARCHON_DEMO_BROKER to your broker's URL."
        )


class StartFailed(DemoError):
    """A worker or beat of the demo exited, or never became ready; its log is kept at ``log``."""

    def __init__(self, log: Path, what: str) -> None:
        self.log = log
        text = log.read_text(errors="replace") if log.exists() else ""
        tail = [line[:200] for line in text.splitlines() if line.strip()][-3:]
        super().__init__("\n".join([f"{what}; the end of its log ({log}):", *(f"  | {line}" for line in tail)]))


def say(message: str) -> None:
    """One progress line, on stderr (stdout holds only the result)."""
    print(f"demo: {message}", file=sys.stderr, flush=True)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def check_broker(url: str = BROKER, timeout: float = 2.0) -> None:
    """Connect once to ``url``; raise :class:`BrokerUnreachable` if that fails."""
    from kombu import Connection
    from kombu.exceptions import KombuError

    try:
        conn = Connection(url, connect_timeout=timeout)
    except (KeyError, ValueError) as exc:  # kombu: "No such transport: ..."
        raise BrokerUnreachable(url, str(exc.args[0]) if exc.args else repr(exc)) from exc
    try:
        with conn:
            conn.ensure_connection(max_retries=1)
    except (KombuError, OSError, *conn.connection_errors, *conn.channel_errors) as exc:
        raise BrokerUnreachable(url, str(exc) or type(exc).__name__) from exc


def choose_backend(requested: str | None, broker: str | None = None, default: str = LOCAL_RABBITMQ) -> str:
    """The backend the demo runs on: ``requested``, or RabbitMQ when ``broker`` (the
    ``ANARCHON_DEMO_BROKER`` given) is set or the ``default`` RabbitMQ answers, else SQLite, saying
    so in one line. Raises :class:`BrokerUnreachable` when RabbitMQ is asked for and does not answer."""
    if requested == "sqlite":
        return "sqlite"
    if requested == "rabbitmq" or broker:
        check_broker(broker or default)
        return "rabbitmq"
    try:
        check_broker(default)
    except BrokerUnreachable as exc:
        say(
            f"no RabbitMQ answers at {exc.url}: running the demo on the SQLite backend, with the tasks as "
            "files (kombu's filesystem:// transport); --backend rabbitmq insists on RabbitMQ"
        )
        return "sqlite"
    return "rabbitmq"


def _queue_depth(queue: str, folder: Path | None) -> int:
    from kombu import Connection
    from kombu.exceptions import KombuError

    if folder is not None:  # the filesystem transport: one file per message, named after its queue
        return sum(1 for name in os.listdir(folder / "messages") if name.endswith(f".{queue}.msg"))
    conn = Connection(BROKER, connect_timeout=5)
    try:
        with conn:
            return conn.default_channel.queue_declare(queue, passive=True).message_count
    except (KombuError, OSError, *conn.connection_errors) as exc:
        raise BrokerUnreachable(BROKER, str(exc), when=" while waiting for the tasks queued to run") from exc


def _wait_ready(procs: dict[Path, subprocess.Popen[bytes]], needle: str, timeout: float) -> None:
    """Wait until every log holds ``needle``, saying so for each; :class:`StartFailed` otherwise."""
    deadline = time.monotonic() + timeout
    pending = dict(procs)
    while pending:
        for log, proc in list(pending.items()):
            if log.exists() and needle in log.read_text(errors="replace"):
                say(f"{log.stem} ready")
                del pending[log]
            elif proc.poll() is not None:
                raise StartFailed(log, f"{log.stem} exited (status {proc.returncode}) before it was ready")
        if pending and time.monotonic() > deadline:
            log = next(iter(pending))
            raise StartFailed(log, f"{log.stem} was not ready after {timeout:.0f} s")
        time.sleep(0.2)


def _executed(executions: Path) -> Counter[str]:
    """How many times each task id has executed so far."""
    executed: Counter[str] = Counter()
    if executions.exists():
        for line in executions.read_text(errors="replace").splitlines():
            try:
                executed[json.loads(line)["task_id"]] += 1
            except (ValueError, KeyError, TypeError):  # a line still being written
                continue
    return executed


def _sent_not_run(executions: Path, logs: list[Path], until_ms: int | None = None) -> int:
    """How many runs (with a slot before ``until_ms``) the logs show sent that have not executed yet."""
    sent = {
        task_id
        for log in logs
        if log.exists()
        for slot, task_id in SENT.findall(log.read_text(errors="replace"))
        if until_ms is None or int(slot) < until_ms
    }
    return len(sent - _executed(executions).keys())


def _wait_until_run(
    prefix: str, executions: Path, logs: list[Path], folder: Path | None, until_ms: int | None = None
) -> None:
    """Wait (up to a minute) until every run the logs show sent has executed, and, without
    ``until_ms`` (the schedulers stopped), until the tasks queue is empty; say so if it gives up.
    With ``until_ms`` (the schedulers still running), first until every run before it is sent or
    past the latest moment it may be."""
    if until_ms is not None:
        time.sleep(max(0.0, (until_ms + LATEST_SEND_MS - now_ms()) / 1000))
    deadline = time.monotonic() + 60
    said = time.monotonic()
    while True:
        waiting = _sent_not_run(executions, logs, until_ms)
        depth = _queue_depth(f"{prefix}tasks", folder) if until_ms is None else 0
        if not waiting and not depth:
            return
        if time.monotonic() > deadline:
            say(f"gave up waiting after 60 s: {waiting} run(s) sent but not executed, {depth} task(s) still queued")
            return
        if time.monotonic() - said >= PROGRESS_EVERY_S:
            say(f"waiting for the worker: {waiting} run(s) sent but not executed, {depth} task(s) queued")
            said = time.monotonic()
        time.sleep(0.5)


def _so_far(executions: Path, logs: list[Path]) -> str:
    """What the demo has done so far: runs executed, duplicates, runs won by each instance."""
    executed = _executed(executions)
    duplicates = sum(1 for n in executed.values() if n > 1)
    won = ", ".join(f"{log.stem} {len(_wins(log.read_text(errors='replace'))[0])}" for log in logs)
    return f"{len(executed)} runs executed so far, {duplicates} duplicates; won by {won}"


def _wins(text: str) -> tuple[list[tuple[str, int]], set[tuple[str, int]]]:
    """The runs a beat's log shows it won by its claim, and those it took over as a backup (whose
    send logs "won" too)."""
    taken = {(job, int(slot)) for job, slot in TAKEN.findall(text)}
    return [(job, int(slot)) for job, slot in WON.findall(text) if (job, int(slot)) not in taken], taken


def _delete(prefix: str) -> None:
    from kombu import Connection
    from kombu.exceptions import KombuError

    conn = Connection(BROKER)
    try:
        deleted = delete_prefixed(prefix, BROKER)
    except (KombuError, OSError, subprocess.SubprocessError, *conn.connection_errors) as exc:
        say(f"could not delete this run's queues and exchanges ({prefix}*): {exc}")
    else:
        say(f"deleted this run's {deleted} queues and exchanges ({prefix}*)")


def run(
    beats: int = 3, duration: float = 60, keep_logs: bool = False, embedded: bool = False, backend: str = "rabbitmq"
) -> dict[str, Any]:
    """Run the demo; return its figures (see the module docstring).

    With ``embedded``, no separate beat: ``beats`` workers each run the scheduler inside
    (``celery worker -B``). ``backend`` is ``rabbitmq`` (claims and tasks on ``BROKER``) or
    ``sqlite`` (claims in a SQLite file, tasks as files: see :func:`choose_backend`). Raises
    :class:`BrokerUnreachable` before starting anything if RabbitMQ does not answer,
    :class:`StartFailed` (logs kept) if a process does not start. Progress goes to stderr.
    """
    if backend not in BACKENDS:
        raise DemoError(f"no backend {backend!r}: choose {' or '.join(BACKENDS)}")
    prefix = f"demo-{uuid.uuid4().hex[:8]}."
    tmp = Path(tempfile.mkdtemp(prefix="anarchon-demo-"))
    executions = tmp / "executions.jsonl"
    env, folder = _environment(backend, prefix, tmp, executions)
    procs: list[subprocess.Popen[bytes]] = []
    finished = start_failed = False
    try:
        workers, beat_procs, beat_logs = _start(procs, beats, embedded, prefix, tmp, env)
        window_start = now_ms()
        window_end = _watch(duration, executions, beat_logs, beat_procs or workers)
        if embedded:  # the workers stop consuming at once: first let them run the window's runs
            say("time is up: waiting for the window's runs sent to execute")
            _wait_until_run(prefix, executions, beat_logs, folder, until_ms=window_end - END_MARGIN_MS)
            say("stopping the workers (each finishes the task it is running)")
            for proc in workers:
                proc.send_signal(signal.SIGTERM)
        else:
            say("time is up: stopping the beat instances")
            for proc in beat_procs:
                stop(proc)
            _wait_until_run(prefix, executions, beat_logs, folder)
            say("stopping the worker")
        for proc in workers:
            stop(proc)
        say("counting the runs, and reading what `celery -A demo_app anarchon` shows of them")
        result = _report(prefix, env, beat_logs, executions, window_start, window_end)
        result["cli"] = _cli_views(env)
        finished = True
        return result
    except StartFailed:
        start_failed = True  # its message names the log
        raise
    finally:
        for proc in procs:
            stop(proc)
        if folder is None:  # the SQLite run's broker and database are files in tmp
            _delete(prefix)
        if keep_logs or (not finished and not start_failed):
            say(f"logs kept in {tmp}")
        elif finished:
            shutil.rmtree(tmp, ignore_errors=True)


def _environment(backend: str, prefix: str, tmp: Path, executions: Path) -> tuple[dict[str, str], Path | None]:
    """The environment of the demo's processes, and the folder of the tasks' files (SQLite)."""
    from kombu.utils.url import maybe_sanitize_url

    env = dict(
        os.environ,
        ANARCHON_DEMO_PREFIX=prefix,
        ANARCHON_DEMO_LOG=str(executions),
        ANARCHON_DEMO_BROKER=BROKER,
        PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),
    )
    if backend != "sqlite":
        env.pop("ANARCHON_DEMO_FOLDER", None)
        env.pop("ANARCHON_DEMO_BACKEND", None)
        check_broker(BROKER)
        say(f"the broker answers at {maybe_sanitize_url(BROKER)}; this run's queues are named {prefix}*")
        return env, None
    folder = tmp / "broker"
    for sub in ("messages", "control"):
        (folder / sub).mkdir(parents=True)
    env.update(
        ANARCHON_DEMO_BROKER="filesystem://",
        ANARCHON_DEMO_FOLDER=str(folder),
        ANARCHON_DEMO_BACKEND=f"sqlite:///{tmp / 'anarchon.db'}",
    )
    say(f"runs are decided in {tmp / 'anarchon.db'}; the tasks are files in {folder}")
    return env, folder


def _start(
    procs: list[subprocess.Popen[bytes]], beats: int, embedded: bool, prefix: str, tmp: Path, env: dict[str, str]
) -> tuple[list[subprocess.Popen[bytes]], list[subprocess.Popen[bytes]], list[Path]]:
    """Start the worker and the beats (or the workers with a beat inside), each added to
    ``procs`` as it starts; returns the workers, the beats and the logs of the beats."""
    worker_args = ["worker", "--pool=solo", "-l", "info", "--without-mingle", "--without-gossip", "--without-heartbeat"]
    beat_procs: list[subprocess.Popen[bytes]] = []
    if embedded:
        say(f"starting {beats} workers, each with the scheduler inside (-B)")
        beat_logs = [tmp / f"worker-{i + 1}.log" for i in range(beats)]
        for i, log in enumerate(beat_logs):
            name = f"{prefix}worker{i + 1}@%h"
            procs.append(start_celery([*worker_args, "-B", "-n", name], log, env, app="demo_app", cwd=HERE))
        workers = list(procs)
    else:
        say("starting a worker")
        worker_log = tmp / "worker.log"
        workers = [start_celery([*worker_args, "-n", f"{prefix}worker@%h"], worker_log, env, app="demo_app", cwd=HERE)]
        procs += workers
        _wait_ready({tmp / "worker.log": workers[0]}, "ready.", 60)
        say(f"starting {beats} beat instances: each races the others to claim every run")
        beat_logs = [tmp / f"beat-{i + 1}.log" for i in range(beats)]
        for log in beat_logs:
            beat_procs.append(start_celery(["beat", "-l", "info", "--pidfile="], log, env, app="demo_app", cwd=HERE))
            procs.append(beat_procs[-1])
    _wait_ready(dict(zip(beat_logs, beat_procs or workers)), "anarchon: ready as", 60)
    return workers, beat_procs, beat_logs


def _watch(duration: float, executions: Path, beat_logs: list[Path], schedulers: list[subprocess.Popen[bytes]]) -> int:
    """Let the beats run for ``duration`` seconds, with a line of progress every few seconds;
    returns when the window ended (epoch ms)."""
    say(f"running for {duration:g} s, a line every {PROGRESS_EVERY_S} s")
    started = time.monotonic()
    exited: set[Path] = set()
    window_end = now_ms()
    for elapsed in [*range(PROGRESS_EVERY_S, int(duration), PROGRESS_EVERY_S), duration]:
        time.sleep(max(0.0, started + elapsed - time.monotonic()))
        window_end = now_ms()
        for log, proc in zip(beat_logs, schedulers):
            if log not in exited and proc.poll() is not None:
                exited.add(log)
                say(f"{log.stem} exited (status {proc.returncode}); --keep-logs keeps its log")
        say(f"{elapsed:g}/{duration:g} s: {_so_far(executions, beat_logs)}")
    return window_end


def _cli_views(env: dict[str, str]) -> dict[str, str]:
    """What `celery -A demo_app anarchon ...` shows of this run."""
    return {
        name: subprocess.run(
            [sys.executable, "-m", "celery", "-A", "demo_app", "anarchon", *args],
            cwd=HERE,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        ).stdout
        for name, args in (("jobs", ["jobs"]), ("history", ["history", "fails", "-n", "3"]), ("check", ["check"]))
    }


def _report(
    prefix: str,
    env: dict[str, str],
    beat_logs: list[Path],
    executions: Path,
    window_start: int,
    window_end: int,
) -> dict[str, Any]:
    # The jobs, as the scheduler sees them: import the demo app with the same settings. The
    # environment is this process's only while the app is imported: a later run of the demo, or a
    # process started by this one, must not inherit this run's broker (the SQLite run's is a folder).
    saved = {key: os.environ.get(key) for key in ("ANARCHON_DEMO_PREFIX", "ANARCHON_DEMO_BROKER")}
    os.environ.update({key: env[key] for key in saved})
    try:
        sys.path.insert(0, str(HERE))
        import demo_app
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    # This run's settings, also when an earlier run of this process imported the app first.
    store = env.get("ANARCHON_DEMO_BACKEND") or None
    demo_app.app.conf.update(
        broker_url=env["ANARCHON_DEMO_BROKER"],
        anarchon_prefix=prefix,
        anarchon_backend=store,
        anarchon_lease_ms=demo_app.LEASE_MS if store else None,
    )

    import anarchon_celery
    from anarchon_celery import task_id_for
    from anarchon_celery.control import configure

    jobs = list(configure(demo_app.app).jobs.values())  # with this backend's options (leases): no I/O

    from kombu import Connection

    password = Connection(env["ANARCHON_DEMO_BROKER"]).password
    winners: dict[tuple[str, int], list[str]] = defaultdict(list)
    taken_over: dict[tuple[str, int], list[str]] = defaultdict(list)
    password_shown = False
    for log in beat_logs:
        text = log.read_text(errors="replace")
        password_shown |= bool(password) and f":{password}@" in text
        won, taken = _wins(text)
        for run in won:
            winners[run].append(log.stem)
        for run in taken:
            taken_over[run].append(log.stem)
    lines = [json.loads(line) for line in executions.read_text().splitlines()] if executions.exists() else []
    executed = Counter(line["task_id"] for line in lines)

    runs: list[dict[str, Any]] = []
    for job in jobs:
        for slot in job.schedule.slots(window_start, window_end - END_MARGIN_MS):
            task_id = task_id_for(prefix, job.name, slot)
            runs.append(
                {
                    "job": job.name,
                    "slot": slot,
                    "task_id": task_id,
                    "winners": winners.get((job.name, slot), []),
                    "taken_over_by": taken_over.get((job.name, slot), []),
                    "executed": executed.get(task_id, 0),
                }
            )
    runs.sort(key=lambda r: (r["slot"], r["job"]))
    return {
        "beats": len(beat_logs),
        "window_s": round((window_end - window_start) / 1000, 1),
        "expected": len(runs),
        "executed": sum(1 for r in runs if r["executed"]),
        "duplicates": sum(1 for r in runs if r["executed"] > 1),
        "missed": sum(1 for r in runs if r["executed"] == 0),
        # Over every execution, also outside the window: a task id executed twice anywhere.
        "duplicate_executions_total": sum(n - 1 for n in executed.values() if n > 1),
        "password_in_logs": password_shown,
        "runs": runs,
        # What each job's history says, as anarchon_celery.history() reads it.
        "history": {job.name: [r.as_dict() for r in anarchon_celery.history(demo_app.app, job.name)] for job in jobs},
    }


def _print_table(result: dict[str, Any]) -> None:
    print(f"{'job':<10} {'slot (UTC)':<25} {'won by':<10} executed")
    for run_ in result["runs"]:
        when = dt.datetime.fromtimestamp(run_["slot"] / 1000, dt.timezone.utc).isoformat(timespec="seconds")
        won_by = ",".join(run_["winners"]) or "-"
        if run_["taken_over_by"]:
            won_by += f", taken over by {','.join(run_['taken_over_by'])}"
        print(f"{run_['job']:<10} {when:<25} {won_by:<10} {run_['executed']}")
    print(
        f"\n{result['beats']} beat instances, {result['window_s']} s: {result['expected']} runs expected, "
        f"{result['executed']} executed, {result['duplicates']} duplicated, {result['missed']} missed"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--beats", type=int, default=3, help="beat instances (default 3)")
    parser.add_argument("--duration", type=float, default=60, help="seconds to run (default 60)")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON line")
    parser.add_argument("--keep-logs", action="store_true", help="keep the processes' logs")
    parser.add_argument("--embedded", action="store_true", help="run the schedulers inside workers (-B)")
    parser.add_argument("--cli", action="store_true", help="also print what `celery anarchon` shows")
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        help="where runs are decided: rabbitmq, or sqlite (a file, with the tasks as files: nothing to install); "
        "default: rabbitmq when it answers, else sqlite",
    )
    options = parser.parse_args(argv)
    try:
        backend = choose_backend(options.backend, os.environ.get("ANARCHON_DEMO_BROKER"))
        result = run(options.beats, options.duration, options.keep_logs, options.embedded, backend)
    except DemoError as exc:
        say(str(exc))
        return 2
    except KeyboardInterrupt:
        say("interrupted")
        return 130
    if options.json:
        print(json.dumps(result))
    else:
        _print_table(result)
        if options.cli:
            for name, output in result["cli"].items():
                print(
                    f"\n$ celery -A demo_app anarchon {name}{' fails -n 3' if name == 'history' else ''}\n{output}",
                    end="",
                )
    ok = result["duplicates"] == 0 and result["missed"] == 0 and result["duplicate_executions_total"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
