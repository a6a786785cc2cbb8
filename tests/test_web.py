"""The schedules page (``celery anarchon web``, ``anarchon_celery.web``). Its rules without a
service first: logins, form tokens and origins, loopback addresses, the edit form, the lateness
chart. Then real beats on every backend and the page as a real process, driven by a headless
Chromium: every job shown with its state, runs now, pauses, resumes and edits made with its
forms and found in the store, a stale edit refused; the requests it refuses; a store that does
not answer said on the page; and the refusal to serve beyond this host without a password."""

from __future__ import annotations

import base64
import datetime as dt
import io
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode
from zoneinfo import ZoneInfo

import pytest
from celery import Celery
from kombu import Connection, Exchange, Queue

import anarchon_celery
from anarchon_celery import ConfigError, Run
from anarchon_celery.schedule import to_ms
from anarchon_celery.web.actions import done_text, edit_changes
from anarchon_celery.web.app import WebApp
from anarchon_celery.web.auth import Guard, credentials, foreign_origin, host_name
from anarchon_celery.web.chart import lateness_chart
from anarchon_celery.web.render import duration
from anarchon_celery.web.server import is_loopback

from .apps.web_app import FOREIGN_JOB, RUNTIME_JOB, make
from .support.broker_control import PORT as RABBITMQ_PORT
from .support.processes import stop
from .support.web import browser, start_web, web_port
from .test_faults import start_beat, wait_for

ROOT = Path(__file__).resolve().parent.parent
APP = "tests.apps.web_app"
PASSWORD = "correct horse battery staple"
BASE_JOBS = ["audit-export", FOREIGN_JOB, RUNTIME_JOB, "nightly-report", "refresh_prices"]


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


# -- the rules, without a service -----------------------------------------------------------------


@pytest.mark.parametrize(
    "header, login",
    [
        (_basic("admin", PASSWORD), "admin"),
        (_basic("admin", PASSWORD + " "), None),
        (_basic("admin", PASSWORD[:-1]), None),
        (_basic("root", PASSWORD), None),
        (_basic("", ""), None),
        ("Bearer " + PASSWORD, None),
        ("Basic not-base64!", None),
        ("Basic " + base64.b64encode(b"no colon").decode(), None),
        ("", None),
    ],
)
def test_a_login_is_the_user_and_the_whole_password(header: str, login: str | None) -> None:
    guard = Guard(user="admin", password=PASSWORD)
    assert guard.login({"HTTP_AUTHORIZATION": header}) == login


def test_credentials_are_read_from_basic_only() -> None:
    assert credentials({"HTTP_AUTHORIZATION": _basic("ann", "a:b:c")}) == ("ann", "a:b:c")  # ':' in a password
    assert credentials({}) is None


@pytest.mark.parametrize(
    "password, open_pages, method, needed",
    [
        (None, False, "POST", False),
        (PASSWORD, False, "GET", True),
        (PASSWORD, False, "POST", True),
        (PASSWORD, True, "GET", False),
        (PASSWORD, True, "POST", True),
    ],
)
def test_who_must_sign_in(password: str | None, open_pages: bool, method: str, needed: bool) -> None:
    assert Guard(user="admin", password=password, open_pages=open_pages).needs_login(method) is needed


def test_a_form_token_is_the_process_secrets_and_nothing_else() -> None:
    guard = Guard(user="admin", password=None)
    assert guard.token_ok(guard.token()) and re.fullmatch(r"[0-9a-f]{64}", guard.token())
    other = guard.token()[:-1] + ("1" if guard.token().endswith("0") else "0")  # (one hex digit changed)
    assert not guard.token_ok(None) and not guard.token_ok("") and not guard.token_ok(other)
    assert not Guard(user="admin", password=None).token_ok(guard.token())  # another process's
    shared = Guard(user="admin", password=None, secret=b"k" * 32)
    assert Guard(user="x", password="y", secret=b"k" * 32).token_ok(shared.token())  # processes sharing a secret


