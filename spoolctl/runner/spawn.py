"""Starting a job's process with os.posix_spawn instead of subprocess.Popen.

Popen's fork/exec path costs about 0.2 ms more per job than posix_spawn
(Python code around the fork, and the pipe on which its child reports a
failed exec); a worker that drains `true` jobs spends a good part of its
time there. posix_spawn (glibc: clone(CLONE_VFORK) and exec, the error
reported through shared memory) starts the same process for less, provided
the worker does by itself what Popen does in its child:

- the session: setsid=True, so the job leads its own session and process
  group as with start_new_session=True, and a group kill reaches all of it;
- stdin from /dev/null (opened read-write, as subprocess.DEVNULL is), stdout
  and stderr dup2'ed from the attempt's output files;
- signals: Popen (restore_signals=True) sets SIGPIPE and SIGXFSZ, which
  Python ignores at start-up, back to their default; the exec resets what
  the worker handles (SIGINT, SIGTERM). setsigdef does both, so a job never
  inherits an ignore of those even should the worker ignore them one day;
  other dispositions pass on as under Popen. The mask is emptied: Popen
  passes on the worker's, which is empty (nothing in spoolctl blocks a
  signal), so a job sees no difference, and one blocked by whoever started
  the worker cannot reach a job either. One difference remains: glibc's
  posix_spawn (2.36 at least) leaves its own two internal signals (kernel
  numbers 32 and 33) ignored in the child, and setsigdef cannot name them
  (glibc refuses them to sigaddset). No program can set or name them through
  glibc, which takes them over when it needs them; only a program without
  glibc that relies on their default action would notice;
- descriptors: Popen (close_fds=True) closes every descriptor but 0, 1 and 2
  in its child. posix_spawn in Python 3.11 has no action for that, so before
  each spawn every descriptor from 3 up is marked close-on-exec in the
  worker itself (close_range(2) with CLOSE_RANGE_CLOEXEC, Linux 5.11+, one
  syscall). Python opens its own descriptors close-on-exec already; this
  catches those a C library opened without it (a driver's socket, a
  database file) and any the worker inherited. The worker never means to
  pass a descriptor to a program it execs, so marking its own is harmless;
- PATH: Popen tries each directory of the job environment's PATH (the
  worker's, or the one the job's --env sets; os.defpath when there is none)
  in turn, as execvp does; so does `Spawner`, and it remembers what it found.

Where posix_spawn cannot say what the job needs, the job goes through Popen
as before (`procs.spawn_group`): a job with a working directory (Python 3.11
has no chdir file action), no os.posix_spawn or no setsid support, no
close_range, or a worker that runs with one of descriptors 0-2 closed (an
output file then lands on it, and the file actions would clobber it).
"""

from __future__ import annotations

import errno
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any, Protocol

from spoolctl.runner import procs

PATH_CACHE_TTL_S = 1.0
"""How long a PATH lookup is trusted. A remembered program whose spawn
fails (removed, no longer executable) is looked up again at once; the time
limit also brings one that appears earlier in PATH (a new version put in
/usr/local/bin) into use within a second, where Popen would at once."""
PATH_CACHE_MAX = 256
"""Entries kept: a queue's jobs run a handful of programs; a queue of many
distinct ones starts afresh past this instead of growing without bound."""
CLOSE_RANGE_CLOEXEC = 4
"""From linux/close_range.h: mark close-on-exec instead of closing."""
ALL_FDS = 0xFFFFFFFF
"""close_range's `~0U`: up to the highest descriptor there can be."""
RESET_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM)
"""Back to default in the job (see the module docstring for why these)."""
SKIP_ERRNOS = (errno.ENOENT, errno.ENOTDIR)
"""Errors on one PATH candidate that send the search on to the next without
being the one reported (as in CPython's _posixsubprocess and execvp)."""
Actions = Sequence[tuple[Any, ...]]


