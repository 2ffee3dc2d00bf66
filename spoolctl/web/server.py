"""Listening. The socket is bound here, on the one address asked for, before
the URL is printed, so that port 0 gives a free port whose number is known;
uvicorn then serves the app on that socket and nowhere else. SIGINT or
SIGTERM stops it gracefully (a second SIGINT at once), and `serve` returns
the signal's name instead of re-raising it."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from types import FrameType

import uvicorn
from starlette.types import ASGIApp

from spoolctl.errors import InvalidInput

BACKLOG = 128
GRACE_S = 5


@dataclass(frozen=True)
class Listener:
    """A bound, listening socket and how to reach it."""

    sock: socket.socket
    host: str
    """The host as asked for (a name or an address)."""
    address: str
    port: int

    @property
    def url(self) -> str:
        shown = self.host
        if _is_unspecified(self.address):
            shown = socket.gethostname()
        elif ":" in shown:
            shown = f"[{shown}]"
        return f"http://{shown}:{self.port}/"


def _is_unspecified(address: str) -> bool:
    return ipaddress.ip_address(address).is_unspecified


def addresses_of(host: str) -> list[str]:
    """The addresses a host name or literal stands for (IPv4 first)."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise InvalidInput(f"cannot resolve --host {host!r}: {exc}", host=host) from None
    found = list(dict.fromkeys(str(info[4][0]).split("%")[0] for info in infos))
    return sorted(found, key=lambda a: ":" in a)


def is_loopback(addresses: list[str]) -> bool:
    """Every address is a loopback one (127.0.0.0/8 or ::1)."""
    return bool(addresses) and all(ipaddress.ip_address(a).is_loopback for a in addresses)


def listen(host: str, address: str, port: int) -> Listener:
    """Bind and listen on exactly `address`; INVALID_INPUT when that cannot be done."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((address, port))
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        hint = "pick another --port, or 0 for a free one" if port else "check --host"
        raise InvalidInput(
            f"cannot listen on {host} port {port}: {exc.strerror or exc}; {hint}",
            host=host,
            port=port,
        ) from None
    sock.set_inheritable(False)
    return Listener(sock, host, address, int(sock.getsockname()[1]))


class _Server(uvicorn.Server):
    """uvicorn's server, whose signal handling ends `serve` instead of
    re-raising the signal after shutdown."""

    stopped_by: str | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def stop(sig: int, frame: FrameType | None) -> None:
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True
            self.should_exit = True
            self.stopped_by = self.stopped_by or signal.Signals(sig).name

        handled = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, stop) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


def quiet_logging() -> None:
    """Warnings and errors only, one line each on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("spoolctl web: %(message)s"))
    for name in ("spoolctl.web", "uvicorn", "uvicorn.error"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(logging.WARNING)
        logger.propagate = False


def serve(app: ASGIApp, listener: Listener) -> str | None:
    """Serve until SIGINT/SIGTERM; returns the signal's name."""
    quiet_logging()
    config = uvicorn.Config(
        app,
        log_config=None,
        log_level="warning",
        access_log=False,
        lifespan="off",
        proxy_headers=False,
        server_header=False,
        http="h11",
        ws="none",
        loop="asyncio",
        timeout_graceful_shutdown=GRACE_S,
    )
    server = _Server(config)
    asyncio.run(server.serve(sockets=[listener.sock]))
    return server.stopped_by
