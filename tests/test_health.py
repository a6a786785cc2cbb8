"""Health probes. The heartbeat's rules with a clock of our own (no service); then real beats: ready
on every backend and saying why, a loop wedged by a store that accepts and never answers fails its
liveness probe while the probe's port still answers, an outage is alive but not ready, a worker
running ``-B`` serves them too, a port taken is said and the beat runs on, and the command line's
``health``."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from celery import Celery

from anarchon_celery.errors import ConfigError
from anarchon_celery.health import UNANSWERED_S, Heartbeat
from anarchon_celery.settings import Settings

from .support.processes import start_celery
from .support.proxy import Proxy, free_port
from .support.stores import delete_postgres_rows, delete_redis_keys
from .test_faults import APP, kill, sent_slots, start_beat, wait_for

ROOT = Path(__file__).resolve().parent.parent


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_loop_that_moves_is_alive_and_one_that_stalls_is_not() -> None:
    clock = Clock()
    beat = Heartbeat(10.0, clock)
    assert beat.check(False, "Redis").live and not beat.check(False, "Redis").ready  # setting up
    assert "setting up" in beat.check(False, "Redis").reason
    clock.now += 11
    stalled = beat.check(False, "Redis")
    assert not stalled.live and "in its set-up" in stalled.reason and "10 s" in stalled.reason
    beat.set_up()
    assert beat.check(False, "Redis").live
    assert "first turn" in beat.check(False, "Redis").reason  # not ready before a turn ended
    beat.turning()
    beat.sleeping(300)  # a long sleep announced: alive through it, and for stall_s past its end
    clock.now += 305
    health = beat.check(False, "Redis")
    assert health.live and health.ready and health.reason.startswith("ready:") and "Redis answers" in health.reason
    clock.now += 6
    late = beat.check(False, "Redis")
    assert not late.live and not late.ready and "past its wake-up" in late.reason
    beat.turning()  # a long turn of batches is alive while each batch ends within stall_s
    for _ in range(5):
        clock.now += 9
        beat.progressed()
        assert beat.check(False, "Redis").live
    clock.now += 10.5  # a call that never returns
    wedged = beat.check(False, "Redis")
    assert not wedged.live and "in a turn" in wedged.reason and "moved for 10.5 s" in wedged.reason


def test_an_outage_or_a_stop_is_alive_but_not_ready() -> None:
    clock = Clock()
    beat = Heartbeat(10.0, clock)
    beat.set_up()
    beat.turning()
    beat.sleeping(1)
    away = beat.check(True, "Redis at redis://127.0.0.1:6379/0")
    assert away.live and not away.ready
    assert away.reason == "alive, not ready: Redis at redis://127.0.0.1:6379/0 does not answer; runs are not claimed"
    assert beat.check(False, "Redis").ready
    assert beat.check(False, "Redis", True) == beat.check(False, "Redis", True)
    assert (
        beat.check(False, "Redis", True).live
        and beat.check(False, "Redis", True).reason == "alive, not ready: stopping"
    )


@pytest.mark.parametrize(
    ("unanswered_s", "ready"), [(0.0, True), (UNANSWERED_S - 0.1, True), (UNANSWERED_S + 0.1, False), (30.0, False)]
)
def test_a_call_the_backend_has_not_answered_for_long_is_not_ready(unanswered_s: float, ready: bool) -> None:
    clock = Clock()
    beat = Heartbeat(60.0, clock)
    beat.set_up()
    beat.turning()
    beat.sleeping(1)
    clock.now += 1
    beat.turning()  # the loop waits in a call (a frozen store): alive, as long as it waits less than the stall
    health = beat.check(False, "Redis at redis://127.0.0.1:6379/0", unanswered_s=unanswered_s)
    assert (health.live, health.ready) == (True, ready)
    if not ready:
        assert health.reason == (
            f"alive, not ready: Redis at redis://127.0.0.1:6379/0 has not answered for {unanswered_s:.1f} s; "
            "runs wait for it"
        )


@pytest.mark.parametrize("port", [True, -1, 65536, "9808", 1.5])
def test_a_bad_metrics_port_is_refused(port: object) -> None:
    app = Celery("t", set_as_current=False)
    app.conf.anarchon_metrics_port = port
    with pytest.raises(ConfigError, match="anarchon_metrics_port must be a port number from 0 to 65535"):
        Settings.from_app(app)


def test_the_probe_settings_default_to_off() -> None:
    settings = Settings.from_app(Celery("t", set_as_current=False))
    assert (settings.metrics_port, settings.metrics_address, settings.health_stall_ms) == (None, "0.0.0.0", 60_000)
    app = Celery("t", set_as_current=False)
    app.conf.anarchon_health_stall_ms = 10
    with pytest.raises(ConfigError, match="anarchon_health_stall_ms must be an integer >= 1000"):
        Settings.from_app(app)


def test_the_metrics_count_what_the_scheduler_tells_them() -> None:
    """Claims by outcome, sends by trigger (a backup's as takeover), failures, lateness from the
    slot, catch-up, skips from history events, outages; and each job's next run at a scrape."""
    import datetime as dt
    import uuid

    from anarchon_celery import metrics
    from anarchon_celery.backends import Claim, Outcome
    from anarchon_celery.health import Health
    from anarchon_celery.history import encode_event
    from anarchon_celery.jobs import make_job
    from anarchon_celery.sending import Outgoing, SendOutcome

    counted = metrics.beat_metrics()
    name = f"m{uuid.uuid4().hex[:8]}"
    job = make_job(name, {"task": "t", "schedule": "0 3 * * *"}, Settings(), dt.timezone.utc)

    def value(metric: str, **labels: str) -> float:
        return metrics.REGISTRY.get_sample_value(metric, labels) or 0.0

    counted.claimed([Claim(name, 1000), Claim(name, 2000), Claim(name, 3000)], [Outcome.WON, Outcome.LOST, Outcome.WON])
    slot = 1_800_000_000_000
    counted.sends(
        [
            SendOutcome(Outgoing(job, slot, "a", "a", "schedule", slot + 60_000, 1), slot + 250, None),
            SendOutcome(Outgoing(job, slot, "b", "b", "schedule", slot + 60_000, 2), slot + 5_000, None),
            SendOutcome(Outgoing(job, slot, "c", "c", "catch_up", slot + 60_000, 1, 3), slot + 100, None),
            SendOutcome(Outgoing(job, slot, "d", "d", "schedule", slot + 60_000, 1), slot + 100, OSError("x")),
        ]
    )
    paused = encode_event("paused", run="r", job=name, at_ms=slot, slot=slot, instance="i")
    skipped = encode_event("skipped", run="s", job=name, at_ms=slot, slot=slot, reason="overlap", instance="i")
    counted.events([(name, paused, 5), (name, skipped, 5)])
    counted.too_late(name)
    assert value("anarchon_claims_total", anarchon_job=name, outcome="won") == 2
    assert value("anarchon_claims_total", anarchon_job=name, outcome="lost") == 1
    assert value("anarchon_runs_sent_total", anarchon_job=name, trigger="schedule") == 1
    assert value("anarchon_runs_sent_total", anarchon_job=name, trigger="takeover") == 1
    assert value("anarchon_runs_sent_total", anarchon_job=name, trigger="catch_up") == 1
    assert value("anarchon_send_failures_total", anarchon_job=name) == 1
    assert value("anarchon_runs_caught_up_total", anarchon_job=name) == 3
    assert value("anarchon_lateness_seconds_count", anarchon_job=name) == 3
    assert value("anarchon_lateness_seconds_sum", anarchon_job=name) == pytest.approx(5.35)
    assert value("anarchon_lateness_seconds_bucket", anarchon_job=name, le="0.25") == 2
    for reason in ("paused", "overlap", "too_late"):
        assert value("anarchon_runs_skipped_total", anarchon_job=name, reason=reason) == 1
    outages = value("anarchon_outages_total")
    counted.outage(True)
    counted.outage(True)
    counted.outage(False)
    assert value("anarchon_outages_total") == outages + 1
    counted.attach(lambda: ({name: job}, Health(True, False, "alive, not ready: stopping")))
    now = time.time()
    assert value("anarchon_next_run_timestamp_seconds", anarchon_job=name) == job.next_slot(int(now * 1000)) / 1000
    assert value("anarchon_last_sent_timestamp_seconds", anarchon_job=name) == (slot + 5_000) / 1000
    assert (value("anarchon_alive"), value("anarchon_ready"), value("anarchon_jobs")) == (1, 0, 1)
    assert value("anarchon_job_period_seconds", anarchon_job=name) == 86_400  # (a cron at 3:00, daily)
    assert 0 < value("anarchon_started_timestamp_seconds") <= time.time()
    # The series the alerts watch are there at 0 before their first event.
    fresh = f"m{uuid.uuid4().hex[:8]}"
    counted.known([fresh])
    assert metrics.REGISTRY.get_sample_value("anarchon_send_failures_total", {"anarchon_job": fresh}) == 0
    assert (
        metrics.REGISTRY.get_sample_value("anarchon_runs_sent_total", {"anarchon_job": fresh, "trigger": "takeover"})
        == 0
    )
    assert (
        metrics.REGISTRY.get_sample_value("anarchon_runs_skipped_total", {"anarchon_job": fresh, "reason": "too_late"})
        == 0
    )


@pytest.mark.parametrize(
    ("spec", "now", "period_h"),
    [
        ("0 9 * * 1-5", "2026-12-05T12:00", 72),  # a Saturday: from Friday 9:00 to Monday 9:00
        ("0 9 * * 1-5", "2026-12-08T12:00", 24),  # a Tuesday
        ("0 9-17 * * *", "2026-12-08T19:30", 16),  # overnight: from 17:00 to 9:00
        ("0 9-17 * * *", "2026-12-08T12:30", 1),
        ("0 3 29 2 *", "2026-12-08T12:00", 1461 * 24),  # none in 400 days back: its next two, 4 years apart
    ],
)
def test_a_jobs_period_runs_from_its_previous_run_to_its_next(spec: str, now: str, period_h: int) -> None:
    import datetime as dt

    from anarchon_celery import metrics
    from anarchon_celery.jobs import make_job
    from anarchon_celery.schedule import to_ms

    job = make_job("j", {"task": "t", "schedule": spec}, Settings(), dt.timezone.utc)
    at = to_ms(dt.datetime.fromisoformat(now).replace(tzinfo=dt.timezone.utc))
    slot, period_ms = metrics._Live(metrics.beat_metrics())._next_slots("j", job, at)
    assert slot == job.next_slot(at)
    assert period_ms == period_h * 3_600_000


# -- real beats -----------------------------------------------------------------------------------


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode().strip()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode().strip()


def _until(port: int, path: str, status: int, proc: subprocess.Popen[bytes], log: Path, timeout: float = 60) -> str:
    """Poll ``path`` until it answers ``status``; its line."""
    deadline = time.monotonic() + timeout
    seen: tuple[int, str] | None = None
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        try:
            seen = _get(port, path)
        except OSError as exc:  # not listening yet
            seen = (0, str(exc))
        if seen[0] == status:
            return seen[1]
        time.sleep(0.2)
    raise AssertionError(f"{path} never answered {status} within {timeout} s (last: {seen})")


def _health_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", APP, "anarchon", "health", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def stores(request: pytest.FixtureRequest, prefix: str, tmp_path: Path) -> Iterator[Callable[[str], str]]:
    """The backend URL of each kind of store, its records under ``prefix`` deleted afterwards."""
    made: list[tuple[str, str]] = []

    def url_of(kind: str) -> str:
        if kind == "rabbitmq":
            return ""  # the app's broker
        if kind == "sqlite":
            return f"sqlite:///{tmp_path / 'anarchon.db'}"
        url = request.getfixturevalue(f"{kind}_url")
        made.append((kind, url))
        return url

    yield url_of
    for kind, url in made:
        (delete_redis_keys if kind == "redis" else delete_postgres_rows)(url, prefix)


@pytest.mark.processes
@pytest.mark.broker
@pytest.mark.stores
@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind", ["rabbitmq", "redis", "postgres", "sqlite"])
def test_a_beat_says_it_is_alive_and_ready_and_a_pause_keeps_it_so(
    kind: str, stores: Callable[[str], str], beat_env: dict[str, str], tmp_path: Path
) -> None:
    port, env = _probed(beat_env, stores(kind))
    log = tmp_path / "beat.log"
    proc = start_beat(env, log)
    try:
        wait_for(log, f"anarchon: health probes served on http://0.0.0.0:{port}/healthz and /readyz", proc)
        line = _until(port, "/readyz", 200, proc, log)
        assert line.startswith("ready: the scheduler loop moved") and line.endswith(" answers"), line
        assert _get(port, "/healthz")[0] == 200
        assert _get(port, "/metricz")[0] == 404
        done = _health_cli(env, "--ready")
        assert (done.returncode, done.stdout.startswith("ready: ")) == (0, True), done
        paused = subprocess.run(
            [sys.executable, "-m", "celery", "-A", APP, "anarchon", "pause", "every", "--note", "maintenance"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert paused.returncode == 0, paused
        wait_for(log, ": paused", proc, after=len(log.read_text()))  # a run of it decided since
        assert _get(port, "/readyz")[0] == 200  # a paused job is healthy
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        kill(proc)
    text = log.read_text(errors="replace")
    assert "Traceback" not in text
    gone = _health_cli(env)
    assert gone.returncode == 1 and gone.stdout.startswith("not alive: nothing answers at http://127.0.0.1:"), gone


@pytest.fixture
def redis_proxy(redis_url: str, prefix: str) -> Iterator[Proxy]:
    """A proxy in front of the suite's Redis, the beat's keys under ``prefix`` deleted afterwards."""
    host, port = redis_url.split("//", 1)[1].split("/", 1)[0].split(":")
    proxy = Proxy(target=(host, int(port)))
    try:
        yield proxy
    finally:
        proxy.resume()
        proxy.close()
        delete_redis_keys(redis_url, prefix)


def _via(proxy: Proxy, redis_url: str) -> str:
    return f"redis://127.0.0.1:{proxy.port}/{redis_url.rsplit('/', 1)[1]}"


def _probed(beat_env: dict[str, str], backend: str = "", **settings: str) -> tuple[int, dict[str, str]]:
    """A free port, and the environment of a beat serving its probes there (a job every second,
    its runs decided in ``backend``: the broker when empty)."""
    port = free_port()
    env = dict(beat_env, HISTORY_APP_METRICS_PORT=str(port), HISTORY_APP_EVERY="1", **settings)
    if backend:
        env["HISTORY_APP_BACKEND"] = backend
    return port, env


@pytest.mark.processes
@pytest.mark.broker
@pytest.mark.stores
@pytest.mark.timeout(180)
def test_a_loop_wedged_by_a_store_that_never_answers_fails_liveness(
    redis_proxy: Proxy, redis_url: str, beat_env: dict[str, str], tmp_path: Path
) -> None:
    """Redis behind a proxy that stalls: the claim's read waits (the backend given 600 s), the loop
    is stuck in it, and the probe, answered by another thread, says so within the stall allowed."""
    port, env = _probed(
        beat_env,
        _via(redis_proxy, redis_url),
        HISTORY_APP_REDIS_TIMEOUT="600",
        HISTORY_APP_HEALTH_STALL_MS="3000",
    )
    log = tmp_path / "beat.log"
    proc = start_beat(env, log)
    try:
        _until(port, "/readyz", 200, proc, log)
        redis_proxy.stall()
        line = _until(port, "/healthz", 503, proc, log)
        assert line.startswith("not alive: the scheduler loop has not moved for "), line
        assert "in a turn (anarchon_health_stall_ms allows 3 s)" in line
        assert _get(port, "/readyz")[0] == 503
        done = _health_cli(env)
        assert done.returncode == 1 and done.stdout.startswith("not alive: the scheduler loop has not moved"), done
        # The store's connections cut: the claim fails, the loop moves again and claims once more.
        redis_proxy.resume()
        redis_proxy.cut()
        _until(port, "/healthz", 200, proc, log)
        _until(port, "/readyz", 200, proc, log)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        kill(proc)


@pytest.mark.processes
@pytest.mark.broker
@pytest.mark.stores
@pytest.mark.timeout(180)
def test_a_store_that_stops_answering_is_not_ready_at_once_and_its_outage_counts_from_then(
    redis_proxy: Proxy, redis_url: str, beat_env: dict[str, str], tmp_path: Path
) -> None:
    """Redis frozen for 20 s (its proxy stalls: no answer, no error, as a SIGSTOPped Redis): the
    beat is not ready once its first call left unanswered has waited UNANSWERED_S, before the call
    gives up (Redis's timeout of 5 s, then once more on a new connection), and ``health --ready``
    says so; the outage it logs once Redis answers again counts from that first call."""
    port, env = _probed(beat_env, _via(redis_proxy, redis_url))
    log = tmp_path / "beat.log"
    proc = start_beat(env, log)
    try:
        _until(port, "/readyz", 200, proc, log)
        redis_proxy.stall()
        frozen = time.monotonic()
        line = _until(port, "/readyz", 503, proc, log)
        assert line.startswith(f"alive, not ready: Redis at {_via(redis_proxy, redis_url)} (prefix "), line
        assert " has not answered for " in line and line.endswith(" s; runs wait for it"), line
        done = _health_cli(env, "--ready")
        assert done.returncode == 1 and done.stdout.startswith("alive, not ready: Redis at"), done
        time.sleep(max(0.0, 20 - (time.monotonic() - frozen)))
        redis_proxy.resume()
        thawed = time.monotonic()
        _until(port, "/readyz", 200, proc, log)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        kill(proc)
    text = log.read_text(errors="replace")
    back = re.search(r"Redis at \S+ \(prefix [^)]*\) is back after ([0-9.]+)s", text)
    assert back is not None, text[-3000:]
    # Counted from the first call left unanswered, made within a second of the freeze (a job every
    # second, and a look for changes every half second): not from when a call gave up.
    assert float(back.group(1)) >= thawed - frozen - 3, (back.group(0), thawed - frozen)
    assert text.count("claiming again on a new connection") <= 1, "one line for the outage, not one per claim"


@pytest.mark.processes
@pytest.mark.broker
@pytest.mark.stores
@pytest.mark.timeout(180)
def test_an_outage_is_alive_but_not_ready(
    redis_url: str, prefix: str, beat_env: dict[str, str], tmp_path: Path
) -> None:
    """Redis refusing connections (its proxy gone): the loop keeps turning, the beat is alive and
    not ready, saying which store does not answer; ready again once it is back."""
    host, redis_port = redis_url.split("//", 1)[1].split("/", 1)[0].split(":")
    proxy = Proxy(target=(host, int(redis_port)))
    port, env = _probed(beat_env, _via(proxy, redis_url))
    log = tmp_path / "beat.log"
    proc = start_beat(env, log)
    back: Proxy | None = None
    try:
        _until(port, "/readyz", 200, proc, log)
        proxy.close()
        proxy.cut()
        line = _until(port, "/readyz", 503, proc, log)
        assert line.startswith(f"alive, not ready: Redis at {_via(proxy, redis_url)} (prefix "), line
        assert line.endswith(" does not answer; runs are not claimed"), line
        assert _get(port, "/healthz")[0] == 200
        done = _health_cli(env, "--ready")
        assert done.returncode == 1 and done.stdout.startswith("alive, not ready: Redis at"), done
        time.sleep(3)  # a claim a second, each refused at once
        back = Proxy(target=(host, int(redis_port)), port=proxy.port)
        _until(port, "/readyz", 200, proc, log)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        kill(proc)
        proxy.close()
        if back is not None:
            back.close()
        delete_redis_keys(redis_url, prefix)
    # The outage is told once it starts, and when it ends: not a line for each claim made meanwhile.
    told = [
        line for line in log.read_text(errors="replace").splitlines() if "claiming again on a new connection" in line
    ]
    assert sum("INFO" in line for line in told) <= 1, told


@pytest.mark.processes
@pytest.mark.broker
@pytest.mark.timeout(180)
def test_a_worker_running_the_beat_serves_the_probes(beat_env: dict[str, str], tmp_path: Path) -> None:
    port, env = _probed(beat_env)
    log = tmp_path / "worker.log"
    args = ["worker", "-B", "--scheduler", "anarchon_celery.Scheduler", "-l", "info", "-c", "1", "--pidfile="]
    args += ["-s", str(tmp_path / "schedule")]
    proc = start_celery(args, log, env, app=APP, cwd=ROOT)
    try:
        line = _until(port, "/readyz", 200, proc, log, timeout=90)
        assert line.startswith("ready: "), line
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text(errors="replace")[-3000:]
    finally:
        kill(proc)


@pytest.mark.processes
@pytest.mark.broker
@pytest.mark.timeout(120)
def test_a_port_taken_is_said_and_the_beat_runs_on(beat_env: dict[str, str], tmp_path: Path) -> None:
    with socket.create_server(("0.0.0.0", 0)) as taken:
        port = taken.getsockname()[1]
        env = dict(beat_env, HISTORY_APP_METRICS_PORT=str(port))
        log = tmp_path / "beat.log"
        proc = start_beat(env, log)
        try:
            wait_for(log, "anarchon: ready as", proc)
            text = log.read_text(errors="replace")
            assert f"anarchon: health probes not served: 0.0.0.0:{port} cannot be bound" in text
            assert f"is another beat on this host using anarchon_metrics_port {port}? Give each its own port" in text
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
        finally:
            kill(proc)


def test_health_without_a_port_says_what_to_set(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = _health_cli(env)
    assert done.returncode == 1
    assert "anarchon_metrics_port is not set: each beat serves its health on that port (set it, or give --port)" in (
        done.stderr
    ), done


# -- metrics --------------------------------------------------------------------------------------


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``/metrics``: (name, labels) to value."""
    from prometheus_client.parser import text_string_to_metric_families

    status, text = _get(port, "/metrics")
    assert status == 200, text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text + "\n")
        for sample in family.samples
    }


def _total(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return sum(value for (found, got), value in samples.items() if found == name and set(labels.items()) <= set(got))


@pytest.mark.processes
@pytest.mark.broker
@pytest.mark.stores
@pytest.mark.timeout(180)
def test_the_metrics_of_two_beats_add_up_to_the_runs_sent(
    redis_url: str, prefix: str, beat_env: dict[str, str], broker_url: str, tmp_path: Path
) -> None:
    """Two beats share a job every second on Redis; once it is paused (no send after), their
    counters summed equal the task messages in the queue, and each run sent was timed once."""
    ports, envs = zip(*(_probed(beat_env, redis_url) for _ in range(2)))
    logs = [tmp_path / f"beat-{n}.log" for n in range(2)]
    procs = [start_beat(env, log) for env, log in zip(envs, logs)]
    try:
        for port, proc, log in zip(ports, procs, logs):
            _until(port, "/readyz", 200, proc, log)
        wait_for(logs[0], "won, sent", procs[0], timeout=60)
        time.sleep(4)
        paused = subprocess.run(
            [sys.executable, "-m", "celery", "-A", APP, "anarchon", "pause", "every"],
            cwd=ROOT,
            env=envs[0],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert paused.returncode == 0, paused
        offsets = [len(log.read_text()) for log in logs]
        deadline = time.monotonic() + 30
        while not any(": paused" in log.read_text()[offset:] for log, offset in zip(logs, offsets)):
            assert time.monotonic() < deadline, "no run recorded paused"
            time.sleep(0.2)
        time.sleep(1.5)  # (a send in progress when the pause came is over)
        scraped = [_scrape(port) for port in ports]
        sent = sum(_total(s, "anarchon_runs_sent_total", anarchon_job="every") for s in scraped)
        won = sum(_total(s, "anarchon_claims_total", anarchon_job="every", outcome="won") for s in scraped)
        lost = sum(_total(s, "anarchon_claims_total", anarchon_job="every", outcome="lost") for s in scraped)
        timed = sum(_total(s, "anarchon_lateness_seconds_count", anarchon_job="every") for s in scraped)
        skipped = sum(_total(s, "anarchon_runs_skipped_total", anarchon_job="every", reason="paused") for s in scraped)
        queued = [slot for slot in sent_slots(broker_url, f"{prefix}tasks")]
        assert sent == won == timed == len(queued) == len(set(queued)) > 2, (sent, won, timed, len(queued))
        assert lost >= 1  # two beats claimed the same runs
        assert skipped >= 1
        for samples in scraped:
            assert _total(samples, "anarchon_alive") == _total(samples, "anarchon_ready") == 1
            assert _total(samples, "anarchon_jobs") == 4
            assert _total(samples, "anarchon_next_run_timestamp_seconds", anarchon_job="every") > time.time() - 1
            assert _total(samples, "anarchon_backend_round_trip_seconds_count") >= 1
        latest = max(_total(s, "anarchon_last_sent_timestamp_seconds", anarchon_job="every") for s in scraped)
        assert max(queued) / 1000 <= latest < time.time()
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            assert proc.wait(30) == 0
    finally:
        for proc in procs:
            kill(proc)
        delete_redis_keys(redis_url, prefix)
