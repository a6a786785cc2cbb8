"""Who may see the schedules page and act on it.

* **HTTP Basic authentication** against one user and password, compared in constant time
  (:func:`hmac.compare_digest`). Actions always need it when a password is set; pages too,
  unless they are open (the command opens them when it is bound to this host only).
* **A token in every form**: an HMAC of a secret (random, one per process, unless one is given),
  so that another site cannot make a logged-in browser post a form to this one.
* **The Origin of a POST**: a form posted from another site than the one the browser asked for
  is refused, whatever its token.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import secrets
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

__all__ = ["LOOPBACK_HOSTS", "Guard", "credentials", "foreign_origin", "host_name"]

#: The realm the browser's login prompt names.
REALM = "anarchon"


def credentials(environ: Mapping[str, Any]) -> tuple[str, str] | None:
    """The user and password of a request's ``Authorization: Basic`` header, or None."""
    header = str(environ.get("HTTP_AUTHORIZATION", ""))
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic" or not encoded.strip():
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, sep, password = decoded.partition(":")
    return (user, password) if sep else None


def foreign_origin(environ: Mapping[str, Any]) -> str | None:
    """The ``Origin`` of a request when it names another site than the one asked for (the
    ``Host`` header: any scheme, as behind a proxy that ends TLS); None when it is this site's
    or the request has none (a form's token is then the check)."""
    origin = environ.get("HTTP_ORIGIN")
    if origin is None:
        return None
    host = str(environ.get("HTTP_HOST") or f"{environ.get('SERVER_NAME', '')}:{environ.get('SERVER_PORT', '')}")
    netloc = urlsplit(str(origin)).netloc if "://" in str(origin) else ""
    return None if netloc and netloc.lower() == host.lower() else str(origin)


#: The names of this host's loopback, as a browser sends them in ``Host``.
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


def host_name(environ: Mapping[str, Any]) -> str:
    """The host a request was sent to (its ``Host`` header, without the port), lower case."""
    host = str(environ.get("HTTP_HOST") or environ.get("SERVER_NAME") or "").strip().lower()
    if host.startswith("["):  # [::1]:8077
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class Guard:
    """The page's authentication and form tokens.

    ``password`` None: nobody logs in (every request is let in). ``open_pages``: pages are read
    without a login, actions still need one. ``secret``: the key of the form tokens; processes
    that serve one site behind a balancer must share it (by default each has its own).
    """

    def __init__(
        self, *, user: str, password: str | None, open_pages: bool = False, secret: bytes | None = None
    ) -> None:
        self.user = user
        self.password = password
        self.open_pages = open_pages
        self._secret = secret if secret is not None else secrets.token_bytes(32)
        self._token = hmac.new(self._secret, b"anarchon web form", "sha256").hexdigest()

    @property
    def enabled(self) -> bool:
        """Whether anyone logs in at all."""
        return self.password is not None

    def needs_login(self, method: str) -> bool:
        """Whether a request of ``method`` must be logged in."""
        return self.enabled and (method == "POST" or not self.open_pages)

    def login(self, environ: Mapping[str, Any]) -> str | None:
        """The user the request is logged in as, or None (no credentials, or wrong ones)."""
        given = credentials(environ)
        if given is None or self.password is None:
            return None
        user_ok = hmac.compare_digest(given[0].encode(), self.user.encode())
        password_ok = hmac.compare_digest(given[1].encode(), self.password.encode())
        return given[0] if user_ok & password_ok else None

    def challenge(self) -> tuple[str, str]:
        """The header that asks the browser to log in."""
        return ("WWW-Authenticate", f'Basic realm="{REALM}", charset="UTF-8"')

    def token(self) -> str:
        """The token every form of the page carries."""
        return self._token

    def token_ok(self, given: str | None) -> bool:
        """Whether a form's token is this page's."""
        return given is not None and hmac.compare_digest(given.encode(), self._token.encode())
