"""Operations on one cgroup directory: plain reads and writes of its files.

Works on either version: what differs (how to freeze, where usage is) is
decided from the files the directory has, not from a version flag, so a
v2 kernel without `cgroup.kill` (before 5.14) falls back to freezing.
Every call raises OSError as the file system does; callers decide.
"""

from __future__ import annotations

import errno
import os
import signal
import time
from contextlib import suppress

FREEZE_WAIT_S = 1.0
"""How long a freeze may take to settle before the kill goes out anyway."""
POLL_S = 0.005


def write(directory: str, name: str, value: str) -> None:
    """One write(2) of value to a cgroup file (a partial write is an error)."""
    fd = os.open(os.path.join(directory, name), os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def read(directory: str, name: str) -> str:
    """The whole file (cgroup files are small and read in one go): os.read,
    not a text stream, which costs a contained job several of these."""
    fd = os.open(os.path.join(directory, name), os.O_RDONLY)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("ascii", errors="replace")


def keyed(directory: str, name: str) -> dict[str, int]:
    """A flat keyed file ("key value" per line) as integers; {} if unreadable."""
    try:
        text = read(directory, name)
    except OSError:
        return {}
    found = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            found[parts[0]] = int(parts[1])
    return found


def number(directory: str, name: str) -> int | None:
    try:
        text = read(directory, name).strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def pids(directory: str) -> list[int]:
    """The processes in the cgroup (not its descendants); [] once it is gone."""
    try:
        text = read(directory, "cgroup.procs")
    except OSError:
        return []
    return [int(p) for p in text.split() if p.isdigit()]


def populated(directory: str) -> bool:
    """Whether any process is in the cgroup or below it (v2: cgroup.events;
    v1: its own cgroup.procs, spoolctl makes no children there)."""
    events = keyed(directory, "cgroup.events")
    if "populated" in events:
        return events["populated"] != 0
    return bool(pids(directory))


def signal_all(directory: str, sig: signal.Signals) -> bool:
    """Send sig to every process in the cgroup; whether there was any."""
    found = pids(directory)
    for pid in found:
        with suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
    return bool(found)


def kill(directory: str) -> None:
    """SIGKILL everything in the cgroup so that nothing can escape by forking:
    `cgroup.kill` where the kernel has it (one write, atomic), else freeze
    (v2 cgroup.freeze, v1 freezer.state), SIGKILL each process, thaw."""
    if os.path.exists(os.path.join(directory, "cgroup.kill")):
        write(directory, "cgroup.kill", "1")
        return
    frozen = _freeze(directory)
    try:
        signal_all(directory, signal.SIGKILL)
    finally:
        if frozen:
            _thaw(directory)


def freeze(directory: str) -> bool:
    """Freeze every process in the cgroup (v2 cgroup.freeze, v1
    freezer.state) and wait, up to FREEZE_WAIT_S, until the kernel says it
    is; False where the cgroup has no freezer (nothing was done)."""
    return _freeze(directory)


def thaw(directory: str) -> None:
    """Undo `freeze` (nothing where the cgroup has no freezer, or is gone)."""
    _thaw(directory)


def _freeze(directory: str) -> bool:
    v2 = os.path.exists(os.path.join(directory, "cgroup.freeze"))
    if v2:
        write(directory, "cgroup.freeze", "1")
    elif os.path.exists(os.path.join(directory, "freezer.state")):
        write(directory, "freezer.state", "FROZEN")
    else:
        return False  # no freezer: a kill loop, repeated by the caller until empty
    deadline = time.monotonic() + FREEZE_WAIT_S
    while not _frozen(directory, v2) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    return True


def _frozen(directory: str, v2: bool) -> bool:
    if v2:
        return keyed(directory, "cgroup.events").get("frozen") == 1
    return read(directory, "freezer.state").strip() == "FROZEN"


def _thaw(directory: str) -> None:
    with suppress(OSError):
        if os.path.exists(os.path.join(directory, "cgroup.freeze")):
            write(directory, "cgroup.freeze", "0")
        elif os.path.exists(os.path.join(directory, "freezer.state")):
            write(directory, "freezer.state", "THAWED")


def wait_empty(directory: str, timeout_s: float) -> bool:
    """Wait until no process is left in the cgroup; False on timeout. Killed
    again on each look: a process forked during the kill is not missed."""
    deadline = time.monotonic() + timeout_s
    while populated(directory):
        if time.monotonic() >= deadline:
            return False
        with suppress(OSError):
            kill(directory)
        time.sleep(POLL_S)
    return True


def remove(directory: str, timeout_s: float = 1.0) -> bool:
    """rmdir the cgroup (gone already counts); EBUSY while the kernel still
    releases exited processes is retried for up to timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            os.rmdir(directory)
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() >= deadline:
                return False
        time.sleep(POLL_S)


def make(directory: str) -> None:
    """mkdir the cgroup; one left by an earlier life of this worker is reused."""
    with suppress(FileExistsError):
        os.mkdir(directory)
