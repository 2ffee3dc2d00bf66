"""An attempt's cgroup around its spawn and its end (`supervise.Execution`'s
containment part): joining it for the spawn, the memory limit once the
worker has left, signalling, suspending and continuing every process of it,
what is left running, what it measured, removing it."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

from spoolctl.runner import containment, procs
from spoolctl.services.claimant import Claim
from spoolctl.services.outcome import Outcome
from spoolctl.states import FailureReason


@contextmanager
def joined(cell: containment.Cell | None) -> Iterator[bool]:
    """The worker inside the attempt's cgroup for its spawn (False: not)."""
    if cell is None:
        yield False
        return
    with cell.joined() as inside:
        yield inside


def kept(cell: containment.Cell | None, inside: bool, claim: Claim) -> containment.Cell | None:
    """The cell a spawned job is in, its memory limit now set (after the
    worker left it); one the job is not in (a failed spawn, a failed move:
    the job then runs as where cgroups are missing) is removed."""
    if cell is None:
        return None
    if not inside:
        cell.close(0)
        return None
    if claim.limits.memory_bytes is not None:
        cell.limit_memory(claim.limits.memory_bytes)
    return cell


def signal_attempt(
    pgid: int, cell: containment.Cell | None, sig: int, token: str | None = None
) -> bool:
    """sig to every process of the attempt: its cgroup where it has one (no
    setsid() leaves that; each process gets it once); else (no cgroup, or
    nothing left in it) its process group and, given the attempt's
    token, every process that carries it (one that left the group included).
    Whether any process got it. Used alike by `signal`, a timeout's or a
    cancel's first signal, suspend and continue."""
    if cell is not None and cell.signal(sig):
        return True  # each process once: a handler counting signals sees one
    sent = procs.signal_group(pgid, signal.Signals(sig))
    if token is None:
        return sent
    for holder in procs.find_token(token, procs.process_start_time(pgid) or 0.0).found:
        try:
            if os.getpgid(holder.pid) != pgid:  # the group's own got it already
                os.kill(holder.pid, sig)
                sent = True
        except OSError:
            continue
    return sent


@dataclass
class Suspended:
    """An attempt `suspend` stopped: its cgroup frozen (`frozen`: every
    process at once, setsid() or not), else SIGSTOP to its process group and
    the holders of its token (weaker: a process that left the group and
    dropped the token from its environment goes on)."""

    pgid: int
    cell: containment.Cell | None
    token: str | None
    since: float
    frozen: bool

    @classmethod
    def stop(
        cls, pgid: int, cell: containment.Cell | None, token: str | None, now: float
    ) -> Suspended:
        frozen = cell is not None and cell.freeze()
        if not frozen:
            signal_attempt(pgid, None, signal.SIGSTOP, token)
        return cls(pgid, cell, token, now, frozen)

    def release(self, now: float | None = None) -> float:
        """Thaw the cgroup, or SIGCONT what was stopped; how long it stood
        still until now (0 without one)."""
        if self.frozen and self.cell is not None:
            self.cell.thaw()
        else:
            signal_attempt(self.pgid, None, signal.SIGCONT, self.token)
        return 0.0 if now is None else max(0.0, now - self.since)


def left_running(pgid: int, cell: containment.Cell | None) -> bool:
    """Whether anything of the attempt still runs: in its cgroup (which no
    setsid() leaves) or in its leader's process group."""
    if cell is not None and cell.populated():
        return True
    return procs.group_running(pgid)


def close(cell: containment.Cell | None, wait_s: float) -> containment.Usage | None:
    """Read what the cgroup measured, then kill what is left and remove it;
    None where there is no open cgroup (nothing measured now)."""
    if cell is None or cell.closed:
        return None
    usage = cell.usage()
    cell.close(wait_s)
    return usage


def measured(
    outcome: Outcome, cell: containment.Cell | None, usage: containment.Usage | None
) -> Outcome:
    """The outcome with the attempt's cgroup path and what it measured; a
    failure after the kernel's OOM killer struck in the cgroup says so."""
    if cell is None:
        return outcome
    usage = usage or containment.Usage()
    if usage.oom_kills and outcome.reason is FailureReason.PROCESS_EXIT:
        error = f"out of memory: OOM-killed in its cgroup ({outcome.error})"
        outcome = replace(outcome, reason=FailureReason.OOM_KILLED, error=error)
    return replace(
        outcome,
        cgroup=cell.path,
        peak_memory_bytes=usage.peak_memory_bytes,
        cpu_time_s=None if usage.cpu_time_s is None else round(usage.cpu_time_s, 6),
    )
