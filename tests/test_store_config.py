"""A store that can never serve the backend as configured (no such directory, a read-only file
system, a refused login, no right to make the tables) stops `celery beat` at start, in one line
naming the fix, as a refused RabbitMQ login does; a store that does not answer is waited for. And
the SQL a DBA runs instead of granting CREATE, run for real."""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from anarchon_celery import ConfigError, Settings
from anarchon_celery.backends import backend_for

from .support.processes import start_celery
from .support.stores import delete_postgres_rows, delete_redis_keys
from .test_cli import celery
from .test_faults import kill, start_beat, stopped_in_one_line, wait_for
from .test_jobs import make_app

pytestmark = [pytest.mark.broker, pytest.mark.processes, pytest.mark.stores]


def check_fails(env: dict[str, str], expected: str) -> None:
    done = celery(env, "anarchon", "check")
    assert done.returncode == 1 and expected in done.stdout, done.stdout + done.stderr


@pytest.mark.timeout(120)
def test_a_sqlite_file_in_a_missing_directory(beat_env: dict[str, str], tmp_path: Path) -> None:
    env = dict(beat_env, HISTORY_APP_BACKEND=f"sqlite:///{tmp_path / 'missing' / 'anarchon.db'}")
    line = stopped_in_one_line(env, tmp_path, f"the directory {tmp_path / 'missing'} does not exist: create it")
    assert "cannot open SQLite database" in line
    check_fails(env, "does not exist")


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("given", "shown"),
    [
        ("redis:/127.0.0.1:6391/5", "redis:/127.0.0.1:6391/5"),
        ("redis:/:s3cr/et@h:6379/0", "redis:/:**@h:6379/0"),  # a password with a slash (base64)
        ("redis:/u:pa:ss@h/0", "redis:/u:**@h/0"),
        ("redis:/:p@ss@h/0", "redis:/:**@h/0"),
        ("postgresql:/app:pw@db/x", "postgresql:/app:**@db/x"),
    ],
)
def test_a_malformed_urls_password_is_masked_whatever_it_holds(given: str, shown: str) -> None:
    app = make_app()
    app.conf.anarchon_backend = given
    with pytest.raises(ConfigError) as raised:
        backend_for(app, Settings.from_app(app))
    assert f"anarchon_backend {shown!r} is a malformed URL" in str(raised.value)


def test_a_malformed_store_url_is_shown_as_given(beat_env: dict[str, str], tmp_path: Path) -> None:
    given = "redis:/127.0.0.1:6391/5"  # one slash
    env = dict(beat_env, HISTORY_APP_BACKEND=given)
    line = stopped_in_one_line(env, tmp_path, f"anarchon_backend {given!r} is a malformed URL: expected redis://")
    assert f"{given}://" not in line
    with_password = dict(beat_env, HISTORY_APP_BACKEND="redis:/:s3cret@127.0.0.1:6391/5")
    done = celery(with_password, "anarchon", "check")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "'redis:/:**@127.0.0.1:6391/5' is a malformed URL" in done.stdout and "s3cret" not in done.stdout


@contextlib.contextmanager
def read_only_folder(path: Path) -> Iterator[Path]:
    """A tmpfs at ``path`` holding an anarchon database, then mounted read-only (needs root)."""
    path.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(path)], capture_output=True, check=False
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode(errors='replace').strip()}")
    try:
        from anarchon_celery.backends.sqlite import SQLiteBackend

        backend = SQLiteBackend(path / "anarchon.db")
        backend.open()
        backend.close()
        subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.mark.timeout(120)
def test_a_sqlite_file_on_a_read_only_file_system(beat_env: dict[str, str], tmp_path: Path) -> None:
    with read_only_folder(tmp_path / "ro") as folder:
        env = dict(beat_env, HISTORY_APP_BACKEND=f"sqlite:///{folder / 'anarchon.db'}")
        stopped_in_one_line(env, tmp_path, f"{folder} is on a read-only file system")