@pytest.mark.parametrize(
    "origin, host, foreign",
    [
        (None, "127.0.0.1:8077", None),
        ("http://127.0.0.1:8077", "127.0.0.1:8077", None),
        ("https://cron.example.com", "cron.example.com", None),  # TLS ended by a proxy in front
        ("http://evil.example", "127.0.0.1:8077", "http://evil.example"),
        ("http://127.0.0.1:8078", "127.0.0.1:8077", "http://127.0.0.1:8078"),
        ("null", "127.0.0.1:8077", "null"),
    ],
)
def test_a_post_from_another_site_is_told_by_its_origin(origin: str | None, host: str, foreign: str | None) -> None:
    environ = {"HTTP_HOST": host, **({"HTTP_ORIGIN": origin} if origin is not None else {})}
    assert foreign_origin(environ) == foreign


@pytest.mark.parametrize(
    "header, name",
    [
        ("127.0.0.1:8077", "127.0.0.1"),
        ("LocalHost:8077", "localhost"),
        ("[::1]:8077", "::1"),
        ("::1", "::1"),
        ("evil.example", "evil.example"),
    ],
)
def test_the_host_a_request_names_is_read_without_its_port(header: str, name: str) -> None:
    assert host_name({"HTTP_HOST": header}) == name


def test_a_name_the_page_was_not_started_for_is_refused_before_anything_else() -> None:
    """DNS rebinding: a website's own name pointed at 127.0.0.1 reaches a page open there, and its
    Origin matches its Host; the page answers only to the names it was started for."""
    app = Celery("rebound", set_as_current=False)  # (never read: refused or let in, no job is)
    page = WebApp(app, Guard(user="admin", password=None), frozenset({"localhost", "127.0.0.1", "::1"}))
    form = b"token=stale"
    for host, status in (("evil.example:8077", 400), ("127.0.0.1:8077", 403), ("[::1]:8077", 403)):
        environ = {
            "REQUEST_METHOD": "POST",
            "PATH_INFO": "/jobs/nightly/run-now",
            "HTTP_HOST": host,
            "HTTP_ORIGIN": f"http://{host}",
            "CONTENT_LENGTH": str(len(form)),
            "wsgi.input": io.BytesIO(form),
        }
        assert page.respond(environ).status == status, host  # (403: let in, then its token refused)


@pytest.mark.parametrize(
    "host, local",
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        ("10.1.2.3", False),
        ("no-such-host.invalid", False),
    ],
)
def test_only_this_hosts_loopback_is_local(host: str, local: bool) -> None:
    assert is_loopback(host) is local


ENTRY = {"task": "shop.report", "schedule": 3600, "args": ["customer-42"], "jitter_ms": 0}


@pytest.mark.parametrize(
    "form, changes",
    [
        ({"task": "shop.report", "schedule": "3600", "args": '["customer-42"]', "jitter_ms": "0"}, {}),
        ({"schedule": "1800"}, {"schedule": 1800}),
        ({"schedule": "0.5"}, {"schedule": 0.5}),
        ({"schedule": " 30 6 * * * "}, {"schedule": "30 6 * * *"}),
        ({"schedule": '{"crontab": "0 9 1-7 * 1"}'}, {"schedule": {"crontab": "0 9 1-7 * 1"}}),
        ({"args": "", "kwargs": ""}, {"args": None}),  # taken out; kwargs was not there
        ({"kwargs": '{"format": "pdf"}', "tz": "Asia/Tokyo"}, {"kwargs": {"format": "pdf"}, "tz": "Asia/Tokyo"}),
        ({"jitter_ms": "250", "overlap": "skip"}, {"jitter_ms": 250, "overlap": "skip"}),
        ({}, {}),  # a field the form lacks is left as it is
    ],
)
def test_the_edit_form_changes_the_keys_it_changes(form: dict[str, str], changes: dict[str, Any]) -> None:
    assert edit_changes("j", ENTRY, form) == changes


