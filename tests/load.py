"""The suite on a saturated machine, by its own means: SPOOLCTL_TEST_LOAD=N
makes the test session start N busy loops (`./scripts/test` with
SPOOLCTL_TEST_LOAD=2 saturates a 2-core machine on top of the suite's own
work), so that a test that leans on timing fails here rather than on a
loaded CI machine.

They are started once per run, by the process that runs the session (with
pytest-xdist, the controller, not each worker: tests/conftest.py's
pytest_configure), before the tests' process starts are watched, so they
count for no test's `subprocess` mark. Each is a plain `python -c` loop at
the default priority, all in one process group of their own, killed with the
group by pytest_unconfigure or, should that not run, at exit (atexit). A
loop also ends by itself once its parent is gone (it would be reparented):
a test process killed outright leaves none spinning.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys

LOAD_ENV = "SPOOLCTL_TEST_LOAD"
MAX_LOAD = 64

BUSY_LOOP = """
import os
parent = os.getppid()
while os.getppid() == parent:
    for _ in range(1_000_000):
        pass
"""
"""Spins until its parent is gone (a look every few milliseconds)."""


def load_from_env() -> int:
    """How many busy loops SPOOLCTL_TEST_LOAD asks for (0: unset)."""
    raw = os.environ.get(LOAD_ENV, "").strip()
    if not raw:
        return 0
    if not raw.isdigit() or int(raw) > MAX_LOAD:
        raise ValueError(f"{LOAD_ENV} must be a whole number from 0 to {MAX_LOAD}, got {raw!r}")
    return int(raw)


class Load:
    """N busy loops in one process group of their own."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.procs: list[subprocess.Popen[bytes]] = []
        self.pgid: int | None = None

    def start(self) -> None:
        if self.count <= 0 or self.procs:
            return
        atexit.register(self.stop)
        self.pgid = self._spawn().pid  # the leader of a process group of its own
        for _ in range(self.count - 1):
            self._spawn()

    def _spawn(self) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [sys.executable, "-c", BUSY_LOOP],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            process_group=0 if self.pgid is None else self.pgid,
        )
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        """Kill the group and reap its loops; safe to call twice."""
        if self.pgid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pgid, signal.SIGKILL)
            self.pgid = None
        while self.procs:
            self.procs.pop().wait()

    def describe(self) -> str:
        return f"{LOAD_ENV}={self.count}: {self.count} busy loops (process group {self.pgid})"