class Process(Protocol):
    """What the worker asks of a job's process, whichever way it started:
    subprocess.Popen has it, and so has `Child`."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def wait(self) -> int: ...


class Child:
    """A process started by posix_spawn, with Popen's poll/wait/pid and its
    return codes (the exit status, or minus the signal that ended it), so the
    code around a running attempt need not know how it started."""

    __slots__ = ("pid", "returncode")

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """The return code once the process has exited (reaping it), else None."""
        if self.returncode is None:
            self._reap(os.WNOHANG)
        return self.returncode

    def wait(self) -> int:
        """Block until the process exits (reaping it); its return code."""
        while self.returncode is None:
            self._reap(0)
        return self.returncode

    def _reap(self, options: int) -> None:
        try:
            pid, status = os.waitpid(self.pid, options)
        except ChildProcessError:
            self.returncode = 0  # reaped by someone else: Popen's answer too
            return
        if pid == self.pid:
            self.returncode = os.waitstatus_to_exitcode(status)


def cloexec_from_3() -> Callable[[], bool] | None:
    """A call that marks every descriptor from 3 up close-on-exec and says
    whether it could; None where close_range with CLOSE_RANGE_CLOEXEC is not
    there (glibc before 2.34, Linux before 5.11): tried once here."""
    import ctypes  # only workers spawn: the verbs do not pay for ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        close_range = libc.close_range
    except (OSError, AttributeError):
        return None
    close_range.argtypes = (ctypes.c_uint, ctypes.c_uint, ctypes.c_int)
    close_range.restype = ctypes.c_int

    def mark() -> bool:
        return bool(close_range(3, ALL_FDS, CLOSE_RANGE_CLOEXEC) == 0)

    return mark if mark() else None


class Spawner:
    """Starts jobs for one worker: posix_spawn where it can say what the job
    needs, Popen where not, with the PATH lookups of the worker's lifetime."""

    def __init__(self, cloexec: Callable[[], bool] | None) -> None:
        """cloexec: what marks descriptors close-on-exec (`cloexec_from_3`);
        None sends every job through Popen."""
        self._cloexec = cloexec
        self._posix = hasattr(os, "posix_spawn") and self._cloexec is not None
        self._paths: dict[tuple[bytes | None, bytes], tuple[bytes, float]] = {}
        self.spawned_posix = 0
        self.spawned_popen = 0
        """How many jobs went each way (tests and the bench read them)."""

    @property
    def uses_posix_spawn(self) -> bool:
        """Whether a job without a working directory goes through posix_spawn."""
        return self._posix

    def start(
        self,
        argv: list[str],
        *,
        cwd: str | None,
        env: Mapping[bytes, bytes],
        stdout: IO[bytes],
        stderr: IO[bytes],
    ) -> Process:
        """Start argv as the leader of a new session, output to the given files.

        Raises OSError as Popen would for a program that cannot be run (the
        errno of the exec, the program as argv[0] named it), ValueError for
        an argument or environment Popen would refuse too."""
        out, err = stdout.fileno(), stderr.fileno()
        if not self._posix or cwd is not None or out < 3 or err < 3 or not argv[0]:
            # out < 3: one of 0-2 was free when the files were opened; an
            # empty program name posix_spawn refuses, Popen looks it up.
            return self._popen(argv, cwd=cwd, env=env, stdout=stdout, stderr=stderr)
        assert self._cloexec is not None
        if not self._cloexec():
            self._posix = False  # refused now (seccomp?): Popen from here on
            return self._popen(argv, cwd=None, env=env, stdout=stdout, stderr=stderr)
        actions = [
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDWR, 0),
            (os.POSIX_SPAWN_DUP2, out, 1),
            (os.POSIX_SPAWN_DUP2, err, 2),
        ]
        try:
            pid = self._spawn_program(argv, env, actions)
        except NotImplementedError:  # no POSIX_SPAWN_SETSID in this libc
            self._posix = False
            return self._popen(argv, cwd=None, env=env, stdout=stdout, stderr=stderr)
        self.spawned_posix += 1
        return Child(pid)

    def _popen(
        self,
        argv: list[str],
        *,
        cwd: str | None,
        env: Mapping[bytes, bytes],
        stdout: IO[bytes],
        stderr: IO[bytes],
    ) -> Process:
        proc = procs.spawn_group(argv, cwd=cwd, env=env, stdout=stdout, stderr=stderr)
        self.spawned_popen += 1
        return proc

    def _spawn_program(self, argv: list[str], env: Mapping[bytes, bytes], actions: Actions) -> int:
        """Find the program as Popen would, and start it. A name with a slash
        is used as it is; a bare name is looked up on the job's PATH, first
        where the last lookup of it on this PATH found it."""
        name = os.fsencode(argv[0])
        if b"/" in name:
            try:
                return _posix_spawn(name, argv, env, actions)
            except OSError as exc:
                raise _named(exc.errno, argv[0]) from None
        key = (env.get(b"PATH"), name)
        found = self._paths.get(key)
        if found is not None and time.monotonic() - found[1] < PATH_CACHE_TTL_S:
            try:
                return _posix_spawn(found[0], argv, env, actions)
            except OSError:
                del self._paths[key]  # gone or changed: look again, as Popen would
        return self._search(key, argv, env, actions)

    def _search(
        self,
        key: tuple[bytes | None, bytes],
        argv: list[str],
        env: Mapping[bytes, bytes],
        actions: Actions,
    ) -> int:
        """Popen's search: each directory of PATH in turn; a candidate that
        does not exist is passed over without a spawn (a stat: no clone for
        a miss), any other is tried. The error reported is the first one that
        is not ENOENT/ENOTDIR (a non-executable file found earlier wins over
        a missing one later), else the last one."""
        saved, last = 0, errno.ENOENT
        for folder in os.get_exec_path(env):  # type: ignore[arg-type]
            candidate = os.path.join(os.fsencode(folder), key[1])
            missing = _missing(candidate)
            if missing:
                last = missing
                continue
            try:
                pid = _posix_spawn(candidate, argv, env, actions)
            except OSError as exc:
                last = exc.errno or errno.ENOENT
                if last not in SKIP_ERRNOS and not saved:
                    saved = last
                continue
            if len(self._paths) >= PATH_CACHE_MAX:
                self._paths.clear()
            self._paths[key] = (candidate, time.monotonic())
            return pid
        raise _named(saved or last, argv[0])


def _posix_spawn(path: bytes, argv: list[str], env: Mapping[bytes, bytes], actions: Actions) -> int:
    pid: int = os.posix_spawn(
        path,
        argv,
        env,
        file_actions=actions,
        setsid=True,
        setsigdef=RESET_SIGNALS,
        setsigmask=(),
    )
    return pid


def _missing(path: bytes) -> int:
    """ENOENT or ENOTDIR when path certainly names nothing (an exec of it
    would fail with that, a dangling symlink included); 0 when it may name
    something, which only an exec can tell for sure."""
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError) as exc:
        return exc.errno or errno.ENOENT
    except (OSError, ValueError):
        return 0
    return 0


def _named(number: int | None, program: str) -> OSError:
    """The error as Popen raises it: errno, its text, and the program as the
    job named it (not the path PATH led to)."""
    code = number or errno.ENOENT
    return OSError(code, os.strerror(code), program)


_shared: Spawner | None = None


def shared() -> Spawner:
    """This process's Spawner (made on first use: close_range is probed once
    per worker, and its PATH lookups serve every slot)."""
    global _shared
    if _shared is None:
        _shared = Spawner(cloexec_from_3())
    return _shared
