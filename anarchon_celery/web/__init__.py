"""The schedules page: every job of an app, its state, next runs and recent runs, and forms to
run one now, pause, resume and edit it. Server-rendered HTML without a script, made with the
standard library only.

``celery -A proj anarchon web`` serves it (:mod:`anarchon_celery.cli_web`); :func:`make_app` is
the WSGI application, to mount in a server of your own.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..control import configure
from ..errors import ConfigError
from .app import WebApp
from .auth import Guard

__all__ = ["WebApp", "make_app"]


def make_app(
    app: Any,
    *,
    password: str | None,
    user: str = "admin",
    open_pages: bool = False,
    secret: bytes | None = None,
    allowed_hosts: Iterable[str] | None = None,
) -> WebApp:
    """The schedules page of the Celery ``app``, a WSGI application.

    ``password``: every page and action asks the browser to sign in as ``user`` with it (HTTP
    Basic: serve it over HTTPS beyond this host). None turns signing in off, for a page behind
    an authentication of your own; there is no default, so that it is never off by accident.
    ``open_pages``: the pages are shown without signing in, the actions still need it.
    ``secret``: the key of the forms' tokens; give the same bytes to every process that serves
    the page behind one address (by default each process draws its own). ``allowed_hosts``: the
    names (``Host`` headers, without the port) the page answers to; any other is refused with
    400. None answers to any, for a server that checks them itself; give them whenever nobody
    signs in or the pages are open, or a website could reach the page through a name of its own
    pointed at this host (DNS rebinding).

    The app's task modules are imported, as ``celery beat`` does, and its configuration checked
    (ConfigError, naming what to fix).
    """
    if password is not None and not password:
        raise ConfigError("the schedules page's password is empty: give one, or password=None to sign nobody in")
    if not user or ":" in user:
        raise ConfigError(f"the schedules page's user {user!r} must be a name without ':' (HTTP Basic's separator)")
    if not app.loader.worker_initialized:  # else a worker of this process imported them
        app.loader.import_default_modules()
    configure(app).release()
    allowed = None if allowed_hosts is None else frozenset(name.strip("[]").lower() for name in allowed_hosts)
    return WebApp(app, Guard(user=user, password=password, open_pages=open_pages, secret=secret), allowed)
