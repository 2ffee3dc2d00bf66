"""When a process started, and when this machine booted, read from /proc as
psutil reads them (its create_time: the start in clock ticks since boot,
over the ticks per second, plus /proc/stat's btime), so that a worker's
start and its spawn records pay neither psutil's import nor a
psutil.Process each. A process is identified by its pid and this start
time (`procs.ProcessIdentity`); a reaper confirms it with psutil, and the
two readings agree to the bit. psutil answers where /proc does not."""

from __future__ import annotations

import os
from typing import Any

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def boot_time() -> float:
    """When this machine booted: no process of ours can have locked anything before."""
    try:
        with open("/proc/stat", "rb") as handle:
            for line in handle:
                if line.startswith(b"btime"):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    import psutil

    return float(psutil.boot_time())


def process_start_time(pid: int) -> float | None:
    """When pid started, in seconds since the epoch; None where it is gone or
    the system will not say."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            ticks = float(handle.read().rsplit(b")", 1)[1].split()[19])
    except (FileNotFoundError, ProcessLookupError):
        return None
    except (OSError, IndexError, ValueError):
        return _asking_psutil(pid)
    return ticks / CLOCK_TICKS + boot_time()


def _asking_psutil(pid: int) -> float | None:
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.Error, OSError):
        return None


class _OnFirstUse:
    """psutil, imported when a reap or a liveness check first needs it
    (`procs.py` asks it through this)."""

    def __getattr__(self, name: str) -> Any:
        import psutil

        return getattr(psutil, name)


PSUTIL_ON_FIRST_USE: Any = _OnFirstUse()