@pytest.mark.parametrize(
    "form, message",
    [
        ({"task": " "}, "job 'j': task cannot be empty: a job needs one"),
        ({"schedule": ""}, "job 'j': schedule cannot be empty"),
        ({"args": "[1,"}, "job 'j': args '[1,' is not JSON"),
        ({"args": '{"a": 1}'}, "job 'j': args '{\"a\": 1}' is not a JSON list"),
        ({"kwargs": "[1]"}, "job 'j': kwargs '[1]' is not a JSON object"),
        ({"max_late_ms": "5s"}, "job 'j': max_late_ms must be a whole number, not '5s'"),
    ],
)
def test_an_edit_form_that_cannot_be_read_says_which_field(form: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        edit_changes("j", ENTRY, form)


def test_the_edit_form_refuses_arguments_that_do_not_fit_the_task() -> None:
    from anarchon_celery.control import configure
    from anarchon_celery.web.actions import act

    app = Celery("shop", broker="memory://", set_as_current=False)
    app.conf.anarchon_backend = anarchon_celery.MemoryBackend()

    @app.task(name="shop.report", shared=False)
    def report(kind: str) -> None: ...

    kept = anarchon_celery.add_job(app, "j", **ENTRY)
    deployment = configure(app)
    form = {"version": "1", "args": '["customer-42", "pdf"]'}
    with pytest.raises(ConfigError, match=r"^job 'j': its arguments do not fit task 'shop.report'\(kind\): called as"):
        act("edit", app, deployment, "j", form, "ann")
    assert anarchon_celery.runtime_jobs(app)["j"] == kept  # the old definition stays


def test_what_an_action_did_is_said_from_known_words_only() -> None:
    run = "0b0c4b8e-8f1e-4a57-9d0e-5f3b8e6d2a11"
    assert done_text("j", {"done": "run-now", "run": run}) == f"Sent job j now: run {run} (trigger manual)."
    assert done_text("j", {"done": "edited", "version": "3"}).startswith("Changed job j: version 3.")  # type: ignore[union-attr]
    assert done_text("j", {"done": "run-now", "run": "<script>alert(1)</script>"}) is None
    assert done_text("j", {"done": "edited", "version": "3<b>"}) is None
    assert done_text("j", {"done": "you were hacked"}) is None


@pytest.mark.parametrize(
    "ms, text",
    [(0, "0 ms"), (250, "250 ms"), (4_210, "4.2 s"), (185_000, "3 min 5 s"), (7_500_000, "2 h 5 min"), (-40, "-40 ms")],
)
def test_a_duration_reads_as_a_person_says_it(ms: int, text: str) -> None:
    assert duration(ms) == text


def _run(n: int, trigger: str | None, late: int | None, status: str = "succeeded") -> Run:
    slot = 1_800_000_000_000 + n * 60_000
    sent = None if late is None else slot + late
    return Run(f"run-{n}", "j", status, trigger, slot, f"run-{n}", "t", "i", None, sent, None, None, None, None)


def test_the_lateness_chart_draws_a_bar_for_each_scheduled_run_sent() -> None:
    runs = [
        _run(6, "schedule", 120),
        _run(5, "manual", 0),
        _run(4, "catch_up", 3_600_000),  # sent long after its slot, on purpose: not drawn
        _run(3, "schedule", 4_800, "failed"),
        _run(2, "schedule", None, "skipped"),  # never sent
        _run(1, "buffered", 900),
    ]
    svg = lateness_chart(runs, ZoneInfo("Asia/Tokyo"))
    bars = re.findall(r'<rect class="run ?(\w*)" [^>]*height="([\d.]+)"><title>([^<]*)</title>', svg)
    assert [title.rsplit("(run ", 1)[1] for _, _, title in bars] == ["run-1)", "run-3)", "run-6)"]  # oldest first
    assert [tone for tone, _, _ in bars] == ["good", "bad", "good"]
    heights = [float(height) for _, height, _ in bars]
    assert heights[1] > heights[0] > heights[2] > 0  # 4.8 s, 900 ms, 120 ms on one scale
    assert "sent 4.8 s late, failed" in bars[1][2] and "JST" in bars[1][2]
    assert ">5.0 s</text>" in svg  # the scale's top: 5 s for a highest of 4.8 s
    assert "median 900 ms, highest 4.8 s" in svg
    assert "<script" not in svg
    assert "nothing to chart" in lateness_chart([_run(1, "manual", 5)], ZoneInfo("UTC"))


# -- real beats and the page ----------------------------------------------------------------------


@pytest.fixture
def deployment(
    prefix: str, broker_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Callable[[str], dict[str, str]]:
    """The environment of tests.apps.web_app with its runs decided ``where``: RabbitMQ (the
    broker), a SQLite file of the test's, or the suite's Redis or PostgreSQL under a prefix of the
    test's (deleted after it, as the broker's queues under ``prefix`` are)."""
    with Connection(broker_url) as conn:  # the task queue, declared as a worker would
        Queue(f"{prefix}tasks", Exchange(f"{prefix}tasks"), f"{prefix}tasks")(conn.default_channel).declare()

    def environment(where: str) -> dict[str, str]:
        env = dict(os.environ, PYTHONPATH=str(ROOT), WEB_APP_PREFIX=prefix)
        env.pop("ANARCHON_WEB_PASSWORD", None)
        if where == "sqlite":
            env["WEB_APP_BACKEND"] = f"sqlite:///{tmp_path / 'anarchon.db'}"
        elif where in ("redis", "postgres"):
            env["WEB_APP_BACKEND"] = request.getfixturevalue(f"{where}_url")
            env["WEB_APP_STORE_PREFIX"] = request.getfixturevalue(f"{where}_prefix")
        return env

    return environment


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    """The processes a test starts, each stopped at its end (SIGTERM, then SIGKILL), whether or
    not it got as far as being ready."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in reversed(procs):
        stop(proc)


def _serve(
    env: dict[str, str], tmp_path: Path, started: list[subprocess.Popen[bytes]], *args: str, name: str = "web"
) -> tuple[subprocess.Popen[bytes], int, Path]:
    log = tmp_path / f"{name}.log"
    proc = start_web(env, log, *args, app=APP)
    started.append(proc)
    return proc, web_port(log, proc), log


def _password_file(tmp_path: Path) -> str:
    path = tmp_path / "web-password"
    path.write_text(PASSWORD + "\n")
    return str(path)


def _store_port(env: dict[str, str]) -> int | None:
    """The port of the service the runs are decided in (None: a SQLite file)."""
    backend = env.get("WEB_APP_BACKEND", "")
    if backend.startswith("sqlite"):
        return None
    if not backend:
        return RABBITMQ_PORT
    found = re.search(r"://(?:[^@/]*@)?[^:/]+:(\d+)", backend)
    assert found, backend
    return int(found.group(1))


def _connections(pid: int, port: int | None, env: dict[str, str]) -> list[str]:
    """What process ``pid`` holds open to the store: its TCP connections to ``port``, or the
    SQLite file."""
    fds = Path(f"/proc/{pid}/fd")
    links = []
    for fd in fds.iterdir():
        try:
            links.append(os.readlink(fd))
        except OSError:  # closed meanwhile
            continue
    if port is None:
        path = env["WEB_APP_BACKEND"].removeprefix("sqlite:///")
        return [link for link in links if link.startswith(path)]
    inodes = {link[8:-1] for link in links if link.startswith("socket:[")}
    held = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            remote_port, state, inode = int(fields[2].rsplit(":", 1)[1], 16), fields[3], fields[9]
            if inode in inodes and remote_port == port and state == "01":  # ESTABLISHED
                held.append(line)
    return held


def _rows(page: Any) -> dict[str, list[str]]:
    """The index's rows, by job: each cell's text."""
    rows = {}
    for row in page.locator("table.jobs tbody tr").all():
        cells = row.locator("td").all_inner_texts()
        rows[cells[0].splitlines()[0]] = cells
    return rows


def _shown(page: Any, url: str, check: Callable[[], bool], what: str, timeout: float = 60) -> None:
    """Load ``url`` until ``check`` passes on it (the beats write what it looks for)."""
    deadline = time.monotonic() + timeout
    while True:
        page.goto(url)
        if check():
            return
        assert time.monotonic() < deadline, f"{what} not shown within {timeout} s:\n{page.inner_text('main')}"
        time.sleep(0.5)


def _post(page: Any, button: str) -> Any:
    """Click a form's button; the response of the page it leads to."""
    with page.expect_navigation() as navigation:
        page.get_by_role("button", name=button, exact=True).click()
    return navigation.value


@pytest.mark.processes
@pytest.mark.broker
@pytest.mark.timeout(300)
@pytest.mark.parametrize("where", ["rabbitmq", "redis", "postgres", "sqlite"])
def test_the_page_shows_every_job_and_its_forms_act_on_them(
    where: str,
    deployment: Callable[[str], dict[str, str]],
    started: list[subprocess.Popen[bytes]],
    tmp_path: Path,
) -> None:
    env = deployment(where)
    app = make(env)
    anarchon_celery.add_job(app, RUNTIME_JOB, task="shop.report", schedule=3600, args=["customer-42"], by="ann")
    anarchon_celery.add_job(make(dict(env, WEB_APP_EXTRA="1")), FOREIGN_JOB, task="shop.import_legacy", schedule=60)
    beat_log = tmp_path / "beat.log"
    beat = start_beat(env, beat_log, app=APP)
    started.append(beat)
    web, port, web_log = _serve(env, tmp_path, started, "--password-file", _password_file(tmp_path))
    site = f"http://127.0.0.1:{port}"
    store = where != "rabbitmq"
    wait_for(beat_log, "job 'refresh_prices' slot", beat)
    with browser() as chromium:
        page = chromium.new_context(http_credentials={"username": "admin", "password": PASSWORD}).new_page()

        # The index: every job, of the code and runtime ones, the one this app cannot run with why.
        _shown(page, site + "/", lambda: _rows(page)["refresh_prices"][7] == "sent", "a run of refresh_prices")
        if store:  # its first run sent and never started (no worker): the job stays busy
            _shown(page, site + "/", lambda: "busy" in _rows(page)["sync-ledger"][4], "sync-ledger busy")
        rows = _rows(page)
        assert sorted(rows) == sorted(BASE_JOBS + (["sync-ledger"] if store else []))
        assert rows[RUNTIME_JOB][1:4] == ["runtime v1", "every 3600s", "Europe/Paris"]
        assert rows["nightly-report"][1:4] == ["code", "cron '30 2 * * *' Europe/Paris", "Europe/Paris"]
        assert " 02:30:00 " in rows["nightly-report"][5]
        assert rows["refresh_prices"][4] == "active"
        assert rows[FOREIGN_JOB][1] == "runtime v1"
        assert "not runnable here" in rows[FOREIGN_JOB][4]
        assert "task 'shop.import_legacy' is not registered" in rows[FOREIGN_JOB][4]
        if store:
            assert "was sent, no worker started it yet" in rows["sync-ledger"][4]
        assert "Traceback" not in page.content()

        # A job's page: its next runs, its runs from the history and their lateness.
        job_url = f"{site}/jobs/refresh_prices"
        page.goto(job_url)
        assert page.locator("table.next tbody tr").count() == 10
        first, second = (page.locator("table.next tbody tr").nth(i).locator("td").all_inner_texts() for i in (0, 1))
        assert first[1].endswith(("CET", "CEST")) and first[2].endswith("UTC")
        assert to_ms(dt.datetime.fromisoformat(second[2][:19] + "+00:00")) % 2_000 == 0
        runs = page.locator("table.runs tbody tr")
        scheduled = [i for i in range(runs.count()) if runs.nth(i).locator("td").nth(1).inner_text() == "schedule"]
        assert scheduled
        assert page.locator("svg.chart rect.run").count() == len(scheduled)
        late = runs.nth(scheduled[0]).locator("td").nth(5).inner_text()
        assert re.fullmatch(r"-?\d+ ms|-?\d+\.\d s", late), late

        # Run now: the run is sent, recorded manual, and shown.
        answer = _post(page, "Run now")
        assert answer.status == 200 and "?done=run-now" in page.url
        said = re.search(
            r"Sent job refresh_prices now: run (\S+) \(trigger manual\)\.", page.inner_text(".notice.good")
        )
        assert said, page.inner_text("main")
        run_id = said.group(1)
        manual = [run for run in anarchon_celery.history(app, "refresh_prices") if run.run_id == run_id]
        assert [(run.trigger, run.status) for run in manual] == [("manual", "sent")]
        assert page.locator(f'.run-id[title="{run_id}"]').count() == 1

        # Pause, with a note and an end, signed in: kept in the store, shown, and obeyed by the beat.
        until = (dt.datetime.now(ZoneInfo("Europe/Paris")) + dt.timedelta(days=1)).replace(microsecond=0)
        page.fill("input[name=note]", "ledger migration")
        page.fill("input[name=until]", until.strftime("%Y-%m-%dT%H:%M:%S"))
        logged = len(beat_log.read_text(errors="replace"))
        assert _post(page, "Pause").status == 200
        assert page.inner_text(".notice.good").startswith("Paused job refresh_prices for every instance")
        kept = anarchon_celery.paused(app)["refresh_prices"]
        assert (kept.note, kept.by, kept.until_ms) == ("ledger migration", "admin@127.0.0.1", to_ms(until))
        assert "by admin@127.0.0.1" in page.inner_text("p.state") and "ledger migration" in page.inner_text("p.state")
        wait_for(beat_log, "job 'refresh_prices' slot", beat, after=logged)
        wait_for(beat_log, "the job is paused; not sent (recorded paused)", beat, after=logged)

        # Resume.
        assert _post(page, "Resume").status == 200
        assert page.inner_text(".notice.good").startswith("Resumed job refresh_prices")
        assert "refresh_prices" not in anarchon_celery.paused(app)
        assert page.locator("h1 .badge", has_text="paused").count() == 0

        # Edit the runtime job: its version moves; an invalid change is refused, the job as it was.
        runtime_url = f"{site}/jobs/{RUNTIME_JOB}"
        page.goto(runtime_url)
        page.locator("details.edit summary").click()
        page.fill("input[name=schedule]", "1800")
        page.fill("input[name=kwargs]", '{"format": "pdf"}')
        assert _post(page, "Save").status == 200
        assert page.inner_text(".notice.good").startswith(f"Changed job {RUNTIME_JOB}: version 2.")
        kept_def = anarchon_celery.runtime_jobs(app)[RUNTIME_JOB]
        assert kept_def.version == 2 and kept_def.by == "admin@127.0.0.1"
        assert dict(kept_def.entry) == {
            "task": "shop.report",
            "schedule": 1800,
            "args": ["customer-42"],
            "kwargs": {"format": "pdf"},
        }
        assert "every 1800s" in page.inner_text("table.definition")
        page.locator("details.edit summary").click()
        page.fill("input[name=schedule]", "61 * * * *")
        assert _post(page, "Save").status == 400
        refused = page.locator(".notice.bad").all_inner_texts()
        assert len(refused) == 1 and refused[0].startswith(f"job '{RUNTIME_JOB}': "), refused
        assert page.input_value("input[name=schedule]") == "61 * * * *"  # what was sent, to fix
        assert anarchon_celery.runtime_jobs(app)[RUNTIME_JOB].version == 2

        # A stale version is a conflict: nothing is overwritten.
        page.goto(runtime_url)
        page.locator("details.edit summary").click()
        page.fill("input[name=schedule]", "900")
        anarchon_celery.update_job(app, RUNTIME_JOB, args=["customer-43"], by="bob")  # meanwhile: version 3
        assert _post(page, "Save").status == 409
        text = page.inner_text("main")
        assert f"Conflict: job '{RUNTIME_JOB}' is at version 3, not 2: it was changed meanwhile" in text
        assert "Your change, not made: schedule '900'" in text
        assert page.input_value("input[name=version]") == "3"
        final = anarchon_celery.runtime_jobs(app)[RUNTIME_JOB]
        assert (final.version, final.entry["schedule"], final.entry["args"]) == (3, 1800, ["customer-43"])

        # A job without history, a runtime job this app cannot run, and a job that does not exist.
        page.goto(f"{site}/jobs/audit-export")
        assert "This job keeps no history (history_size 0)" in page.inner_text("main")
        page.goto(f"{site}/jobs/{FOREIGN_JOB}")
        said = page.inner_text(".notice.bad")
        assert said.startswith(f"runtime job '{FOREIGN_JOB}' cannot be run by this app: job '{FOREIGN_JOB}': task"), (
            said
        )
        assert page.get_by_role("button", name="Run now").count() == 0
        assert page.locator("details.edit").count() == 1
        missing = page.goto(f"{site}/jobs/refresh_price")
        assert missing is not None and missing.status == 404
        assert "no job named 'refresh_price'. Did you mean 'refresh_prices'?" in page.inner_text("main")

    # Every request closed what it opened (as the beat, which keeps its own, shows they are seen).
    assert _connections(beat.pid, _store_port(env), env)
    assert _connections(web.pid, _store_port(env), env) == []
    stop(web)
    stop(beat)
    assert (web.returncode, beat.returncode) == (0, 0)
    output = web_log.read_text(errors="replace")
    assert "anarchon web: stopped" in output and "Traceback" not in output
    assert PASSWORD not in output


def _request(
    url: str, fields: dict[str, str] | None = None, *, auth: str | None = None, origin: str | None = None
) -> tuple[int, dict[str, str], str]:
    """A GET (or a POST of ``fields``) that follows no redirect: its status, headers and body."""

    class Stay(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any) -> None:
            return None

    data = None if fields is None else urlencode(fields).encode()
    request = urllib.request.Request(url, data=data, method="GET" if data is None else "POST")
    if auth is not None:
        request.add_header("Authorization", auth)
    if origin is not None:
        request.add_header("Origin", origin)
    try:
        with urllib.request.build_opener(Stay).open(request, timeout=30) as answer:
            return answer.status, dict(answer.headers), answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()


@pytest.mark.processes
@pytest.mark.broker
@pytest.mark.timeout(180)
def test_actions_need_a_login_and_a_form_of_this_site(
    deployment: Callable[[str], dict[str, str]], started: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    env = deployment("sqlite")
    app = make(env)
    web, port, log = _serve(env, tmp_path, started, "--password-file", _password_file(tmp_path))
    site = f"http://127.0.0.1:{port}"
    good = _basic("admin", PASSWORD)
    status, _, body = _request(f"{site}/jobs/nightly-report")  # on this host, the pages are open
    assert status == 200
    token = re.search(r'name="token" value="([0-9a-f]{64})"', body)
    assert token, body
    pause = f"{site}/jobs/nightly-report/pause"
    fields = {"token": token.group(1), "note": "n"}
    status, headers, _ = _request(pause, fields)
    assert status == 401 and headers["WWW-Authenticate"].startswith('Basic realm="anarchon"')
    assert _request(pause, fields, auth=_basic("admin", "wrong"))[0] == 401
    assert _request(pause, fields, auth=_basic("root", PASSWORD))[0] == 401
    assert _request(pause, {"note": "n"}, auth=good)[0] == 403
    assert _request(pause, dict(fields, token="0" * 64), auth=good)[0] == 403
    status, _, body = _request(pause, fields, auth=good, origin="http://evil.example")
    assert status == 403 and "posted from http://evil.example, another site" in body
    assert _request(f"{site}/jobs/nightly-report/pause", auth=good)[0] == 405  # an action is posted
    assert anarchon_celery.paused(app) == {}
    status, headers, _ = _request(pause, fields, auth=good, origin=site)
    assert status == 303 and headers["Location"] == "/jobs/nightly-report?done=paused"
    assert anarchon_celery.paused(app)["nightly-report"].by == "admin@127.0.0.1"

    # Beyond this host, every page needs the login too.
    public, public_port, public_log = _serve(
        env, tmp_path, started, "--host", "0.0.0.0", "--password-file", _password_file(tmp_path), name="public"
    )
    status, headers, _ = _request(f"http://127.0.0.1:{public_port}/")
    assert status == 401 and "WWW-Authenticate" in headers
    assert _request(f"http://127.0.0.1:{public_port}/", auth=good)[0] == 200
    for proc in (web, public):
        stop(proc)
    banner = log.read_text() + public_log.read_text()
    assert "pages open on this host, actions signed in as 'admin' (HTTP Basic)" in banner
    assert "every page and action signed in as 'admin' (HTTP Basic: put HTTPS in front of it)" in banner
    assert PASSWORD not in banner


def _web_command(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", APP, "anarchon", "web", "--port", "0", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_it_refuses_to_serve_beyond_this_host_without_a_password(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT), WEB_APP_BACKEND=f"sqlite:///{tmp_path / 'a.db'}")
    env.pop("ANARCHON_WEB_PASSWORD", None)
    refused = _web_command(env, "--host", "0.0.0.0")
    assert refused.returncode == 1 and refused.stdout == "", refused
    assert refused.stderr.strip().splitlines() == [
        "Error: refusing to serve on 0.0.0.0 without a password: anyone who reaches it could run, pause and change "
        "jobs. Give --password-file FILE or set ANARCHON_WEB_PASSWORD, or serve on 127.0.0.1"
    ]
    empty = tmp_path / "empty"
    empty.write_text("")
    done = _web_command(env, "--host", "0.0.0.0", "--password-file", str(empty))
    assert done.returncode == 1 and done.stderr.strip().splitlines() == [
        f"Error: the password file {empty} is empty: write the password on its first line"
    ]
    done = _web_command(env, "--password-file", str(tmp_path / "missing"))
    assert done.returncode == 1 and f"cannot read the password file {tmp_path / 'missing'}" in done.stderr


@pytest.mark.processes
@pytest.mark.broker
@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "where, url",
    [
        ("rabbitmq", "amqp://guest:s3cr3t@127.0.0.1:1//"),
        ("redis", "redis://:s3cr3t@127.0.0.1:1/0"),
        ("postgres", "postgresql://postgres:s3cr3t@127.0.0.1:1/test"),
    ],
)
def test_a_store_that_does_not_answer_is_said_on_the_page(
    where: str,
    url: str,
    deployment: Callable[[str], dict[str, str]],
    started: list[subprocess.Popen[bytes]],
    tmp_path: Path,
) -> None:
    env = dict(deployment("rabbitmq"), WEB_APP_BACKEND=url)
    _, port, log = _serve(env, tmp_path, started)
    with browser() as chromium:
        page = chromium.new_page()
        answer = page.goto(f"http://127.0.0.1:{port}/")
        assert answer is not None and answer.status == 200
        problems = page.locator(".notice.warn").all_inner_texts()
        assert len(problems) == 1 and problems[0].startswith("cannot read the runtime jobs: "), problems
        assert "127.0.0.1:1" in problems[0]
        code_jobs = ["audit-export", "nightly-report", "refresh_prices"] + (
            [] if where == "rabbitmq" else ["sync-ledger"]
        )
        assert sorted(_rows(page)) == code_jobs
        answer = page.goto(f"http://127.0.0.1:{port}/jobs/refresh_prices")
        assert answer is not None and answer.status == 200
        problems = page.locator(".notice.warn").all_inner_texts()
        assert len(problems) == 1 and problems[0].startswith("cannot read the history: "), problems
        assert page.locator("table.next tbody tr").count() == 10  # what needs no store is shown
        answer = page.goto(f"http://127.0.0.1:{port}/jobs/{RUNTIME_JOB}")
        assert answer is not None and answer.status == 200
        assert page.inner_text(".notice.warn").startswith("cannot read the runtime jobs: ")
        every = page.content() + log.read_text(errors="replace")
        assert "s3cr3t" not in every and "Traceback" not in every


@pytest.mark.broker
@pytest.mark.timeout(180)
def test_a_backend_instance_of_the_settings_serves_requests_one_at_a_time(
    deployment: Callable[[str], dict[str, str]], prefix: str, broker_url: str
) -> None:
    """The app's settings hold a RabbitMQ backend (one kombu connection, which threads may not
    share): requests of many threads at once all read it, one after the other, and it stays open."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from anarchon_celery import RabbitMQBackend
    from anarchon_celery.web import make_app
    from anarchon_celery.web.server import serve

    app = make(deployment("rabbitmq"))
    backend = RabbitMQBackend(broker_url, prefix=prefix, slot_ttl_ms=60_000)
    app.conf.anarchon_backend = backend
    anarchon_celery.add_job(app, RUNTIME_JOB, task="shop.report", schedule=3600, args=["customer-42"])
    anarchon_celery.run_now(app, "refresh_prices")
    server = serve("127.0.0.1", 0, make_app(app, password=None))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        site = f"http://127.0.0.1:{server.server_port}"
        paths = ["/", "/jobs/refresh_prices", f"/jobs/{RUNTIME_JOB}"] * 8
        with ThreadPoolExecutor(len(paths)) as pool:
            answers = list(pool.map(lambda path: _request(site + path), paths))
    finally:
        server.shutdown()
        server.server_close()
        backend.close()
    for (status, _, body), path in zip(answers, paths):
        assert status == 200 and "cannot read" not in body, (path, body)
    assert all("(trigger manual)" not in body for _, _, body in answers)
    runs = [body for (_, _, body), path in zip(answers, paths) if path == "/jobs/refresh_prices"]
    assert all(body.count('class="mono run-id"') == 1 for body in runs)  # the run sent now, read by each
