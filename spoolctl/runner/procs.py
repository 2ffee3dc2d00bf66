"""The operating-system edge: spawning job process groups, killing them, and
telling whether a recorded process is still the same living process.

A process is identified by its pid plus its start time (psutil's create_time),
so a pid recycled by an unrelated process is never mistaken for the original.
A pid only means that process where it was read: in the same PID namespace
of the same machine (`pid_space`).
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import time
from collections.abc import Container, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import IO, TYPE_CHECKING

from spoolctl.runner.starttime import boot_time as boot_time
from spoolctl.runner.starttime import process_start_time as process_start_time

if TYPE_CHECKING:
    import psutil
else:
    from spoolctl.runner.starttime import PSUTIL_ON_FIRST_USE as psutil

START_TIME_TOLERANCE_S = 1.0
WORKER_MARKER = "spoolctl"
TOKEN_ENV = "SPOOLCTL_ATTEMPT_TOKEN"
"""Environment variable that marks every process of one attempt (set before
the spawn, inherited by the job's children), so an orphan is found even when
its worker died before it could record the job's pid."""
GROUP_POLL_S = 0.01


class Liveness(Enum):
    DEAD = "dead"
    ALIVE = "alive"
    INCONCLUSIVE = "inconclusive"


@dataclass(frozen=True)
class ProcessIdentity:
    pid: int
    started_at: float | None


def hostname() -> str:
    """This machine's name (SPOOLCTL_TEST_HOSTNAME poses as another machine)."""
    return os.environ.get("SPOOLCTL_TEST_HOSTNAME") or socket.gethostname()


def boot_id() -> str:
    """Identifies this boot of the machine: a different value means a restart
    (SPOOLCTL_TEST_BOOT_ID poses as another machine)."""
    return os.environ.get("SPOOLCTL_TEST_BOOT_ID") or f"{boot_time():.0f}"


MACHINE_ID_FILES = ("/etc/machine-id", "/var/lib/dbus/machine-id")


def pid_space() -> str | None:
    """Where this process's pids name the processes they name: the machine
    (its machine id), the PID namespace (the device and inode of
    /proc/self/ns/pid, with the start of that namespace's PID 1, since a
    namespace's inode number is reused once it is gone) and the cgroup
    namespace (the recorded cgroup paths of jobs are read relative to it).
    Host name and boot time do not tell these apart: `unshare --pid`, a
    container sharing the host's UTS namespace or network, a Kubernetes pod on
    the host network all keep them. None when the namespace cannot be read:
    then no other worker's pids are taken for this one's, nor this one's for
    theirs."""
    try:
        pid_ns = os.stat("/proc/self/ns/pid")
    except OSError:
        return None
    cgroup_ns = _namespace("cgroup")
    return (
        f"machine {_machine_id() or '?'} pid {pid_ns.st_dev}:{pid_ns.st_ino}@{_init_started()}"
        f" cgroup {cgroup_ns}"
    )


def _machine_id() -> str | None:
    for path in MACHINE_ID_FILES:
        try:
            with open(path, encoding="ascii", errors="replace") as handle:
                found = handle.read(64).strip()
        except OSError:
            continue
        if found:
            return found
    return None


def _namespace(kind: str) -> str:
    try:
        found = os.stat(f"/proc/self/ns/{kind}")
    except OSError:
        return "?"
    return f"{found.st_dev}:{found.st_ino}"


def _init_started() -> str:
    """When this PID namespace's PID 1 started, in clock ticks since boot
    (as /proc shows it here), or '?'."""
    try:
        with open("/proc/1/stat", encoding="ascii", errors="replace") as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return "?"


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


def is_same_process(
    identity: ProcessIdentity, marker: str | None = None, *, existed_at: float | None = None
) -> Liveness:
    """Whether `identity` still names the process it named when recorded.

    DEAD when the pid is gone, a zombie, started at another time (recycled),
    started after `existed_at` (a bare pid recorded then cannot name a younger
    process), or no longer carries `marker` in its command line; INCONCLUSIVE
    when the system will not say; ALIVE otherwise.
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
        if existed_at is not None and proc.create_time() > existed_at + START_TIME_TOLERANCE_S:
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
    env: Mapping[bytes, bytes],
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


def end_group(identity: ProcessIdentity, pgid: int, wait_s: float = 5.0) -> str | None:
    """SIGKILL a recorded job's process group and confirm nothing of it runs
    any more. None when the group is confirmed gone; else why it is not.

    Killed when the leader is still the recorded process, and also when the
    leader has exited (gone or a zombie): the kernel does not reuse a pid while
    a process group of that number has members, so whatever is left of the
    group (grandchildren that outlived their leader) is the job's. A pid that
    now names another process (recycled) means the group is gone. Without a
    recorded start time, or when the system will not say, nothing is confirmed.
    """
    if identity.started_at is None:
        return f"pid {identity.pid} was recorded without its start time"
    liveness = is_same_process(identity)
    if liveness is Liveness.INCONCLUSIVE:
        return f"cannot tell whether pid {identity.pid} is still the job"
    if liveness is Liveness.DEAD and not _exited(identity.pid):
        return None  # recycled: the group number was free, so the group is gone
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return None
    except OSError as exc:
        return f"cannot kill process group {pgid}: {exc.strerror or exc}"
    if not wait_gone(identity.pid, wait_s) or not wait_group_gone(pgid, wait_s):
        return f"process group {pgid} still runs {wait_s:.0f}s after SIGKILL"
    return None


def belongs_to(pid: int, spared: Container[int]) -> bool:
    """Whether pid is one of `spared`, or in the process group or session
    one of them leads (a job leads its own session: its children stay in
    it unless they leave)."""
    if pid in spared:
        return True
    try:
        return os.getpgid(pid) in spared or os.getsid(pid) in spared
    except OSError:
        return False


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
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        ready = poller.poll(timeout_s * 1000)  # readable once it exits (poll: any fd number)
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


def group_exists(pgid: int) -> bool:
    """Whether any process (a zombie included) is still in process group pgid."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def group_only_zombies(pgid: int) -> bool:
    """Whether every process left in group pgid has exited: zombies that their
    parent (often an init that reaps lazily) has not reaped yet hold the group
    number but run nothing. Costs one getpgid call per process on the machine."""
    for pid in psutil.pids():
        try:
            if os.getpgid(pid) != pgid:
                continue
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except (psutil.Error, OSError):
            continue
    return True


def group_running(pgid: int) -> bool:
    """Whether anything in group pgid still runs (zombies do not count)."""
    return group_exists(pgid) and not group_only_zombies(pgid)


def wait_group_gone(pgid: int, timeout_s: float) -> bool:
    """Wait until nothing runs in group pgid any more; False on timeout."""
    deadline = time.monotonic() + timeout_s
    while group_running(pgid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(GROUP_POLL_S)
    return True


@dataclass(frozen=True)
class TokenScan:
    """Processes that carry an attempt's token, and those that might."""

    found: list[ProcessIdentity]
    unreadable: list[int]
    """Processes of this user, started since the attempt, whose environment
    could not be read (a set-uid program): one of them may be the job."""


def find_token(token: str, started_after: float) -> TokenScan:
    """Every living process started since `started_after` whose environment
    holds TOKEN_ENV=token (the leader of an attempt and its descendants)."""
    found: list[ProcessIdentity] = []
    unreadable: list[int] = []
    me, uid = os.getpid(), os.getuid()
    floor = started_after - START_TIME_TOLERANCE_S
    for proc in psutil.process_iter(["create_time"]):
        created = proc.info.get("create_time")
        if proc.pid in (me, 1) or created is None or created < floor:
            continue
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get(TOKEN_ENV) == token:
                found.append(ProcessIdentity(proc.pid, created))
        except psutil.NoSuchProcess:
            continue
        except (psutil.AccessDenied, OSError):
            if _real_uid(proc) == uid:
                unreadable.append(proc.pid)
    return TokenScan(found, unreadable)


def _real_uid(proc: psutil.Process) -> int | None:
    try:
        return int(proc.uids().real)
    except (psutil.Error, OSError):
        return None


def kill_token_holders(scan: TokenScan, wait_s: float) -> list[int]:
    """SIGKILL every process the scan found (with its group when it leads
    one); returns the pids still running after wait_s."""
    for identity in scan.found:
        if is_same_process(identity) is not Liveness.ALIVE:
            continue
        try:
            if os.getpgid(identity.pid) == identity.pid:
                os.killpg(identity.pid, signal.SIGKILL)
            else:
                os.kill(identity.pid, signal.SIGKILL)
        except OSError:
            continue
    return [i.pid for i in scan.found if not wait_gone(i.pid, wait_s)]
