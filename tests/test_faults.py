"""Faults around real `celery beat` processes: a stop signal in the middle of a claim, a broker
that is not there (or silent) at start, every connection cut, the broker restarted, clocks that
disagree. The broker side goes through a TCP proxy the test controls, or through rabbitmqctl."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from kombu import Connection

from .support.broker_control import broker_stopped, close_all_connections, need_rabbitmqctl, rabbitmqctl, url_with
from .support.processes import start_celery
from .support.proxy import Proxy, free_port

ROOT = Path(__file__).resolve().parent.parent
APP = "tests.apps.history_app"

pytestmark = [pytest.mark.broker, pytest.mark.processes]


def start_beat(env: dict[str, str], log: Path, app: str = APP) -> subprocess.Popen[bytes]:
    """A beat of ``app``; ``TEST_BEAT_SCHEDULER`` in ``env`` names another scheduler class."""
    scheduler = env.get("TEST_BEAT_SCHEDULER", "anarchon_celery.Scheduler")
    args = ["beat", "-S", scheduler, "-l", "debug", "--pidfile="]
    return start_celery(args, log, env, app=app, cwd=ROOT)


def kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def wait_for(log: Path, needle: str, proc: subprocess.Popen[bytes], timeout: float = 60, after: int = 0) -> int:
    """Wait until `needle` appears in the log after offset `after`; return the offset past it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        found = text.find(needle, after)
        if found >= 0:
            return found + len(needle)
        assert proc.poll() is None, f"beat exited early:\n{text[-3000:]}"
        time.sleep(0.05)
    raise AssertionError(f"no {needle!r} within {timeout}s:\n{log.read_text(errors='replace')[-3000:]}")


def sent_slots(broker_url: str, queue: str) -> list[int]:
    """The slots of the job ``every`` sent to the task queue (drained)."""
    slots = []
    with Connection(broker_url) as conn:
        while (message := conn.default_channel.basic_get(queue, no_ack=True)) is not None:
            if message.headers["anarchon_job"] == "every":
                slots.append(message.headers["anarchon_slot"])
    return slots


class Fleet:
    """Several beats of one deployment, each with its own log and environment."""

    def __init__(self, tmp_path: Path, envs: list[dict[str, str]], app: str = APP) -> None:
        self.logs = [tmp_path / f"beat-{n}.log" for n in range(len(envs))]
        self.procs = [start_beat(env, log, app) for env, log in zip(envs, self.logs)]

    def wait_ready(self) -> None:
        for proc, log in zip(self.procs, self.logs):
            wait_for(log, "anarchon: ready as", proc)

    def offsets(self) -> list[int]:
        return [len(log.read_text(errors="replace")) for log in self.logs]

    def wait_any(self, needle: str, after: list[int] | None = None, timeout: float = 60) -> None:
        """Wait until one of the beats logs `needle` (past its offset in `after`)."""
        after = after or [0] * len(self.logs)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for proc, log, offset in zip(self.procs, self.logs, after):
                if log.read_text(errors="replace").find(needle, offset) >= 0:
                    return
                assert proc.poll() is None, f"beat exited:\n{log.read_text(errors='replace')[-3000:]}"
            time.sleep(0.1)
        raise AssertionError(f"no beat logged {needle!r} within {timeout}s:\n{self.logs[0].read_text()[-3000:]}")

    def stop(self) -> None:
        """A clean stop of every beat at once: each exits 0 (none hung, none crashed)."""
        for proc in self.procs:
            assert proc.poll() is None, "a beat exited by itself"
            proc.send_signal(signal.SIGTERM)
        for proc, log in zip(self.procs, self.logs):
            assert proc.wait(30) == 0, log.read_text(errors="replace")[-3000:]

    def kill(self) -> None:
        for proc in self.procs:
            kill(proc)

    def text(self, index: int) -> str:
        return self.logs[index].read_text(errors="replace")


