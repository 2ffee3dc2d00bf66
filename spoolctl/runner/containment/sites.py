"""Which cgroup directories a worker's attempts go in, and what each can do.

A *site* is one hierarchy's base directory (the worker's own cgroup there,
or the subtree SPOOLCTL_CGROUP names) with the role it plays: the primary
site holds the kill (v2 `cgroup.kill` or a freezer); memory and cpu limits
and accounting come from whichever hierarchy holds that controller (the v2
one with the controller enabled, else its v1 hierarchy). A worker's attempt
cgroups are `<base>/spoolctl/<worker tag>/a<attempt id>` in each site; the
tag names the worker's PID namespace and pid (`tag`, `owner`), since workers
in separate PID namespaces (containers, `unshare --pid`) can share one
cgroup tree.

`choose` decides from what the files allow: with `probe` (a worker starting)
it makes the worker's directories and moves itself into a test cgroup and
back, the real proof; without it (doctor, capabilities) it only checks
access, and changes nothing.
"""

from __future__ import annotations

import hashlib
import os
import re
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from spoolctl.runner.containment import cgroup
from spoolctl.runner.containment.hierarchy import Layout

ENV = "SPOOLCTL_CGROUP"
"""`off` keeps process groups; an absolute path names the cgroup subtree to
use (a delegated one); unset or `auto` finds the worker's own."""
TOP = "spoolctl"
_SAFE = re.compile(r"[^A-Za-z0-9._-]")
UNKNOWN_NAMESPACE = "nx"
_NAMESPACE = re.compile(r"n(?:[0-9]+|x)")


@dataclass(frozen=True)
class Site:
    role: str
    """primary, memory, cpu or cpuacct."""
    version: int
    base: str
    home: str
    """The worker's own cgroup in this hierarchy: where it returns after a spawn."""

    def tag_dir(self, tag: str) -> str:
        return os.path.join(self.base, TOP, tag)


@dataclass
class Status:
    """Which containment is in force, and why (doctor, capabilities, work)."""

    mode: str = "process_group"
    reason: str = ""
    kill: str | None = None
    root: str | None = None
    memory: str | None = None
    """The file a memory limit is set through, or None (not enforceable)."""
    cpu: str | None = None
    sites: list[Site] = field(default_factory=list)

    @property
    def contained(self) -> bool:
        return self.mode == "cgroup"

    def site(self, role: str) -> Site | None:
        return next((s for s in self.sites if s.role == role), None)

    def as_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "reason": self.reason,
            "kill": self.kill,
            "cgroup_root": self.root,
            "memory_limit": self.memory,
            "cpu_limit": self.cpu,
        }

    def line(self) -> str:
        """One sentence for `work` to say at start."""
        if not self.contained:
            return f"containment: process groups and attempt tokens ({self.reason})"
        limits = ", ".join(x for x in (self.memory, self.cpu) if x) or "no limits enforceable"
        where = f"under {self.root} (kill by {self.kill}; {limits})"
        return f"containment: a cgroup per attempt {where}"


def tag(worker_id: str, pid: int, namespace: str | None = None) -> str:
    """A worker's directory name: its id made safe, with a hash that keeps
    two ids apart which the making-safe would merge, its PID namespace
    (`pid_namespace`: this process's unless given) and its pid (a worker
    started again under the same id is another directory). A pid names the
    worker only in that namespace: `owner` reads both back."""
    return f"{_named(worker_id)}-{namespace or pid_namespace()}-{pid}"


def legacy_tag(worker_id: str, pid: int) -> str:
    """The name spoolctl gave a worker's directory before it carried the
    PID namespace (written by a worker in any namespace)."""
    return f"{_named(worker_id)}-{pid}"


def _named(worker_id: str) -> str:
    digest = hashlib.sha1(worker_id.encode()).hexdigest()[:8]
    return f"w-{_SAFE.sub('_', worker_id)[:64]}-{digest}"


def pid_namespace() -> str:
    """This process's PID namespace as a directory name carries it: `n` and
    the inode of /proc/self/ns/pid, which no two PID namespaces that exist at
    the same time share on one kernel (and a cgroup tree is one kernel's);
    UNKNOWN_NAMESPACE when it cannot be read. One stat, read where a tag is
    made (a worker's start, the reaper's sweep), never per job."""
    try:
        return f"n{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return UNKNOWN_NAMESPACE


def owner(name: str) -> tuple[str | None, int] | None:
    """The PID namespace and pid a worker's directory name carries: the
    namespace None for a name in the format before it was there (whose
    second last part is the id's hex digest, never `n<digits>`), None for a
    name that is no worker's."""
    head, _, pid = name.rpartition("-")
    if not name.startswith("w-") or not pid.isdigit():
        return None
    namespace = head.rpartition("-")[2]
    return (namespace if _NAMESPACE.fullmatch(namespace) else None), int(pid)


