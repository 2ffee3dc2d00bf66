"""Each attempt in a cgroup of its own, where the system allows it.

A contained attempt's cgroup is made before its spawn; the worker moves
itself into it for the spawn and back out at once (`Cell.joined`), so the
job is born inside it, before its first instruction, and so is everything
it ever forks: `setsid()` or an emptied environment cannot take a process
out. Ending the attempt kills the cgroup (`cgroup.kill`, or freeze and
kill), then removes it. The spawn itself is unchanged (posix_spawn or
Popen, the same descriptors, signals, environment and errors), and the
recorded pid is the job's.

A memory limit is written after the worker has left the cgroup (the kernel
would count the worker among the candidates of an OOM kill while it is in
it); a cpu limit before. Where cgroups cannot be made, `Containment` says
why and hands out no cells: process groups and the attempt token, as before.

Pure file-system operations; no click, no database.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass

from spoolctl.runner.containment import cgroup, hierarchy
from spoolctl.runner.containment.sites import (
    ENV,
    UNKNOWN_NAMESPACE,
    Site,
    Status,
    choose,
    legacy_tag,
    owner,
    pid_namespace,
    tag,
)

__all__ = [
    "ENV",
    "NO_LIMITS",
    "Cell",
    "Containment",
    "Limits",
    "Status",
    "Usage",
    "end_path",
    "report",
]

CPU_PERIOD_US = 100_000


@dataclass(frozen=True)
class Limits:
    memory_bytes: int | None = None
    cpus: float | None = None

    @property
    def any(self) -> bool:
        return self.memory_bytes is not None or self.cpus is not None


NO_LIMITS = Limits()


@dataclass(frozen=True)
class Usage:
    """What the cgroup measured for an attempt (None: not measured here)."""

    peak_memory_bytes: int | None = None
    cpu_time_s: float | None = None
    oom_kills: int = 0


class Cell:
    """One attempt's cgroup: a directory in each site, the primary first."""

    def __init__(self, pairs: list[tuple[Site, str]]) -> None:
        self.pairs = pairs
        self.closed = False
        self._emptied = False
        """Seen with no process once its job had started: nothing can come
        into it again (no process is left to fork, and nothing moves one in),
        so closing it only removes its directories."""

    @property
    def primary(self) -> str:
        return self.pairs[0][1]

    @property
    def path(self) -> str:
        """What the attempt row records: every directory, one a line."""
        return "\n".join(directory for _, directory in self.pairs)

    def _dir(self, role: str) -> str | None:
        return next((d for s, d in self.pairs if s.role == role), None)

    @contextmanager
    def joined(self) -> Iterator[bool]:
        """This process is in the cell for the body (a spawn); yields False,
        in its own cgroups, when it could not move (the spawn then goes
        uncontained, as where cgroups are missing)."""
        me, moved = str(os.getpid()), []
        try:
            for site, directory in self.pairs:
                cgroup.write(directory, "cgroup.procs", me)
                moved.append(site)
        except OSError:
            self._home(moved, me)
            yield False
            return
        try:
            yield True
        finally:
            self._home(moved, me)

    @staticmethod
    def _home(moved: list[Site], me: str) -> None:
        for site in reversed(moved):
            cgroup.write(site.home, "cgroup.procs", me)

    def limit_memory(self, limit: int) -> bool:
        directory = self._dir("memory") or self.primary
        name = "memory.limit_in_bytes" if self._dir("memory") else "memory.max"
        try:
            cgroup.write(directory, name, str(limit))
        except OSError:
            return False
        return True

    def limit_cpus(self, cpus: float) -> bool:
        quota = max(1000, round(cpus * CPU_PERIOD_US))
        try:
            if self._dir("cpu") is not None:
                directory = self._dir("cpu")
                assert directory is not None
                cgroup.write(directory, "cpu.cfs_period_us", str(CPU_PERIOD_US))
                cgroup.write(directory, "cpu.cfs_quota_us", str(quota))
            else:
                cgroup.write(self.primary, "cpu.max", f"{quota} {CPU_PERIOD_US}")
        except OSError:
            return False
        return True

    def populated(self) -> bool:
        found = cgroup.populated(self.primary)
        self._emptied = self._emptied or not found
        return found

    def signal(self, sig: int) -> bool:
        """sig to every process of the attempt; whether there was any."""
        import signal as signals

        found = cgroup.signal_all(self.primary, signals.Signals(sig))
        self._emptied = self._emptied or not found
        return found

    def kill(self) -> None:
        with suppress(OSError):
            cgroup.kill(self.primary)

    def freeze(self) -> bool:
        """Stop every process of the attempt at once, setsid() or not (the
        primary site's freezer); False where it has none (nothing done)."""
        try:
            return cgroup.freeze(self.primary)
        except OSError:
            return False

    def thaw(self) -> None:
        cgroup.thaw(self.primary)

    def usage(self) -> Usage:
        memory, primary = self._dir("memory"), self.primary
        if memory is not None:
            peak = cgroup.number(memory, "memory.max_usage_in_bytes")
            ooms = cgroup.keyed(memory, "memory.oom_control").get("oom_kill", 0)
        else:
            peak = cgroup.number(primary, "memory.peak")
            ooms = cgroup.keyed(primary, "memory.events").get("oom_kill", 0)
        usec = cgroup.keyed(primary, "cpu.stat").get("usage_usec")
        cpu: float | None = None if usec is None else usec / 1e6
        acct = self._dir("cpuacct") or self._dir("cpu")
        if cpu is None and acct is not None:
            nanos = cgroup.number(acct, "cpuacct.usage")
            cpu = None if nanos is None else nanos / 1e9
        return Usage(peak, cpu, ooms)

    def close(self, wait_s: float = 5.0) -> bool:
        """Kill what is left, wait for it, remove every directory; whether
        all went (a cell is closed once)."""
        if self.closed:
            return True
        self.closed = True
        directories = [d for _, d in self.pairs]
        if self._emptied:
            return all([cgroup.remove(d) for d in directories])
        return end_dirs(directories, wait_s)