def wait_for_a_held_claim(log: Path, proc: subprocess.Popen[bytes], after: int, timeout: float = 60) -> int:
    """Wait for a claim that a stalled broker holds: a "claiming" line past ``after`` that no
    outcome follows (one logged just before the stall may have been answered). Returns the
    offset past it."""
    deadline = time.monotonic() + timeout
    while True:
        at = wait_for(log, "anarchon: claiming", proc, timeout=max(0.1, deadline - time.monotonic()), after=after)
        time.sleep(0.5)
        if "anarchon: job 'every' slot " not in log.read_text(errors="replace")[at:]:
            return at
        after = at


def assert_each_run_once(slots: list[int], allowed_missing: int = 0) -> None:
    counted = Counter(slots)
    assert counted, "no run was sent"
    assert [slot for slot, n in counted.items() if n > 1] == [], "runs sent twice"
    missing = sorted(set(range(min(counted), max(counted) + 1000, 1000)) - set(counted))
    assert len(missing) <= allowed_missing, f"runs missed: {missing}"


@pytest.mark.exclusive  # held to the stop's 2 s grace by the wall clock: not beside other tests
@pytest.mark.timeout(120)
def test_sigterm_during_a_claim_finishes_it_and_sends_the_task(
    beat_env: dict[str, str], broker_url: str, prefix: str, tmp_path: Path
) -> None:
    proxy = Proxy()
    log = tmp_path / "beat.log"
    # No history: the stall below must catch a claim, not the history write after the last send.
    # No declares ahead: their connection is made after the first claims, and one made while the
    # proxy stalls holds the loop for its connect timeout, past the run's deadline.
    env = dict(beat_env, HISTORY_APP_BACKEND=proxy.url(), HISTORY_APP_HISTORY_SIZE="0", HISTORY_APP_LEAD_MS="0")
    beat = start_beat(env, log)
    try:
        seen = wait_for(log, "anarchon: ready as", beat)
        seen = wait_for(log, "won, sent", beat, after=seen)  # claims work through the proxy
        proxy.stall()  # the next claim waits for the broker's answer...
        seen = wait_for_a_held_claim(log, beat, after=seen)
        beat.send_signal(signal.SIGTERM)  # ...while the stop signal arrives
        # The grace (stopping.GRACE_S, 2 s) runs from here: the claim is let through at once.
        wait_for(log, "anarchon: stop requested", beat, after=seen)
        time.sleep(0.5)  # the claim still unanswered, well inside the grace
        assert beat.poll() is None, "beat stopped in the middle of a claim"
        proxy.resume()
        assert beat.wait(30) == 0
        text = log.read_text(errors="replace")
        assert "anarchon: stopping, the runs in progress are done" in text
        last_won = int(text.rsplit("anarchon: job 'every' slot ", 1)[1].split(":", 1)[0])
        assert "won, sent" in text.rsplit("anarchon: job 'every' slot ", 1)[1]
        assert last_won in sent_slots(broker_url, f"{prefix}tasks")  # the run in progress was sent
    finally:
        kill(beat)
        proxy.close()


@pytest.mark.timeout(120)
def test_a_stop_while_idle_is_logged(beat_env: dict[str, str], tmp_path: Path) -> None:
    # A clean stop can be told from a crash in beat's own log.
    log = tmp_path / "beat.log"
    beat = start_beat(dict(beat_env, HISTORY_APP_EVERY="86400"), log)
    try:
        wait_for(log, "anarchon: ready as", beat)
        time.sleep(1)
        beat.send_signal(signal.SIGTERM)
        assert beat.wait(30) == 0
    finally:
        kill(beat)
    text = log.read_text(errors="replace")
    assert "anarchon: SIGTERM received with no run in progress: stopping" in text
    assert text.rstrip().splitlines()[-1].endswith(" stopped"), text[-1000:]
    assert text.count(" stopped\n") == 1, text[-1000:]  # once, however often beat closes the scheduler


