"""The server of ``celery anarchon web``: the standard library's WSGI server, one thread per
request, on an IPv4 or IPv6 address."""

from __future__ import annotations

import ipaddress
import socket
import socketserver
from collections.abc import Callable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

__all__ = ["is_loopback", "serve"]


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a request in progress does not hold the stop up

    def server_bind(self) -> None:
        """Bind, without the reverse DNS lookup of the address that ``HTTPServer`` makes (it
        waits for a resolver that may never answer)."""
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)
        self.setup_environ()


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(WSGIRequestHandler):
    timeout = 60  # seconds a client may take to send its request: a stalled one frees its thread


def serve(host: str, port: int, application: Callable[..., Any]) -> WSGIServer:
    """A server of ``application`` bound to ``host:port`` (port 0: any free one), not started
    yet (``serve_forever``). Raises OSError when the address cannot be bound."""
    server_class = _Server6 if ":" in host else _Server
    return make_server(host, port, application, server_class=server_class, handler_class=_Handler)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name) is this machine only: every address it stands
    for is a loopback one. Every interface (``0.0.0.0``, ``::``, ``""``) is not."""
    if not host:
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    return bool(found) and all(ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in found)
