"""Sockets and the uvicorn server of ``xmodal serve`` (loopback by default).

Connections are bounded in number and in time, so idle or slow clients cannot take the server from
everyone else (uvicorn alone counts idle connections against ``limit_concurrency`` and answers every
other request 503 while 64 of them sit open, and never times out a connection that has not sent a
request yet):

- a connection must deliver a whole request head within ``header_timeout`` seconds of opening, and
  of its previous response (a slow-header client is closed, however it trickles bytes);
- between requests a connection is kept ``keep_alive`` seconds (uvicorn's keep-alive timeout);
- at most ``max_connections`` are open: a new one closes the connections that wait for a request
  (idle longest first); a connection with a request in progress is never closed for this;
- requests in progress are limited by the app (:class:`xmodal.serve.app.RequestLimits`: a quick 503).
"""

from __future__ import annotations

import ipaddress
import math
import socket

from xmodal.serve.app import MAX_HEADER_BYTES

#: Seconds a connection has to send a whole request head (after opening or after its last response).
HEADER_TIMEOUT = 10.0
#: Seconds an idle keep-alive connection is kept after a response.
KEEP_ALIVE = 5.0
#: Most open connections; beyond it the longest idle ones are closed.
MAX_CONNECTIONS = 100


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (``127.0.0.0/8``, ``::1``, ``localhost``).

    >>> is_loopback("127.0.0.1"), is_loopback("0.0.0.0")
    (True, False)
    """
    if not isinstance(host, str):
        raise TypeError(f"host: expected a string, got {type(host).__name__}")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _port(port) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"--port: must be an integer in [0, 65535], got {str(port)[:40]!r}")
    return int(port)


def bind_socket(host: str = "127.0.0.1", port: int = 8000) -> socket.socket:
    """A listening TCP socket on ``host:port`` (``port=0``: a free port, see ``getsockname()``).

    Listening before the server starts means a client may connect at once: the
    connection waits in the backlog until the server accepts it.
    """
    port = _port(port)
    if not isinstance(host, str) or not host or "\x00" in host:
        raise ValueError(f"--host: expected a host name or address, got {str(host)[:40]!r}")
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError) as exc:
        raise ValueError(f"--host: cannot resolve {host[:80]!r} ({getattr(exc, 'strerror', None) or exc})") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise ValueError(f"--port: cannot listen on {host}:{port} ({exc.strerror})") from None
    sock.setblocking(False)
    return sock


def _seconds(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}: expected a positive number of seconds, got {str(value)[:40]!r}")
    return float(value)


def guarded_protocol(*, header_timeout: float = HEADER_TIMEOUT, max_connections: int = MAX_CONNECTIONS):
    """uvicorn's h11 protocol with a request-head deadline and a bound on open connections
    (module doc); pass it as ``uvicorn.Config(http=...)``."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    header_timeout = _seconds(header_timeout, "header_timeout")
    if isinstance(max_connections, bool) or not isinstance(max_connections, int) or max_connections < 1:
        raise ValueError(f"max_connections: expected a positive integer, got {str(max_connections)[:40]!r}")

    class GuardedH11Protocol(H11Protocol):
        _head_timer = None
        _armed_cycle = None
        idle_since = 0.0

        @property
        def busy(self) -> bool:
            """A request is in progress (its head arrived and its response is not complete)."""
            return self.cycle is not None and not self.cycle.response_complete

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()
            if len(self.connections) <= max_connections:
                return
            alive = [c for c in self.connections if not c.transport.is_closing()]  # closing: not gone yet
            excess = len(alive) - max_connections
            if excess > 0:
                idle = sorted((c for c in alive if c is not self and not getattr(c, "busy", True)),
                              key=lambda c: c.idle_since)
                for conn in idle[:excess]:
                    conn.close_idle()
                if excess > len(idle):  # every other one has a request in progress: refuse this one
                    self.close_idle()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

        def _arm(self) -> None:
            self._disarm()
            self.idle_since = self.loop.time()
            self._armed_cycle = self.cycle
            self._head_timer = self.loop.call_later(header_timeout, self._head_deadline)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_deadline(self) -> None:
            self._head_timer = None
            if self.cycle is self._armed_cycle and not self.busy:  # no request head since armed
                self.close_idle()

        def close_idle(self) -> None:
            """Close this connection (it has no request in progress)."""
            self._disarm()
            if self.transport.is_closing():
                return
            try:
                self.conn.send(h11.ConnectionClosed())
            except h11.LocalProtocolError:
                pass
            self.transport.close()

    return GuardedH11Protocol


def make_server(app, *, log_level: str = "warning", access_log: bool = False,
                header_timeout: float = HEADER_TIMEOUT, keep_alive: float = KEEP_ALIVE,
                max_connections: int = MAX_CONNECTIONS):
    """A ``uvicorn.Server`` for ``app``; ``server.run(sockets=[sock])`` serves until Ctrl-C or
    ``server.should_exit = True``.

    Args:
        app: an ASGI app (:func:`xmodal.serve.create_app`).
        log_level, access_log: uvicorn's logging.
        header_timeout: seconds a connection has to send a whole request head.
        keep_alive: seconds an idle connection is kept after a response.
        max_connections: most open connections (the longest idle are closed beyond it).
    """
    import uvicorn

    if not callable(app):
        raise TypeError(f"app: expected an ASGI app, got {type(app).__name__}")
    if log_level not in ("critical", "error", "warning", "info", "debug", "trace"):
        raise ValueError(f"log_level: expected a uvicorn log level, got {str(log_level)[:40]!r}")
    keep_alive = _seconds(keep_alive, "keep_alive")
    protocol = guarded_protocol(header_timeout=header_timeout, max_connections=max_connections)
    config = uvicorn.Config(app, http=protocol, log_level=log_level, access_log=bool(access_log), lifespan="off",
                            h11_max_incomplete_event_size=MAX_HEADER_BYTES, limit_concurrency=None,
                            timeout_keep_alive=keep_alive, server_header=False)
    return uvicorn.Server(config)