@pytest.mark.timeout(120)
@pytest.mark.parametrize("outage", ["refused", "silent"])
def test_a_stop_takes_effect_at_once_while_the_broker_is_unreachable(
    beat_env: dict[str, str], tmp_path: Path, outage: str
) -> None:
    """With max_late_ms 60 s, claims would keep trying for a minute: a stop must not wait for them."""
    proxy = Proxy()
    log = tmp_path / "beat.log"
    env = dict(
        beat_env,
        HISTORY_APP_BACKEND=proxy.url(),
        HISTORY_APP_MAX_LATE_MS="60000",
        HISTORY_APP_SLOT_TTL_MS="300000",
    )
    beat = start_beat(env, log)
    try:
        seen = wait_for(log, "won, sent", beat)
        if outage == "refused":
            proxy.close()  # connections cut, new ones refused: claims are made again every second
            seen = wait_for(log, "anarchon: claiming", beat, after=len(log.read_text(errors="replace")))
        else:
            proxy.stall()  # a black hole: no answer, no close
            seen = wait_for_a_held_claim(log, beat, after=seen)  # a claim is waiting on the broker
        time.sleep(1)
        beat.send_signal(signal.SIGTERM)
        try:
            status = beat.wait(20)  # a stop takes stopping.GRACE_S (2 s); before, up to max_late_ms
        except subprocess.TimeoutExpired:
            raise AssertionError(f"beat still running 20 s after SIGTERM:\n{log.read_text()[-3000:]}") from None
        assert status == 0
        text = log.read_text(errors="replace")
        assert "anarchon: stop requested" in text[seen:]
        # A claim held by a silent broker is cut off at the end of the grace; one on a refused
        # connection may also end by itself within it (tried again with back-off for a few seconds,
        # then given up, undecided).
        ends = ["anarchon: stopping now"] + (["the runs in progress are done"] if outage == "refused" else [])
        assert any(end in text[seen:] for end in ends), text[seen:][-2000:]
        assert "Traceback" not in text
    finally:
        kill(beat)
        proxy.close()


@pytest.mark.timeout(120)
def test_an_outage_is_logged_once_when_it_starts_and_once_when_it_ends(
    beat_env: dict[str, str], broker_url: str, tmp_path: Path
) -> None:
    proxy = Proxy()
    port = proxy.port
    log = tmp_path / "beat.log"
    env = dict(beat_env, HISTORY_APP_BACKEND=proxy.url(), HISTORY_APP_EVERY="1", HISTORY_APP_MAX_LATE_MS="1000")
    beat = start_beat(env, log)
    try:
        seen = wait_for(log, "won, sent", beat)
        proxy.close()  # RabbitMQ goes away for many times the lateness allowed to the job due every second
        start = wait_for(log, "is unavailable (", beat, after=seen)
        time.sleep(8)
        proxy = Proxy(port=port)  # and comes back
        end = wait_for(log, "run(s) were not claimed meanwhile", beat, after=start)
        wait_for(log, "won, sent", beat, after=end)
    finally:
        kill(beat)
        proxy.close()
    text = log.read_text(errors="replace")
    during = [line for line in text[start:end].splitlines() if "WARNING/" in line or "ERROR/" in line]
    assert len(during) == 1 and "is back after" in during[0], during  # no line per job and slot
    missed = re.search(r"; (\d+) run\(s\) were not claimed meanwhile", during[0])
    assert missed is not None and int(missed.group(1)) >= 4, during[0]  # about 7 runs of the job every second
    assert "guest:guest@" not in text


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "setting, expected",
    [
        ({"HISTORY_APP_BACKEND": url_with(password="s3cret-wrong")}, "refused the login of user 'guest'"),
        ({"HISTORY_APP_BACKEND": url_with(vhost="no-such-vhost")}, "has no vhost 'no-such-vhost'"),
        ({"HISTORY_APP_BAD": "1"}, "job 'bad': invalid cron spec '61 * * * *'"),
        ({"HISTORY_APP_BAD_CRON": "1"}, "job 'caught': hand_over is not available"),
        ({"HISTORY_APP_BAD_ARGS": "1"}, "job 'sum': its arguments do not fit task 'history_app.add'(x, y)"),
    ],
    ids=["password", "vhost", "config", "cron", "arguments"],
)
def test_what_only_a_configuration_change_fixes_stops_beat_in_one_line(
    beat_env: dict[str, str], tmp_path: Path, setting: dict[str, str], expected: str
) -> None:
    stopped_in_one_line(dict(beat_env, **setting), tmp_path, expected)
    assert "s3cret" not in (tmp_path / "beat.log").read_text(errors="replace")


