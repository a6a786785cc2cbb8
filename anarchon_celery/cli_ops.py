"""``celery -A proj anarchon health``: ask the beat on this host whether it is alive or ready, for
a probe's ``exec`` or a person. A part of :mod:`.cli`, whose group it adds its commands to."""

from __future__ import annotations

import urllib.error
import urllib.request

import click

from .cli import _fail_cleanly, anarchon
from .errors import ConfigError
from .settings import Settings

__all__ = ["health_command"]


@anarchon.command(name="health")
@click.option("--ready", is_flag=True, help="Whether it is ready (claiming runs), not only alive.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Where the beat serves its probes.")
@click.option("--port", type=click.IntRange(1, 65535), help="Its port (default: anarchon_metrics_port).")
@click.option("--timeout", type=click.FloatRange(0.1, None), default=5.0, show_default=True, help="Seconds to wait.")
@click.pass_context
@_fail_cleanly
def health_command(ctx: click.Context, ready: bool, host: str, port: int | None, timeout: float) -> None:
    """Whether the beat serving its probes on this host (anarchon_metrics_port) is alive: its
    scheduler loop moves; or with --ready, ready: alive, set up, and its backend answering. One
    line saying why; exit status 0 when it is, 1 when it is not or does not answer."""
    if port is None:
        port = Settings.from_app(ctx.obj.app).metrics_port
        if not port:
            raise ConfigError(
                "anarchon_metrics_port is not set: each beat serves its health on that port (set it, or give --port)"
            )
    url = f"http://{host}:{port}/{'readyz' if ready else 'healthz'}"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:  # noqa: S310 - http only, our URL
            click.echo(answer.read().decode(errors="replace").strip())
            return
    except urllib.error.HTTPError as exc:  # 503: not alive, or not ready
        click.echo(exc.read().decode(errors="replace").strip() or f"{url} answered {exc.code}")
    except (OSError, TimeoutError) as exc:
        reason = getattr(exc, "reason", exc)
        click.echo(
            f"not alive: nothing answers at {url} ({reason}); is the beat running with anarchon_metrics_port {port}?"
        )
    ctx.exit(1)