@pytest.mark.timeout(120)
def test_a_relative_sqlite_path_is_shown_absolute(beat_env: dict[str, str], tmp_path: Path) -> None:
    # Two beats started from two directories would open two files: each says which it opens.
    (tmp_path / "here" / "state").mkdir(parents=True)
    env = dict(beat_env, HISTORY_APP_BACKEND="sqlite:///state/anarchon.db")
    log = tmp_path / "beat.log"
    beat = start_celery(
        ["beat", "-S", "anarchon_celery.Scheduler", "-l", "info", "--pidfile="],
        log,
        env,
        app="tests.apps.history_app",
        cwd=tmp_path / "here",
    )
    try:
        wait_for(log, "anarchon: ready as", beat)
    finally:
        kill(beat)
    absolute = tmp_path / "here" / "state" / "anarchon.db"
    text = log.read_text(errors="replace")
    assert f"the SQLite path 'state/anarchon.db' is relative: this process opens {absolute}" in text
    assert f"Give an absolute path: sqlite:///{absolute}" in text
    assert f"SQLite database {absolute} (prefix" in text  # every later line names the file itself
    assert absolute.exists()


@pytest.fixture
def redis_user(redis_url: str) -> Iterator[str]:
    """A Redis ACL user of this test's own, with the password 's3cret', allowed no keys at all."""
    import redis

    client = redis.Redis.from_url(redis_url)
    user = f"anarchon-{uuid.uuid4().hex[:8]}"
    client.acl_setuser(user, enabled=True, passwords=["+s3cret"], commands=["+@all"], keys=[])
    try:
        yield user
    finally:
        client.acl_deluser(user)
        client.close()


@pytest.mark.timeout(120)
def test_a_wrong_redis_password(beat_env: dict[str, str], tmp_path: Path, redis_user: str, redis_url: str) -> None:
    url = redis_url.replace("redis://", f"redis://{redis_user}:wrong-pw@", 1)
    env = dict(beat_env, HISTORY_APP_BACKEND=url)
    line = stopped_in_one_line(env, tmp_path, "refused the login")
    assert "Give the right password" in line and f"authentication failed for user {redis_user!r}" in line
    assert "user is disabled). Give" in line and ".." not in line  # Redis's reason, without its full stop
    assert "wrong-pw" not in (tmp_path / "beat.log").read_text(errors="replace")
    check_fails(env, "refused the login")


@pytest.mark.timeout(120)
def test_a_redis_that_asks_for_a_password_the_url_does_not_give(beat_env: dict[str, str], tmp_path: Path) -> None:
    import redis

    from .support.redis_servers import OwnRedisServer

    server = OwnRedisServer(tmp_path / "redis")
    try:
        with redis.Redis(port=server.port) as admin:
            admin.config_set("requirepass", "s3cret")
        env = dict(beat_env, HISTORY_APP_BACKEND=server.url)
        line = stopped_in_one_line(env, tmp_path, "Redis asks for a password and the URL gives none")
        assert f"Redis at {server.url}" in line and "Give the password in the URL" in line
        assert "HELLO" not in line  # (Redis's answer to redis-py's first command)
        check_fails(env, "the URL gives none")
    finally:
        server.kill()


@pytest.mark.timeout(120)
def test_a_redis_user_without_rights_on_the_keys(
    beat_env: dict[str, str], tmp_path: Path, redis_user: str, redis_url: str
) -> None:
    url = redis_url.replace("redis://", f"redis://{redis_user}:s3cret@", 1)
    prefix = beat_env["HISTORY_APP_PREFIX"]
    try:
        line = stopped_in_one_line(dict(beat_env, HISTORY_APP_BACKEND=url), tmp_path, "cannot decide claims")
        assert f"'+@all ~{prefix}* &{prefix}*'" in line, line
    finally:
        delete_redis_keys(redis_url, prefix)


@pytest.mark.timeout(120)
def test_an_evicting_redis_stops_beat_and_fails_check(beat_env: dict[str, str], tmp_path: Path) -> None:
    import redis

    from .support.redis_servers import OwnRedisServer

    if shutil.which("redis-server") is None:
        pytest.skip("no redis-server here")
    server = OwnRedisServer(tmp_path / "redis")
    try:
        with redis.Redis(port=server.port) as admin:
            admin.config_set("maxmemory-policy", "allkeys-lru")
        env = dict(beat_env, HISTORY_APP_BACKEND=server.url)
        line = stopped_in_one_line(env, tmp_path, "evicts keys when its memory is full (maxmemory-policy allkeys-lru)")
        assert "Set maxmemory-policy noeviction" in line and "allow_eviction=1" in line
        check_fails(env, "maxmemory-policy allkeys-lru")
        # Whoever accepts the risk says so in the URL: beat runs, with a warning.
        log = tmp_path / "allowed.log"
        beat = start_beat(dict(env, HISTORY_APP_BACKEND=f"{server.url}?allow_eviction=1"), log)
        try:
            wait_for(log, "won, sent", beat)
        finally:
            kill(beat)
        assert "allow_eviction is set, so the backend runs on it" in log.read_text(errors="replace")
    finally:
        server.kill()


