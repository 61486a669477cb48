"""Sockets and the uvicorn server of ``xmodal serve`` (loopback by default)."""

from __future__ import annotations

import ipaddress
import socket

from xmodal.serve.app import MAX_HEADER_BYTES


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (``127.0.0.0/8``, ``::1``, ``localhost``).

    >>> is_loopback("127.0.0.1"), is_loopback("0.0.0.0")
    (True, False)
    """
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_socket(host: str = "127.0.0.1", port: int = 8000) -> socket.socket:
    """A listening TCP socket on ``host:port`` (``port=0``: a free port, see ``getsockname()``).

    Listening before the server starts means a client may connect at once: the
    connection waits in the backlog until the server accepts it.
    """
    if isinstance(port, bool) or not 0 <= int(port) <= 65535:
        raise ValueError(f"--port: must be in [0, 65535], got {port!r}")
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise ValueError(f"--host: cannot resolve {host!r} ({exc.strerror})") from None
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


def make_server(app, *, log_level: str = "warning", access_log: bool = False):
    """A ``uvicorn.Server`` for ``app``; ``server.run(sockets=[sock])`` serves until Ctrl-C or
    ``server.should_exit = True``."""
    import uvicorn

    config = uvicorn.Config(app, log_level=log_level, access_log=access_log, lifespan="off",
                            h11_max_incomplete_event_size=MAX_HEADER_BYTES, limit_concurrency=64,
                            timeout_keep_alive=5, server_header=False)
    return uvicorn.Server(config)