def stopped_in_one_line(env: dict[str, str], tmp_path: Path, expected: str, app: str = APP) -> str:
    """Start a beat of ``app`` with ``env``: it must exit 1 with one CRITICAL line holding ``expected``."""
    log = tmp_path / "beat.log"
    beat = start_beat(env, log, app)
    try:
        status = beat.wait(60)
    finally:
        kill(beat)
    text = log.read_text(errors="replace")
    assert status == 1, text[-3000:]
    lines = [line for line in text.splitlines() if "CRITICAL/" in line]
    assert len(lines) == 1 and expected in lines[0] and "beat is not started" in lines[0], text[-3000:]
    assert "Traceback" not in text and "ready as" not in text
    return lines[0]


@pytest.fixture
def limited_user(prefix: str) -> Iterator[str]:
    """A RabbitMQ user who may use every name but the prefix's: as if anarchon_prefix were outside
    the permissions given."""
    need_rabbitmqctl()
    user = f"anarchon-{prefix.rstrip('.')}"
    assert rabbitmqctl("add_user", user, "s3cret")
    try:
        assert rabbitmqctl("set_permissions", "-p", "/", user, f"^(?!{prefix})", ".*", ".*")
        yield user
    finally:
        rabbitmqctl("delete_user", user)


@pytest.mark.timeout(120)
def test_missing_permissions_stop_beat_in_one_line_naming_them(
    beat_env: dict[str, str], tmp_path: Path, limited_user: str, prefix: str
) -> None:
    log = tmp_path / "beat.log"
    beat = start_beat(dict(beat_env, HISTORY_APP_BACKEND=url_with(user=limited_user, password="s3cret")), log)
    try:
        status = beat.wait(60)
    finally:
        kill(beat)
    text = log.read_text(errors="replace")
    assert status == 1, text[-3000:]
    [line] = [line for line in text.splitlines() if "CRITICAL/" in line]
    assert f"refuses user {limited_user!r} the gate queues named {prefix}*" in line
    assert "rabbitmqctl set_permissions" in line
    assert "ready as" not in text and "Traceback" not in text and "s3cret" not in text


@pytest.mark.timeout(120)
def test_a_broker_missing_at_start_is_waited_for(
    beat_env: dict[str, str], broker_url: str, prefix: str, tmp_path: Path
) -> None:
    port = free_port()
    log = tmp_path / "beat.log"
    beat = start_beat(dict(beat_env, HISTORY_APP_BACKEND=f"amqp://guest:guest@127.0.0.1:{port}//"), log)
    proxy = None
    try:
        seen = wait_for(log, "runs are not claimed until it answers", beat)
        assert "guest:guest@" not in log.read_text()
        proxy = Proxy(port=port)  # the broker "comes back"
        wait_for(log, "won, sent", beat, after=seen)
        assert beat.poll() is None  # it never exited
        assert sent_slots(broker_url, f"{prefix}tasks")
    finally:
        kill(beat)
        if proxy is not None:
            proxy.close()


