"""Run `python -m spoolctl` as real processes without importing SQLAlchemy and
click afresh in each: about a third of a second of CPU a process on the
2-core machine (`-X importtime`), most of what a short verb costs, and the
suite runs some 800 of them.

One server per test process (`python tests/forkserver.py`, started on first
use) imports those two packages once, never spoolctl, and forks a child per
run. The child takes the run's stdin, stdout and stderr as its descriptors
0-2, its working directory, environment and argv, and then runs spoolctl
exactly as `python -m spoolctl` does: spoolctl's own modules are imported in
the child, after its environment is set, and the child exits through the
interpreter's normal shutdown (atexit, flushing, the exit code of SystemExit
or 1 after a traceback). It is a process of its own: its own pid, killed by
the timeout like any other, its files closed by its exit.

What a forked child would not get the same way, the caller runs with exec
instead (`run` falls back to subprocess.run): an environment whose
interpreter settings differ from the server's (any PYTHON* variable, the
locale), or a server that has gone. Left different: the child's parent is
the server, not the test process, and every child has the server's hash
seed. Workers a test starts with `start_worker`, and every process a test
starts itself, are exec'd as before.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping

PRELOADED = ("sqlalchemy", "sqlalchemy.dialects.sqlite", "click")
"""Imported once by the server: third-party packages every verb imports
anyway. Nothing lazily imported by some verbs only (alembic, psutil, psycopg)
is here, so tests of what a verb imports see the truth."""


def _startup_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables the interpreter reads at its start (the encoding of its
    streams, its buffering, its path, warnings...): a fork inherits the
    server's, so they must be the same."""
    return {k: v for k, v in env.items() if k.startswith(("PYTHON", "LC_", "LANG"))}


# -- the server ----------------------------------------------------------------------

Run = tuple[list[str], dict[str, str], str]
"""What a child runs: spoolctl's argv, its environment, its working directory."""


