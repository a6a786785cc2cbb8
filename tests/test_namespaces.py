"""Settings written under a namespace the app does not have (``CELERY_ANARCHON_PREFIX`` on an app
loaded without ``namespace="CELERY"``): Celery never reads them, so they are refused, saying what
to write instead, by ``Settings.from_app``, by ``celery anarchon check`` and by a beat at start."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from anarchon_celery import ConfigError
from anarchon_celery.settings import Settings

from .test_cli import celery
from .test_faults import stopped_in_one_line

ROOT = Path(__file__).resolve().parent.parent

NO_NAMESPACE = (
    "CELERY_ANARCHON_PREFIX is not read: this app has no namespace, so Celery never reads it; write "
    "anarchon_prefix, or load the configuration with app.config_from_object(..., namespace='CELERY')"
)


def app_with(loaded: str, **settings: Any) -> Celery:
    """An app given ``settings`` by ``app.conf.update`` (``update``), or by
    ``config_from_object`` without a namespace (``object``) or with ``namespace="CELERY"``."""
    app = Celery(f"app{uuid.uuid4().hex[:6]}", set_as_current=False)
    if loaded == "update":
        app.conf.update(broker_url="memory://", **settings)
    else:
        namespace = {"object": None, "CELERY": "CELERY"}[loaded]
        app.config_from_object(type("Config", (), {"broker_url": "memory://", **settings}), namespace=namespace)
    return app


@pytest.mark.parametrize(
    "loaded, settings, message",
    [
        ("update", {"CELERY_ANARCHON_PREFIX": "x."}, NO_NAMESPACE),
        ("object", {"CELERY_ANARCHON_PREFIX": "x."}, NO_NAMESPACE),
        (
            "object",
            {"CELERY_ANARCHON_PREFIX": "x.", "CELERY_ANARCHON_JITTER_MS": 5},
            "CELERY_ANARCHON_JITTER_MS, CELERY_ANARCHON_PREFIX are not read: this app has no namespace, so "
            "Celery never reads them; write anarchon_jitter_ms, anarchon_prefix, or load the configuration "
            "with app.config_from_object(..., namespace='CELERY')",
        ),
        (
            "update",
            {"celery_anarchon_max_late_ms": 5},
            "celery_anarchon_max_late_ms is not read: this app has no namespace, so Celery never reads it; "
            "write anarchon_max_late_ms, or load the configuration with app.config_from_object(..., "
            "namespace='celery')",
        ),
        (
            "CELERY",
            {"DJANGO_ANARCHON_PREFIX": "x."},
            "DJANGO_ANARCHON_PREFIX is not read: this app's namespace is 'CELERY', so Celery never reads it; "
            "write CELERY_ANARCHON_PREFIX (or anarchon_prefix)",
        ),
        # Misspelt as well: the closest setting, as this app reads it.
        (
            "update",
            {"CELERY_ANARCHON_PREFX": "x."},
            "unknown setting CELERY_ANARCHON_PREFX (did you mean anarchon_prefix?)",
        ),
    ],
    ids=["update", "object", "two", "lower-case", "another-namespace", "misspelt"],
)
def test_a_setting_under_a_namespace_the_app_does_not_have_is_refused(
    loaded: str, settings: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_app(app_with(loaded, **settings))
    assert str(info.value).startswith(message), str(info.value)


@pytest.mark.parametrize(
    "loaded, settings",
    [
        ("CELERY", {"CELERY_ANARCHON_PREFIX": "x."}),
        ("CELERY", {"anarchon_prefix": "x."}),
        ("update", {"anarchon_prefix": "x."}),
        ("object", {"anarchon_prefix": "x."}),
    ],
)
def test_a_setting_celery_reads_is_read(loaded: str, settings: dict[str, Any]) -> None:
    assert Settings.from_app(app_with(loaded, **settings)).prefix == "x."


@pytest.mark.parametrize("name", ["MYPROJ_ANARCHON_DASHBOARD_URL", "CELERY_ANARCHON_CELERY_CLUSTER"])
def test_a_setting_of_the_users_own_that_only_contains_anarchon_is_left_alone(name: str) -> None:
    assert Settings.from_app(app_with("update", **{name: "x", "anarchon_prefix": "x."})).prefix == "x."


# -- real processes -------------------------------------------------------------------------------

APP = """
from celery import Celery

app = Celery({main!r}, broker={broker!r})


class Config:
    CELERY_ANARCHON_PREFIX = {prefix!r}  # read only under namespace="CELERY"
    task_default_queue = {queue!r}
    beat_schedule = {{"every": {{"task": "unread.work", "schedule": 1.0}}}}


app.config_from_object(Config)


@app.task(name="unread.work", shared=False)
def work() -> None: ...
"""


@pytest.fixture
def unread_env(prefix: str, broker_url: str, tmp_path: Path) -> dict[str, str]:
    """The environment of ``celery -A unread_app``: an app loaded without a namespace, given
    CELERY_ANARCHON_PREFIX. Named under the test's prefix, so that what a beat that ignores the
    setting would make under the app's default prefix is deleted too."""
    folder = tmp_path / "app"
    folder.mkdir()
    text = APP.format(main=f"{prefix}unread", broker=broker_url, prefix=f"{prefix}ns.", queue=f"{prefix}tasks")
    (folder / "unread_app.py").write_text(text)
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(folder)]))


@pytest.mark.broker
@pytest.mark.processes
def test_check_refuses_a_setting_celery_never_reads(unread_env: dict[str, str]) -> None:
    done = celery(unread_env, "anarchon", "check", app="unread_app")
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.splitlines() == [f"FAIL  config   {NO_NAMESPACE}"], done.stdout
    assert "Traceback" not in done.stderr


@pytest.mark.broker
@pytest.mark.processes
@pytest.mark.timeout(120)
def test_a_beat_refuses_to_start_with_a_setting_celery_never_reads(unread_env: dict[str, str], tmp_path: Path) -> None:
    stopped_in_one_line(unread_env, tmp_path, NO_NAMESPACE, app="unread_app")