@pytest.mark.timeout(120)
def test_a_broker_silent_at_start_is_waited_for(
    beat_env: dict[str, str], broker_url: str, prefix: str, tmp_path: Path
) -> None:
    proxy = Proxy()
    proxy.stall()  # TCP connects; the broker never answers and never closes (a black hole)
    log = tmp_path / "beat.log"
    # Connection attempts of 2 s (the default is 4 s): start-up gives up on the silent broker sooner.
    beat = start_beat(dict(beat_env, HISTORY_APP_BACKEND=proxy.url(), HISTORY_APP_CONNECT_TIMEOUT="2"), log)
    try:
        seen = wait_for(log, "runs are not claimed until it answers", beat)
        proxy.resume()
        wait_for(log, "won, sent", beat, after=seen)
        assert beat.poll() is None
        assert sent_slots(broker_url, f"{prefix}tasks")
    finally:
        kill(beat)
        proxy.close()


@pytest.mark.exclusive  # cuts every client's connection
@pytest.mark.timeout(240)
def test_beats_reconnect_by_themselves_when_every_connection_is_cut(
    beat_env: dict[str, str], broker_url: str, prefix: str, tmp_path: Path
) -> None:
    need_rabbitmqctl()
    cuts = 3
    fleet = Fleet(tmp_path, [dict(beat_env, HISTORY_APP_EVERY="1")] * 3)
    try:
        fleet.wait_ready()
        fleet.wait_any("won, sent")
        for _ in range(cuts):
            time.sleep(3)
            close_all_connections()  # as `rabbitmqctl close_all_connections` does to every client
            after = fleet.offsets()  # (rabbitmqctl takes a moment: what was logged meanwhile came before the cut)
        fleet.wait_any("won, sent", after=after)  # claiming and sending again after the last cut
        time.sleep(3)
        fleet.stop()
    finally:
        fleet.kill()
    # A cut can lose at most the run whose send it interrupts; a claim it interrupts is made again.
    assert_each_run_once(sent_slots(broker_url, f"{prefix}tasks"), allowed_missing=cuts)


@pytest.mark.exclusive  # stops RabbitMQ
@pytest.mark.timeout(400)
def test_beats_claim_again_after_a_broker_restart(
    beat_env: dict[str, str], broker_url: str, prefix: str, tmp_path: Path
) -> None:
    need_rabbitmqctl()
    fleet = Fleet(tmp_path, [dict(beat_env, HISTORY_APP_EVERY="1")] * 3)
    try:
        fleet.wait_ready()
        fleet.wait_any("won, sent")
        with broker_stopped():  # started again even if this test fails
            time.sleep(5)  # runs due now cannot be claimed by anyone
            after = fleet.offsets()
        fleet.wait_any("won, sent", after=after)
        time.sleep(3)
        fleet.stop()
    finally:
        fleet.kill()
    slots = sent_slots(broker_url, f"{prefix}tasks")
    assert [slot for slot, n in Counter(slots).items() if n > 1] == [], "runs sent twice"
    outage_lines = [fleet.text(n).count("is unavailable (") for n in range(3)]
    assert max(outage_lines) == 1, f"one line per outage, not per attempt: {outage_lines}"
    for n in range(3):
        assert "guest:guest@" not in fleet.text(n)


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "slot_ttl_ms, lead_ms, max_late_ms, within_bound",
    [
        (60_000, 10_000, 5_000, True),  # spread 4 s < slot_ttl_ms - lead_ms - jitter_ms - max_late_ms = 45 s
        (1_000, 0, 500, False),  # spread 4 s > 0.5 s: the bound is real, a late clock runs slots again
    ],
)
def test_clock_skew_within_the_documented_bound_still_runs_each_slot_once(
    beat_env: dict[str, str],
    broker_url: str,
    prefix: str,
    tmp_path: Path,
    slot_ttl_ms: int,
    lead_ms: int,
    max_late_ms: int,
    within_bound: bool,
) -> None:
    skews = [2_000, 0, -2_000]  # ms ahead of the true time; the last instance is behind
    env = dict(
        beat_env,
        HISTORY_APP_EVERY="1",
        HISTORY_APP_SLOT_TTL_MS=str(slot_ttl_ms),
        HISTORY_APP_LEAD_MS=str(lead_ms),
        HISTORY_APP_MAX_LATE_MS=str(max_late_ms),
    )
    fleet = Fleet(tmp_path, [dict(env, HISTORY_APP_SKEW_MS=str(skew)) for skew in skews], app="tests.apps.skewed_app")
    try:
        fleet.wait_ready()
        fleet.wait_any("won, sent")
        time.sleep(8)
        fleet.stop()
    finally:
        fleet.kill()
    slots = sent_slots(broker_url, f"{prefix}tasks")
    if within_bound:
        assert_each_run_once(slots)
        # The instance 4 s behind the first really raced for the same runs, and lost them.
        assert ": lost" in fleet.text(2)
    else:
        assert [slot for slot, n in Counter(slots).items() if n > 1], "expected runs sent twice past the bound"


