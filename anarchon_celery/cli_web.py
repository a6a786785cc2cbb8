"""``celery -A proj anarchon web``: serve the schedules page (:mod:`anarchon_celery.web`). A part
of :mod:`.cli`, whose group it adds its command to."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import click

from .cli import _app, _deployment, _fail_cleanly, anarchon
from .errors import ConfigError
from .web import make_app
from .web.auth import LOOPBACK_HOSTS
from .web.server import is_loopback, serve

__all__ = ["web_command"]

#: The environment variable that holds the password, when no file does.
PASSWORD_ENV = "ANARCHON_WEB_PASSWORD"


def read_password(path: Path | None) -> str | None:
    """The password of the file (its first line, without the line break), else of
    ANARCHON_WEB_PASSWORD; None when neither gives one."""
    if path is None:
        return os.environ.get(PASSWORD_ENV) or None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the password file {path}: {exc}") from None
    password = text.splitlines()[0] if text else ""
    if not password:
        raise ConfigError(f"the password file {path} is empty: write the password on its first line")
    return password


@anarchon.command(name="web")
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="The address to serve on. Any other than this host's loopback (0.0.0.0: every interface) needs a password.",
)
@click.option(
    "--port", type=click.IntRange(0, 65535), default=8077, show_default=True, help="The port (0: any free one)."
)
@click.option("--user", default="admin", show_default=True, help="The user name to sign in with.")
@click.option(
    "--password-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help=f"A file whose first line is the password to sign in with (else {PASSWORD_ENV}).",
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="NAME",
    help="A name the page answers to (repeat it for several). On the loopback: localhost, 127.0.0.1 "
    "and ::1 with these; elsewhere, when given, these only.",
)
@click.pass_context
@_fail_cleanly
def web_command(
    ctx: click.Context, host: str, port: int, user: str, password_file: Path | None, allowed_hosts: tuple[str, ...]
) -> None:
    """Serve the schedules page: every job with its state, next runs and last run; each job's
    recent runs and their lateness; and forms to run a job now, pause, resume and edit it.

    With a password (--password-file or ANARCHON_WEB_PASSWORD) the browser signs in (HTTP Basic)
    to act, and, on an address other than this host's loopback, to see any page. Without one it
    serves on the loopback only, nobody signing in. Stop it with Ctrl-C or SIGTERM.
    """
    password = read_password(password_file)
    local = is_loopback(host)
    if password is None and not local:
        raise click.ClickException(
            f"refusing to serve on {host} without a password: anyone who reaches it could run, pause and change "
            f"jobs. Give --password-file FILE or set {PASSWORD_ENV}, or serve on 127.0.0.1"
        )
    app = _app(ctx)
    # On the loopback, where pages are open, only this host's own names: a website's name pointed
    # at 127.0.0.1 (DNS rebinding) is refused. Elsewhere every page needs signing in.
    names = [*LOOPBACK_HOSTS, host, *allowed_hosts] if local else list(allowed_hosts) or None
    application = make_app(app, password=password, user=user, open_pages=local, allowed_hosts=names)
    with _deployment(ctx) as deployment:
        where = deployment.backend.describe()
    try:
        server = serve(host, port, application)
    except OSError as exc:
        raise click.ClickException(f"cannot serve on {host}:{port} ({exc}): give another --port") from None
    shown = f"[{host}]" if ":" in host else host
    click.echo(f"anarchon web: the jobs of {app.main or 'the app'} on {where}")
    click.echo(f"anarchon web: serving http://{shown}:{server.server_port}/, {_access(password, user, local)}")
    _serve_until_stopped(server)
    click.echo("anarchon web: stopped")


def _access(password: str | None, user: str, local: bool) -> str:
    if password is None:
        return f"nobody signs in: served on this host only (give --password-file or {PASSWORD_ENV} to ask for one)"
    if local:
        return f"pages open on this host, actions signed in as {user!r} (HTTP Basic)"
    return f"every page and action signed in as {user!r} (HTTP Basic: put HTTPS in front of it)"


def _serve_until_stopped(server: Any) -> None:
    """Serve until SIGTERM or SIGINT; then close the listening socket."""

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.server_close()
