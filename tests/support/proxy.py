"""A small TCP proxy on 127.0.0.1 between a client and RabbitMQ, to cut or stall connections at
chosen points."""

from __future__ import annotations

import contextlib
import socket
import threading

from .broker_control import HOST, PORT


class Proxy:
    """Forwards ``127.0.0.1:<port>`` to ``target``.

    ``stall()`` holds everything the broker sends (the client sees no answer, and no close);
    ``resume()`` lets it through again; ``cut()`` closes every open connection at once.
    """

    def __init__(self, target: tuple[str, int] = (HOST, PORT), port: int = 0) -> None:
        self.target = target
        self._server = socket.create_server(("127.0.0.1", port))
        self.port = self._server.getsockname()[1]
        self._open = threading.Event()
        self._open.set()  # cleared while stalled
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._from_broker = 0  # bytes forwarded from the broker
        self._stall_at: int | None = None
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, user: str = "guest", password: str = "guest") -> str:
        return f"amqp://{user}:{password}@127.0.0.1:{self.port}//"

    def stall(self) -> None:
        self._open.clear()

    def stall_after(self, nbytes: int) -> None:
        """Stall once ``nbytes`` more bytes came from the broker (in the middle of an answer)."""
        with self._lock:
            self._stall_at = self._from_broker + nbytes

    @property
    def stalled(self) -> bool:
        return not self._open.is_set()

    def resume(self) -> None:
        self._open.set()

    def cut(self) -> None:
        with self._lock:
            sockets, self._sockets = list(self._sockets), set()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        self._closed = True
        self._open.set()
        # Shut down first: a listening socket closed while a thread waits in accept() on it goes
        # on listening until that accept returns, and its port could not be listened on again.
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()
        self.cut()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets |= {client, upstream}
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, from_broker: bool) -> None:
        try:
            while data := source.recv(65536):
                if from_broker:
                    self._open.wait()
                    if self._closed:
                        return
                    with self._lock:
                        self._from_broker += len(data)
                        if self._stall_at is not None and self._from_broker >= self._stall_at:
                            self._stall_at = None
                            self._open.clear()  # this data gets through; the next waits
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (now)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