def choose(layout: Layout, setting: str | None, worker_id: str | None, *, probe: bool) -> Status:
    """The status for a worker (probe: make its directories and prove a move)
    or for a report (no probe: access checks only)."""
    setting = (setting or "auto").strip()
    if setting == "off":
        return Status(reason=f"{ENV}=off")
    if setting != "auto" and not os.path.isabs(setting):
        return Status(reason=f"{ENV} must be off, auto or an absolute path, not {setting!r}")
    primary, why = _primary(layout, None if setting == "auto" else setting)
    if primary is None:
        return Status(reason=why)
    tagname = tag(worker_id or "probe", os.getpid())
    if probe:
        failure = _prove(primary, tagname)
        if failure:
            return Status(reason=failure)
    elif not _accessible(primary.base):
        return Status(reason=f"{primary.base} is not writable by this user")
    kill = _kill_method(primary, tagname)
    status = Status("cgroup", "cgroups are writable here", kill, primary.base, sites=[primary])
    _limits(status, layout, primary, tagname, probe=probe)
    return status


def _primary(layout: Layout, configured: str | None) -> tuple[Site | None, str]:
    if layout.v2 is not None:
        base = configured or layout.v2
        if not os.path.isdir(base):
            return None, f"{base} is not a cgroup directory"
        return Site("primary", 2, base, layout.v2), ""
    freezer = layout.v1.get("freezer")
    if freezer is not None:
        return Site("primary", 1, configured or freezer, freezer), ""
    return None, "no cgroup v2 hierarchy or v1 freezer is mounted"


def _kill_method(site: Site, tagname: str) -> str:
    """cgroup.kill where the kernel has it (a root cgroup shows no such file:
    a child of it is looked at, or the kernel's version: 5.14 brought it)."""
    if site.version == 1:
        return "freeze"
    for directory in (site.tag_dir(tagname), os.path.join(site.base, TOP)):
        if os.path.isdir(directory):
            return "cgroup.kill" if _has(directory, "cgroup.kill") else "freeze"
    if _has(site.base, "cgroup.kill"):
        return "cgroup.kill"
    release = os.uname().release.split(".")
    major_minor = tuple(int(p) for p in release[:2] if p.isdigit())
    return "cgroup.kill" if major_minor >= (5, 14) else "freeze"


def _has(directory: str, name: str) -> bool:
    return os.path.exists(os.path.join(directory, name))


def _accessible(directory: str) -> bool:
    return os.access(directory, os.W_OK) and os.access(
        os.path.join(directory, "cgroup.procs"), os.W_OK
    )


def _prove(site: Site, tagname: str) -> str:
    """Make the worker's directory in the site and move this process into a
    test cgroup there and back; '' when that worked, else why not."""
    me = str(os.getpid())
    leaf = os.path.join(site.tag_dir(tagname), "probe")
    try:
        for directory in (os.path.join(site.base, TOP), site.tag_dir(tagname), leaf):
            cgroup.make(directory)
        cgroup.write(leaf, "cgroup.procs", me)
        cgroup.write(site.home, "cgroup.procs", me)
    except OSError as exc:
        return f"cannot use cgroups under {site.base}: {exc.strerror or exc}"
    finally:
        with suppress(OSError):
            cgroup.remove(leaf)
    return ""


def _limits(status: Status, layout: Layout, primary: Site, tagname: str, *, probe: bool) -> None:
    """Find where memory and cpu are controlled and accounted; add the sites."""
    for controller, v2_file, v1_file in (
        ("memory", "memory.max", "memory.limit_in_bytes"),
        ("cpu", "cpu.max", "cpu.cfs_quota_us"),
    ):
        if primary.version == 2 and _enable_v2(primary, tagname, controller, probe=probe):
            setattr(status, controller, f"v2 {v2_file}")
            continue
        site = _v1_site(layout, controller, tagname, probe=probe)
        if site is not None:
            status.sites.append(site)
            setattr(status, controller, f"v1 {v1_file}")
    if primary.version == 1 and status.site("cpu") is None:
        site = _v1_site(layout, "cpuacct", tagname, probe=probe)
        if site is not None:
            status.sites.append(site)


def _enable_v2(site: Site, tagname: str, controller: str, *, probe: bool) -> bool:
    """Whether the controller can be had in the worker's v2 attempt cgroups:
    offered to the base, then enabled down to the worker's directory."""
    try:
        offered = cgroup.read(site.base, "cgroup.controllers").split()
    except OSError:
        return False
    if controller not in offered:
        return False
    if not probe:
        return _accessible(site.base)
    chain = [site.base, os.path.join(site.base, TOP), site.tag_dir(tagname)]
    try:
        for directory in chain:
            enabled = cgroup.read(directory, "cgroup.subtree_control").split()
            if controller not in enabled:
                cgroup.write(directory, "cgroup.subtree_control", f"+{controller}")
    except OSError:
        return False
    return True


def _v1_site(layout: Layout, controller: str, tagname: str, *, probe: bool) -> Site | None:
    home = layout.v1.get(controller)
    if home is None:
        return None
    site = Site(controller, 1, home, home)
    if not probe:
        return site if _accessible(home) else None
    return None if _prove(site, tagname) else site