@pytest.mark.timeout(120)
def test_a_store_that_does_not_answer_is_waited_for(beat_env: dict[str, str], tmp_path: Path) -> None:
    """Started while its store is away, beat waits (it does not exit); when the store comes, the
    set-up it skipped is done (the history, the hand-backs listened for) and runs are sent."""
    from .support.redis_servers import OwnRedisServer, wait_until

    if shutil.which("redis-server") is None:
        pytest.skip("no redis-server here")
    server = OwnRedisServer(tmp_path / "redis")
    server.kill()
    env = dict(beat_env, HISTORY_APP_BACKEND=server.url)
    log = tmp_path / "beat.log"
    beat = start_beat(env, log)
    try:
        offset = wait_for(log, "not ready: waiting for", beat)  # and it does not exit
        time.sleep(1)
        assert beat.poll() is None
        server.start()
        wait_until(server.port, True)
        offset = wait_for(log, "anarchon: ready as", beat, after=offset)
        wait_for(log, "won, sent", beat, after=offset)
    finally:
        kill(beat)
        server.kill()


@pytest.fixture
def limited_role(postgres_url: str) -> Iterator[tuple[str, str]]:
    """A PostgreSQL role of this test's own, whose schema (its search path) it may use but not
    create in: (its URL, the schema)."""
    import psycopg

    name = f"anarchon_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_url, autocommit=True) as db:
        db.execute(f"CREATE ROLE {name} LOGIN")
        db.execute(f"CREATE SCHEMA {name}")
        db.execute(f"GRANT USAGE ON SCHEMA {name} TO {name}")
        db.execute(f"ALTER ROLE {name} SET search_path = {name}")
    try:
        yield _as_user(postgres_url, name), name
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as db:
            db.execute(f"DROP SCHEMA {name} CASCADE")
            db.execute(f"DROP OWNED BY {name}")
            db.execute(f"DROP ROLE {name}")


def _as_user(url: str, user: str) -> str:
    """``url`` with another user (and no password: the suite's server trusts local users)."""
    scheme, rest = url.split("://", 1)
    return f"{scheme}://{user}@{rest.split('@', 1)[-1]}"


@pytest.mark.timeout(180)
def test_a_postgres_user_without_create_and_the_sql_a_dba_runs_instead(
    beat_env: dict[str, str], tmp_path: Path, limited_role: tuple[str, str], postgres_url: str
) -> None:
    import psycopg

    url, schema = limited_role
    env = dict(beat_env, HISTORY_APP_BACKEND=url, HISTORY_APP_EVERY="1")
    line = stopped_in_one_line(env, tmp_path, "cannot keep anarchon's tables: permission denied for schema")
    assert "'celery -A proj anarchon schema'" in line
    # The DBA runs what `schema` prints, in the user's schema, and grants what it says.
    done = celery(env, "anarchon", "schema")
    assert done.returncode == 0, done.stderr
    printed = done.stdout
    grants = [line.lstrip("- ").strip() for line in printed.splitlines() if line.startswith("--   ")]
    with psycopg.connect(postgres_url, autocommit=True) as db:
        db.execute(f"SET search_path = {schema}")
        db.execute(printed)
        db.execute(" ".join(grants).replace("USER", schema))
    log = tmp_path / "again.log"
    beat = start_beat(env, log)
    try:
        wait_for(log, "won, sent", beat)
    finally:
        kill(beat)
        delete_postgres_rows(url, beat_env["HISTORY_APP_PREFIX"])


@pytest.mark.timeout(120)
def test_a_postgres_role_that_does_not_exist(beat_env: dict[str, str], tmp_path: Path, postgres_url: str) -> None:
    url = _as_user(postgres_url, "no_such_role")
    stopped_in_one_line(dict(beat_env, HISTORY_APP_BACKEND=url), tmp_path, 'role "no_such_role" does not exist')


