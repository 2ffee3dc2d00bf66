"""The operating-system edge: spawning job process groups, killing them, and
telling whether a recorded process is still the same living process.

A process is identified by its pid plus its start time (psutil's create_time),
so a pid recycled by an unrelated process is never mistaken for the original.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from enum import Enum
from typing import IO

import psutil

START_TIME_TOLERANCE_S = 1.0
WORKER_MARKER = "spoolctl"


class Liveness(Enum):
    DEAD = "dead"
    ALIVE = "alive"
    INCONCLUSIVE = "inconclusive"


@dataclass(frozen=True)
class ProcessIdentity:
    pid: int
    started_at: float | None


def hostname() -> str:
    return socket.gethostname()


def boot_id() -> str:
    """Identifies this boot of the machine: a different value means a restart."""
    return f"{psutil.boot_time():.0f}"


def process_start_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.Error, OSError):
        return None


def self_identity() -> ProcessIdentity:
    pid = os.getpid()
    return ProcessIdentity(pid, process_start_time(pid))


def probe(pid: int) -> Liveness:
    """os.kill(pid, 0): gone is dead; not ours to signal is inconclusive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return Liveness.DEAD
    except PermissionError:
        return Liveness.INCONCLUSIVE
    except OSError:
        return Liveness.INCONCLUSIVE
    return Liveness.ALIVE


def is_same_process(identity: ProcessIdentity, marker: str | None = None) -> Liveness:
    """Whether `identity` still names the process it named when recorded.

    DEAD when the pid is gone, a zombie, started at another time (recycled), or
    no longer carries `marker` in its command line; INCONCLUSIVE when the
    system will not say; ALIVE otherwise.
    """
    first = probe(identity.pid)
    if first is not Liveness.ALIVE:
        return first
    try:
        proc = psutil.Process(identity.pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return Liveness.DEAD
        if identity.started_at is not None and (
            abs(proc.create_time() - identity.started_at) > START_TIME_TOLERANCE_S
        ):
            return Liveness.DEAD
        if marker is not None and marker not in " ".join(proc.cmdline()):
            return Liveness.DEAD
    except psutil.NoSuchProcess:
        return Liveness.DEAD
    except (psutil.AccessDenied, OSError):
        return Liveness.INCONCLUSIVE
    return Liveness.ALIVE


def spawn_group(
    argv: list[str],
    *,
    cwd: str | None,
    env: dict[str, str],
    stdout: IO[bytes],
    stderr: IO[bytes],
) -> subprocess.Popen[bytes]:
    """Start argv as the leader of a new session (and so a new process group).

    Never through a shell; output goes straight to the given files.
    """
    return subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=stderr,
        start_new_session=True,
        close_fds=True,
    )


def signal_group(pgid: int, sig: signal.Signals) -> bool:
    """Send sig to a whole process group; False if the group is already gone."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False
    return True


def kill_group_if_same(identity: ProcessIdentity, pgid: int, wait_s: float = 5.0) -> bool:
    """SIGKILL a recorded job's process group unless its number may now name
    someone else's group. Returns True if the group was signalled.

    Killed when the leader is still the recorded process, and also when the
    leader has exited (gone or a zombie): the kernel does not reuse a pid while
    a process group of that number has members, so whatever is left of the
    group (grandchildren that outlived their leader) is the job's. Left alone
    when the pid now names another process (recycled), when the system will
    not say, or without a recorded start time to tell the two apart.
    """
    if identity.started_at is None:
        return False
    liveness = is_same_process(identity)
    recycled = liveness is Liveness.DEAD and not _exited(identity.pid)
    if liveness is Liveness.INCONCLUSIVE or recycled:
        return False
    if not signal_group(pgid, signal.SIGKILL):
        return False
    wait_gone(identity.pid, wait_s)
    return True


def kill_process_if_same(identity: ProcessIdentity, marker: str, wait_s: float = 5.0) -> bool:
    """SIGKILL a recorded (hung) worker, only if it is still the same process."""
    if is_same_process(identity, marker) is not Liveness.ALIVE:
        return False
    try:
        os.kill(identity.pid, signal.SIGKILL)
    except OSError:
        return False
    return wait_gone(identity.pid, wait_s)


def wait_gone(pid: int, timeout_s: float) -> bool:
    """Wait until pid has exited; False if it still runs after timeout_s.

    An exited process not yet reaped by its parent (a zombie) counts as gone.
    The pid is normally not our child (a dead worker's job, a hung worker), and
    waiting for its reap would stall the caller for as long as an init that
    reaps lazily takes: psutil's wait() does exactly that for a non-child.
    """
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return _poll_gone(pid, timeout_s)
    try:
        fd: int = opener(pid)
    except ProcessLookupError:
        return True
    except OSError:
        return _poll_gone(pid, timeout_s)
    try:
        ready, _, _ = select.select([fd], [], [], timeout_s)  # readable once it exits
    finally:
        os.close(fd)
    return bool(ready)


def _poll_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not _exited(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def _exited(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True
    except (psutil.AccessDenied, OSError):
        return False
