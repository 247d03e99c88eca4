"""Binding the socket and running uvicorn: the part of ``serve`` that touches the network.

The socket is bound before uvicorn starts, so a busy port is one clear error (not a log
line from inside uvicorn) and port 0 tells the real port to print.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from contextlib import contextmanager

import uvicorn

from ..errors import UserError


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 and ``localhost``: the only hosts served without an API key."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port; a busy port or a bad address is a UserError."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def make_server(app, log_level: str = "warning") -> uvicorn.Server:
    """A uvicorn server for ``app``; run it with ``server.run(sockets=[sock])``."""
    config = uvicorn.Config(app, log_level=log_level, access_log=False, lifespan="on",
                            timeout_graceful_shutdown=2)
    return uvicorn.Server(config)


@contextmanager
def running(app, host: str = "127.0.0.1", port: int = 0, timeout: float = 20.0):
    """Serve ``app`` from a background thread for the ``with`` block; yields its URL.

    For tests and benchmarks: the server stops (and its thread is joined) on leaving."""
    sock = bind(host, port)
    server = make_server(app)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            sock.close()
            raise RuntimeError("the server did not start")
        time.sleep(0.02)
    try:
        yield url_of(sock)
    finally:
        server.should_exit = True
        thread.join(timeout)
        sock.close()