@pytest.mark.timeout(120)
def test_two_projects_on_one_store_each_run_every_run_of_their_own(beat_env: dict[str, str], tmp_path: Path) -> None:
    # Two apps with a job of the same name, on the same Redis with the default prefix: each
    # app's default is its own (<main>.cron.), so neither loses runs to the other. (A Redis of
    # the test's own: nothing left under 'cron.' by anything else.)
    from .support.redis_servers import OwnRedisServer
    from .test_faults import Fleet

    if shutil.which("redis-server") is None:
        pytest.skip("no redis-server here")
    server = OwnRedisServer(tmp_path / "redis")
    redis_url = server.url

    mains = [f"proj_{side}_{uuid.uuid4().hex[:6]}" for side in "ab"]
    envs = [
        dict(beat_env, HISTORY_APP_MAIN=main, HISTORY_APP_ANARCHON_PREFIX="default", HISTORY_APP_BACKEND=redis_url)
        for main in mains
    ]
    try:
        fleet = Fleet(tmp_path, envs)
    except BaseException:
        server.kill()
        raise
    try:
        fleet.wait_ready()
        for index in range(2):
            assert f"(prefix '{mains[index]}.cron.')" in fleet.text(index)
        fleet.wait_any("won, sent", fleet.offsets())
        time.sleep(6)
        fleet.stop()
    finally:
        fleet.kill()
        server.kill()
    won = [
        {int(slot) for slot in re.findall(r"job 'every' slot (\d+): won, sent", fleet.text(index))}
        for index in range(2)
    ]
    assert len(won[0] & won[1]) >= 3, won  # every run, by each project
    assert not any(
        "job 'every' slot" in line and ": lost" in line for index in range(2) for line in fleet.text(index).splitlines()
    )


@pytest.mark.timeout(120)
def test_state_under_the_former_default_prefix_stops_beat_until_the_prefix_is_named(
    beat_env: dict[str, str], tmp_path: Path
) -> None:
    from anarchon_celery import Claim, SQLiteBackend

    path = tmp_path / "anarchon.db"
    earlier = SQLiteBackend(path, prefix="cron.")  # a deployment of an earlier release
    earlier.open()
    assert len(earlier.claim([Claim("every", int(time.time() * 1000))], "earlier:1")) == 1
    earlier.close()
    env = dict(beat_env, HISTORY_APP_ANARCHON_PREFIX="default", HISTORY_APP_BACKEND=f"sqlite:///{path}")
    line = stopped_in_one_line(env, tmp_path, "keeps runs of job(s) 'every' under the prefix 'cron.'")
    assert "set anarchon_prefix = 'cron.' for every beat and worker" in line
    assert "set anarchon_prefix = 'history_app.cron.'" in line
    check_fails(env, "under the prefix 'cron.'")
    log = tmp_path / "named.log"
    beat = start_beat(dict(env, HISTORY_APP_ANARCHON_PREFIX="cron."), log)  # named: it runs there
    try:
        wait_for(log, "won, sent", beat)
    finally:
        kill(beat)


@pytest.mark.timeout(150)
def test_beats_that_decide_runs_in_two_places_are_named_by_the_worker(beat_env: dict[str, str], tmp_path: Path) -> None:
    # The same relative SQLite path, two working directories (a systemd unit runs in /, a shell
    # elsewhere): two database files, each beat wins every run. The worker that gets both sends'
    # messages names the two places and the two instances.
    from .test_backup_runners import _worker

    envs, beats, logs = [], [], []
    for side in "ab":
        (tmp_path / side / "state").mkdir(parents=True)
        envs.append(dict(beat_env, HISTORY_APP_BACKEND="sqlite:///state/anarchon.db"))
        logs.append(tmp_path / f"beat-{side}.log")
    worker_log = tmp_path / "worker.log"
    worker = None
    try:
        for side, env, log in zip("ab", envs, logs):
            args = ["beat", "-S", "anarchon_celery.Scheduler", "-l", "info", "--pidfile="]
            beats.append(start_celery(args, log, env, app="tests.apps.history_app", cwd=tmp_path / side))
        worker_env = dict(beat_env, HISTORY_APP_BACKEND=f"sqlite:///{tmp_path / 'a' / 'state' / 'anarchon.db'}")
        worker = _worker(worker_env, worker_log)
        deadline = time.monotonic() + 90
        while "are decided in 2 places" not in worker_log.read_text(errors="replace"):
            assert time.monotonic() < deadline, worker_log.read_text(errors="replace")[-3000:]
            time.sleep(0.2)
    finally:
        for beat in beats:
            kill(beat)
        if worker is not None:
            kill(worker)  # type: ignore[arg-type]
    [line] = [line for line in worker_log.read_text(errors="replace").splitlines() if "decided in 2 places" in line]
    assert "ERROR/" in line and "the runs of job 'every' are decided in 2 places" in line, line
    assert line.count("SQLite store ") == 2 and "Give every beat the same anarchon_backend" in line
    for beat in beats:
        assert f":{beat.pid} in SQLite store " in line, line
