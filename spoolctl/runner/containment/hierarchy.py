"""Where the cgroup hierarchies are, read from /proc (never a fixed path).

/proc/self/mountinfo says where each hierarchy is mounted: the unified one
(fstype `cgroup2`) and any v1 ones (fstype `cgroup`, their controllers in
the super options). /proc/self/cgroup says which cgroup of each hierarchy
this process is in; joined to the mount (its root may be a subtree, as in a
container's cgroup namespace) that is a directory. Pure parsing and a few
reads: nothing here writes.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

V1_CONTROLLERS = frozenset({"memory", "cpu", "cpuacct", "freezer"})
"""The v1 controllers spoolctl may use: limits, accounting, freezing."""
_ESCAPE = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class Mount:
    """One mounted cgroup hierarchy."""

    mountpoint: str
    root: str
    """The cgroup the mount shows at its top ("/" unless a subtree)."""
    version: int
    controllers: frozenset[str]
    """v1: the controllers bound to it (of `V1_CONTROLLERS`); v2: empty."""


@dataclass(frozen=True)
class Layout:
    """This process's own cgroup directory in each hierarchy it can see."""

    v2: str | None = None
    v1: dict[str, str] = field(default_factory=dict)
    """controller -> directory (cpu and cpuacct may share one)."""


def unescape(text: str) -> str:
    """mountinfo's octal escapes (\\040 for a space) back to characters."""
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), text)


def parse_mountinfo(text: str) -> list[Mount]:
    """Every cgroup mount in a mountinfo text (malformed lines are skipped)."""
    found = []
    for line in text.splitlines():
        head, sep, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if not sep or len(fields) < 5 or len(rest) < 3:
            continue
        fstype, superopts = rest[0], rest[2].split(",")
        root, mountpoint = unescape(fields[3]), unescape(fields[4])
        if fstype == "cgroup2":
            found.append(Mount(mountpoint, root, 2, frozenset()))
        elif fstype == "cgroup":
            controllers = V1_CONTROLLERS.intersection(superopts)
            if controllers:
                found.append(Mount(mountpoint, root, 1, frozenset(controllers)))
    return found


def parse_proc_cgroup(text: str) -> tuple[str | None, dict[str, str]]:
    """The v2 cgroup path ("0::/x"), and each v1 controller's path."""
    v2: str | None = None
    v1: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        number, controllers, path = parts
        if number == "0" and controllers == "":
            v2 = path
            continue
        for name in controllers.split(","):
            if name in V1_CONTROLLERS:
                v1[name] = path
    return v2, v1


def directory(mount: Mount, path: str) -> str | None:
    """The directory of cgroup `path` under `mount`, or None when the mount
    does not show it (its root is a subtree the path is outside of)."""
    root = mount.root.rstrip("/")
    if root and path != root and not path.startswith(root + "/"):
        return None
    inner = path[len(root) :].lstrip("/")
    return os.path.join(mount.mountpoint, inner) if inner else mount.mountpoint


def layout_of(mountinfo: str, proc_cgroup: str) -> Layout:
    """This process's directories, from the texts of the two /proc files. The
    first mount of a hierarchy that shows our cgroup is used."""
    v2_path, v1_paths = parse_proc_cgroup(proc_cgroup)
    v2_dir: str | None = None
    v1_dirs: dict[str, str] = {}
    for mount in parse_mountinfo(mountinfo):
        if mount.version == 2:
            if v2_dir is None and v2_path is not None:
                v2_dir = directory(mount, v2_path)
            continue
        for name in sorted(mount.controllers):
            path = v1_paths.get(name)
            if name not in v1_dirs and path is not None:
                found = directory(mount, path)
                if found is not None:
                    v1_dirs[name] = found
    return Layout(v2_dir, v1_dirs)


def discover(pid: str = "self") -> Layout:
    """This process's layout (an empty one where /proc cannot be read)."""
    try:
        with open(f"/proc/{pid}/mountinfo", encoding="utf-8", errors="replace") as f:
            mountinfo = f.read()
        with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as f:
            proc_cgroup = f.read()
    except OSError:
        return Layout()
    return layout_of(mountinfo, proc_cgroup)