class _Forker:
    """The server's loop: one child per request, its exit status sent back
    once its pidfd is readable. Single-threaded, so a fork copies no lock
    another thread holds."""

    def __init__(self, control: socket.socket) -> None:
        self.control = control
        self.children: dict[int, tuple[int, socket.socket]] = {}
        """pidfd -> (pid, the socket its status is sent on)."""

    def serve(self) -> Run | None:
        """Until the control socket closes (None); in a child, its run."""
        while True:
            with selectors.DefaultSelector() as ready:
                ready.register(self.control, selectors.EVENT_READ)
                for pidfd in self.children:
                    ready.register(pidfd, selectors.EVENT_READ)
                events = ready.select()
            for key, _ in events:
                if key.fileobj is not self.control:
                    self._reap(key.fd)
                    continue
                try:
                    message, fds, _flags, _addr = socket.recv_fds(self.control, 1 << 20, 4)
                except OSError:
                    return None
                if not message:
                    return None
                request = json.loads(message)
                if self._fork(fds):
                    return request["argv"], request["env"], request["cwd"]

    def _fork(self, fds: list[int]) -> bool:
        """Fork with fds (stdin, stdout, stderr, the reply socket): True in the child."""
        reply = socket.socket(fileno=fds[3])
        pid = os.fork()
        if pid == 0:
            self.control.close()
            reply.close()
            for pidfd, (_pid, other) in self.children.items():
                other.close()
                os.close(pidfd)
            for target, fd in enumerate(fds[:3]):
                os.dup2(fd, target)
        for fd in fds[:3]:
            os.close(fd)
        if pid == 0:
            return True
        with contextlib.suppress(OSError):  # a caller gone already learns nothing
            reply.sendall(f"{pid}\n".encode())
        self.children[os.pidfd_open(pid)] = (pid, reply)
        return False

    def _reap(self, pidfd: int) -> None:
        pid, reply = self.children.pop(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        with contextlib.suppress(OSError):  # the caller gave up (its timeout)
            reply.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
        reply.close()


def _main() -> None:
    control = socket.socket(fileno=int(sys.argv[1]))
    for name in PRELOADED:
        __import__(name)
    run = _Forker(control).serve()
    if run is None:
        return
    argv, env, cwd = run
    import runpy

    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.path[0] = os.getcwd()  # what `python -m` puts first
    sys.argv = ["-m", *argv]
    runpy.run_module("spoolctl", run_name="__main__", alter_sys=True)


# -- the client ----------------------------------------------------------------------


class _Server:
    def __init__(self, env: Mapping[str, str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.startup = _startup_env(env)
        self.process = subprocess.Popen(
            [sys.executable, __file__, str(theirs.fileno())],
            env=dict(env),
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        theirs.close()
        self.control = ours
        self.lock = threading.Lock()

    def alive(self) -> bool:
        return self.process.poll() is None


_SERVER: _Server | None = None
_SERVER_PID = -1


def _server(base_env: Mapping[str, str]) -> _Server | None:
    global _SERVER, _SERVER_PID
    if _SERVER is None or os.getpid() != _SERVER_PID:
        _SERVER, _SERVER_PID = _Server(base_env), os.getpid()
    return _SERVER if _SERVER.alive() else None


def run(
    args: list[str], env: Mapping[str, str], timeout: float, base_env: Mapping[str, str]
) -> subprocess.CompletedProcess[str]:
    """`python -m spoolctl ARGS` with stdin from /dev/null and stdout and stderr
    captured as text, as subprocess.run(..., capture_output=True, text=True)
    returns them; forked from the server (started with base_env, the tests'
    usual environment) where the run's interpreter settings match its own."""
    server = _server(base_env)
    if server is None or server.startup != _startup_env(env):
        return _exec(args, env, timeout)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    reply, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    devnull = os.open(os.devnull, os.O_RDONLY)
    request = json.dumps({"argv": args, "env": dict(env), "cwd": os.getcwd()}).encode()
    try:
        with server.lock:
            socket.send_fds(server.control, [request], [devnull, out_w, err_w, theirs.fileno()])
        sent = True
    except OSError:  # the server has gone
        sent = False
    finally:
        for fd in (out_w, err_w, devnull):
            os.close(fd)
        theirs.close()
    if not sent:
        for fd in (out_r, err_r):
            os.close(fd)
        reply.close()
        return _exec(args, env, timeout)
    return _collect(reply, out_r, err_r, args, timeout)


def _collect(
    reply: socket.socket, out_r: int, err_r: int, args: list[str], timeout: float
) -> subprocess.CompletedProcess[str]:
    deadline = time.monotonic() + timeout
    answer = b""
    chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}
    open_fds = {out_r, err_r}
    pid: int | None = None
    code: int | None = None
    watch = selectors.DefaultSelector()
    for fd in open_fds:
        watch.register(fd, selectors.EVENT_READ)
    watch.register(reply, selectors.EVENT_READ)
    try:
        while open_fds or code is None:
            left = deadline - time.monotonic()
            if left <= 0:
                if pid is not None and code is None:  # not once reaped: its pid may be reused
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, 9)
                raise subprocess.TimeoutExpired(["spoolctl", *args], timeout)
            for key, _ in watch.select(left):
                if key.fileobj is reply:
                    data = reply.recv(4096)
                    if not data:
                        watch.unregister(reply)
                        if code is None:
                            raise RuntimeError("the fork server went away during a run")
                        continue
                    answer += data
                    lines = answer.split(b"\n")
                    if len(lines) > 1 and pid is None:
                        pid = int(lines[0])
                    if len(lines) > 2:
                        code = int(lines[1])
                else:
                    data = os.read(key.fd, 65536)
                    if data:
                        chunks[key.fd].append(data)
                    else:
                        watch.unregister(key.fd)
                        open_fds.discard(key.fd)
    finally:
        watch.close()
        reply.close()
        os.close(out_r)
        os.close(err_r)
    return subprocess.CompletedProcess(
        ["spoolctl", *args], code, _text(b"".join(chunks[out_r])), _text(b"".join(chunks[err_r]))
    )


def _text(data: bytes) -> str:
    """As subprocess's text mode decodes: the locale's encoding, universal newlines."""
    import locale

    decoded = data.decode(locale.getpreferredencoding(False))
    return decoded.replace("\r\n", "\n").replace("\r", "\n")


def _exec(
    args: list[str], env: Mapping[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spoolctl", *args],
        capture_output=True,
        text=True,
        env=dict(env),
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


if __name__ == "__main__":
    _main()
