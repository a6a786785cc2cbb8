"""The WSGI application of the schedules page: routes, logins, form checks, and the answer.

``GET /`` is the index of every job, ``GET /jobs/<job>`` a job's page, and ``POST
/jobs/<job>/<action>`` an action (``run-now``, ``pause``, ``resume``, ``edit``), which answers
with a redirect to the job's page (303) when it is done, or the page with its error in one line.
Each request reads the deployment anew (see :func:`.reading.opened`): requests may be served by
several threads at once.
"""

from __future__ import annotations

import http
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlencode

from ..backends.definitions import JobConflict
from ..errors import AnarchonError, BrokerError
from .actions import ACTIONS, act, done_text
from .auth import Guard, foreign_origin, host_name
from .pages import index_page, job_page, message_page
from .reading import NoSuchJob, job_view, opened, overview
from .render import Context

__all__ = ["WebApp"]

logger = logging.getLogger(__name__)

#: The most bytes a form may post.
MAX_FORM_BYTES = 64 * 1024

#: Headers of every answer: no script runs, nothing is framed or cached, no type is guessed.
SECURITY_HEADERS = [
    (
        "Content-Security-Policy",
        "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
    ("X-Frame-Options", "DENY"),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "same-origin"),
    ("Cache-Control", "no-store"),
]


@dataclass
class Response:
    status: int
    body: str = ""
    headers: list[tuple[str, str]] = field(default_factory=list)

    def status_line(self) -> str:
        return f"{self.status} {http.HTTPStatus(self.status).phrase}"


StartResponse = Callable[..., Any]


class WebApp:
    """The schedules page of ``app`` as a WSGI application (see :func:`anarchon_celery.web.make_app`)."""

    def __init__(self, app: Any, guard: Guard, allowed_hosts: frozenset[str] | None = None) -> None:
        self.app = app
        self.guard = guard
        #: The names the page answers to (None: any): a page open on the loopback must not be
        #: reached through another name pointed at it (DNS rebinding), which its Origin check
        #: cannot tell from its own.
        self.allowed_hosts = allowed_hosts
        self.name = str(app.main or "celery")
        self._shared = threading.Lock()  # a backend instance held by the app's settings

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        try:
            response = self.respond(environ)
        except Exception as exc:  # noqa: BLE001 - a page answers, whatever went wrong
            logger.exception("anarchon web: %s %s failed", environ.get("REQUEST_METHOD"), environ.get("PATH_INFO"))
            context = self._context(environ, None)
            response = Response(500, message_page(context, "Error", f"{type(exc).__name__}: {exc}"))
        body = b"" if environ.get("REQUEST_METHOD") == "HEAD" else response.body.encode()
        headers = [("Content-Type", "text/html; charset=utf-8"), ("Content-Length", str(len(body)))]
        start_response(response.status_line(), headers + SECURITY_HEADERS + response.headers)
        return [body]

    def _context(self, environ: Mapping[str, Any], user: str | None) -> Context:
        return Context(
            base=str(environ.get("SCRIPT_NAME", "")), token=self.guard.token(), user=user, app_name=self.name
        )

    def respond(self, environ: Mapping[str, Any]) -> Response:
        """The answer to one request."""
        method = str(environ.get("REQUEST_METHOD", "GET")).upper()
        if self.allowed_hosts is not None and host_name(environ) not in self.allowed_hosts:
            context = self._context(environ, None)
            text = "This page answers to the names it was started for (see --allowed-host) only."
            return Response(400, message_page(context, "Refused", text))
        user = self.guard.login(environ)
        context = self._context(environ, user)
        if user is None and self.guard.needs_login(method):
            text = "Sign in to " + ("act on the jobs." if method == "POST" else "see the jobs.")
            return Response(401, message_page(context, "Sign in", text), [self.guard.challenge()])
        raw = str(environ.get("PATH_INFO") or "/")
        parts = [part for part in raw.encode("latin-1", "replace").decode("utf-8", "replace").split("/") if part]
        reading = method in ("GET", "HEAD")
        if not parts and reading:
            return self._index(context)
        if len(parts) == 2 and parts[0] == "jobs" and reading:
            query = {key: values[0] for key, values in parse_qs(str(environ.get("QUERY_STRING", ""))).items()}
            return self._job(context, parts[1], 200, done=done_text(parts[1], query))
        if len(parts) == 3 and parts[0] == "jobs" and parts[2] in ACTIONS:
            if method != "POST":
                return Response(
                    405, message_page(context, "Not allowed", "An action is a form posted."), [("Allow", "POST")]
                )
            return self._act(context, environ, parts[1], parts[2])
        if not reading and (not parts or (len(parts) == 2 and parts[0] == "jobs")):
            return Response(
                405, message_page(context, "Not allowed", "This page is read, not posted to."), [("Allow", "GET")]
            )
        return Response(404, message_page(context, "Not found", f"There is no page {raw}."))

    def _index(self, context: Context) -> Response:
        try:
            with opened(self.app, self._shared) as deployment:
                view = overview(self.app, deployment)
        except AnarchonError as exc:  # the configuration, as the beats would refuse it
            return Response(503, message_page(context, "The configuration cannot be read", str(exc)))
        return Response(200, index_page(context, view))

    def _job(self, context: Context, name: str, status: int, **shown: Any) -> Response:
        try:
            with opened(self.app, self._shared) as deployment:
                view = job_view(self.app, deployment, name)
        except NoSuchJob as exc:
            return Response(404, message_page(context, "No such job", str(exc)))
        except AnarchonError as exc:  # the configuration, as the beats would refuse it
            return Response(
                status if status != 200 else 503, message_page(context, "The configuration cannot be read", str(exc))
            )
        return Response(status, job_page(context, view, **shown))

    def _act(self, context: Context, environ: Mapping[str, Any], name: str, action: str) -> Response:
        origin = foreign_origin(environ)
        if origin is not None:
            text = f"Refused: the form was posted from {origin}, another site than this page's."
            return Response(403, message_page(context, "Refused", text))
        form = _form(environ)
        if form is None:
            return Response(413, message_page(context, "Refused", f"A form may post {MAX_FORM_BYTES} bytes at most."))
        if not self.guard.token_ok(form.get("token")):
            text = "Refused: the form does not carry this page's token (a page of an earlier start?): load it again."
            return Response(403, message_page(context, "Refused", text))
        by = f"{context.user or 'web'}@{environ.get('REMOTE_ADDR') or '?'}"
        try:
            with opened(self.app, self._shared) as deployment:
                query = act(action, self.app, deployment, name, form, by)
        except AnarchonError as exc:
            status = 409 if isinstance(exc, JobConflict) else 503 if isinstance(exc, BrokerError) else 400
            values = form if action == "edit" else None
            return self._job(context, name, status, error=str(exc), conflict=status == 409, values=values)
        location = context.url("jobs", name) + "?" + urlencode(query)
        return Response(303, message_page(context, "Done", "See the job's page."), [("Location", location)])


def _form(environ: Mapping[str, Any]) -> dict[str, str] | None:
    """A posted form's fields (the first value of each); None when it is too long."""
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    if length > MAX_FORM_BYTES:
        return None
    body = environ["wsgi.input"].read(length) if length > 0 else b""
    fields = parse_qs(body.decode("ascii", "replace"), keep_blank_values=True, encoding="utf-8", errors="replace")
    return {key: values[0] for key, values in fields.items()}