@pytest.mark.timeout(120)
def test_a_rolling_deploy_that_changes_a_time_zone_is_reported_by_both_sides(
    beat_env: dict[str, str], tmp_path: Path
) -> None:
    fleet = Fleet(tmp_path, [beat_env, dict(beat_env, HISTORY_APP_FINE_TZ="Europe/Paris")])
    try:
        fleet.wait_ready()
        needle = "anarchon: job 'fine' is defined differently by instance"
        for n in range(2):
            deadline = time.monotonic() + 30
            while needle not in fleet.text(n) and time.monotonic() < deadline:
                time.sleep(0.2)
        fleet.stop()
    finally:
        fleet.kill()
    old, new = fleet.text(0), fleet.text(1)
    assert "cron '0 3 * * *' Asia/Tokyo here, cron '0 3 * * *' Europe/Paris there" in old, old[-3000:]
    assert "cron '0 3 * * *' Europe/Paris here, cron '0 3 * * *' Asia/Tokyo there" in new, new[-3000:]
    for text in (old, new):
        assert text.count("is defined differently") == 1  # once, and only for the job that differs


@pytest.mark.timeout(120)
@pytest.mark.parametrize("store", ["rabbitmq", "sqlite"])
def test_a_run_due_while_every_beat_was_down_is_sent_by_the_first_one_back(
    beat_env: dict[str, str], tmp_path: Path, broker_url: str, prefix: str, store: str
) -> None:
    # No beat runs across a slot (a deploy that stops them all first, a node drain); one starts
    # 1 to 3 s after it, well within the run's lateness (15 s; the slot before is past its own): it
    # claims and sends that run, since the job existed then (a beat ran it before).
    every_ms = 20_000
    env = dict(beat_env, HISTORY_APP_EVERY=str(every_ms // 1000), HISTORY_APP_MAX_LATE_MS="15000")
    if store == "sqlite":
        env["HISTORY_APP_BACKEND"] = f"sqlite:///{tmp_path / 'anarchon.db'}"
    log = tmp_path / "beat.log"
    before = start_beat(env, tmp_path / "before.log")
    try:
        wait_for(tmp_path / "before.log", "anarchon: ready as", before)
        before.send_signal(signal.SIGTERM)
        assert before.wait(30) == 0
    finally:
        kill(before)
    stopped = time.time() * 1000
    sent_slots(broker_url, f"{prefix}tasks")  # (drained: what it sent while it ran is not looked at)
    while not (1_000 <= time.time() * 1000 % every_ms <= 3_000 and time.time() * 1000 // every_ms * every_ms > stopped):
        time.sleep(0.05)
    missed = int(time.time() * 1000) // every_ms * every_ms
    beat = start_beat(env, log)
    try:
        wait_for(log, f"slot {missed + every_ms}: won, sent", beat)  # the first run due while it is up
        beat.send_signal(signal.SIGTERM)
        assert beat.wait(30) == 0
    finally:
        kill(beat)
    text = log.read_text(errors="replace")
    assert f"anarchon: job 'every' slot {missed}: won, sent" in text, text[-3000:]
    assert sent_slots(broker_url, f"{prefix}tasks") == [missed, missed + every_ms]