def end_dirs(directories: list[str], wait_s: float) -> bool:
    """Kill and remove attempt cgroups (the first holds the kill)."""
    if not directories or not os.path.isdir(directories[0]):
        return all(cgroup.remove(d) for d in directories)
    with suppress(OSError):
        if cgroup.populated(directories[0]):
            cgroup.kill(directories[0])
    cgroup.thaw(directories[0])  # a suspended (frozen) attempt: its killed tasks may exit
    if not cgroup.wait_empty(directories[0], wait_s):
        return False
    return all([cgroup.remove(d) for d in directories])


def end_path(recorded: str, wait_s: float) -> bool | None:
    """End a recorded attempt's cgroup (its row's path); True when nothing of
    it runs any more and its directories are gone, False when something still
    runs, None when this process may not kill it (another user's cgroup: the
    caller judges the attempt by its processes instead). Every directory
    still there is looked at, not only the first: a root worker's sweep may
    have removed the first once it was empty, leaving one this process can
    neither kill nor remove."""
    directories = [line for line in recorded.splitlines() if line.strip()]
    for directory in directories:
        if os.path.isdir(directory) and not os.access(
            os.path.join(directory, "cgroup.procs"), os.W_OK
        ):
            return None
    return end_dirs(directories, wait_s)


class Containment:
    """A worker's containment: its status, and a cell for each attempt."""

    def __init__(self, status: Status, worker_tag: str) -> None:
        self.status = status
        self.tag = worker_tag

    @classmethod
    def for_worker(cls, worker_id: str) -> Containment:
        """Probe (make this worker's directories, prove a move) and decide."""
        status = choose(hierarchy.discover(), os.environ.get(ENV), worker_id, probe=True)
        found = cls(status, tag(worker_id, os.getpid()))
        found.remove_empty_leftovers()
        return found

    @classmethod
    def none(cls) -> Containment:
        """No cgroups (a worker before it probed)."""
        return cls(Status(reason="not probed"), "")

    @property
    def contained(self) -> bool:
        return self.status.contained

    @property
    def enforces(self) -> tuple[bool, bool]:
        """Whether this worker can limit (memory, cpu)."""
        status = self.status
        return (
            status.contained and status.memory is not None,
            status.contained and status.cpu is not None,
        )

    def cell(self, attempt_id: int, limits: Limits) -> Cell | None:
        """A new cgroup for an attempt (cpu limit set), or None when it
        cannot be made (the attempt then runs as where cgroups are missing)."""
        if not self.contained:
            return None
        sites = [s for s in self.status.sites if s.role != "cpu" or limits.cpus is not None]
        pairs = [(s, os.path.join(s.tag_dir(self.tag), f"a{attempt_id}")) for s in sites]
        made: list[str] = []
        try:
            for _, directory in pairs:
                try:
                    cgroup.make(directory)
                except FileNotFoundError:  # its parent was removed under it: made again
                    cgroup.make(os.path.dirname(directory))
                    cgroup.make(directory)
                made.append(directory)
        except OSError:
            for directory in made:
                cgroup.remove(directory)
            return None
        cell = Cell(pairs)
        if limits.cpus is not None and self.status.cpu is not None:
            cell.limit_cpus(limits.cpus)
        return cell

    def sweep(self, worker_id: str, pid: int, wait_s: float) -> bool:
        """End and remove every attempt cgroup a dead worker (its id and pid)
        left in this worker's sites, then its directories; whether all went.
        The reaper asks only for a worker of this pid space, so its directory
        carries this worker's PID namespace; the name an older spoolctl gave
        it (without the namespace) is swept too: that id and pid were the
        dead worker's, its registration the latest of that id."""
        if not self.contained:
            return True
        names, clean = (tag(worker_id, pid), legacy_tag(worker_id, pid)), True
        for site in self.status.sites:
            for folder in (site.tag_dir(name) for name in names):
                try:
                    leaves = sorted(e.path for e in os.scandir(folder) if e.is_dir())
                except OSError:
                    continue
                for leaf in leaves:
                    clean = end_dirs([leaf], wait_s) and clean
                clean = cgroup.remove(folder) and clean
        return clean

    def remove_empty_leftovers(self) -> None:
        """Remove the empty directories of workers in this PID namespace
        whose process is gone (a SIGKILLed worker that had no job, or whose
        jobs ended): a worker's directory name ends with its namespace and
        its pid (`sites.owner`). Another namespace's worker may share this
        cgroup tree, and its pid names nothing here, or another process: its
        directories are never judged (`_owner_gone`). Anything with a
        process in it is left to the reaper, which judges the job first."""
        namespace = pid_namespace()
        for site in self.status.sites:
            top = os.path.join(site.base, "spoolctl")
            try:
                found = [e.path for e in os.scandir(top) if e.is_dir()]
            except OSError:
                continue
            for folder in found:
                if not _owner_gone(folder, namespace):
                    continue
                with suppress(OSError):
                    for leaf in [e.path for e in os.scandir(folder) if e.is_dir()]:
                        if not cgroup.populated(leaf):
                            cgroup.remove(leaf, 0)
                cgroup.remove(folder, 0)

    def close(self) -> None:
        """Remove this worker's own directories (empty once its jobs ended)."""
        for site in self.status.sites:
            with suppress(OSError):
                cgroup.remove(os.path.join(site.tag_dir(self.tag), "probe"), 0)
            cgroup.remove(site.tag_dir(self.tag), 0)


def _owner_gone(folder: str, namespace: str) -> bool:
    """Whether the worker a directory is named after is gone: told only for
    a worker of `namespace` (this worker's PID namespace), where its pid
    names it. False for a directory of another namespace's worker (alive or
    not, that cannot be told from here), for one named in the format before
    the namespace was in the name (an older spoolctl's, from any namespace:
    the reaper's `sweep` of that worker removes it, or it stays, empty), for
    any name that carries no pid, and for all while this worker's namespace
    is unknown. A namespace's inode is reused only once that namespace is
    gone, and every worker that was in it with it: a directory named after
    this namespace is one of a worker in it, or of a dead one."""
    found = owner(os.path.basename(folder))
    if found is None or found[0] != namespace or namespace == UNKNOWN_NAMESPACE:
        return False
    pid = found[1]
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def report() -> Status:
    """What a worker here would get, judged without changing anything."""
    return choose(hierarchy.discover(), os.environ.get(ENV), None, probe=False)
