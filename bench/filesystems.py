"""Where the drain and pickup scenarios run: the disk the repository is on and
a tmpfs, each recorded with its file-system type and mount point.

The disk target is a scratch folder inside bench/results/ (ignored by git), so
it is on the same file system as the work tree. The tmpfs target is /dev/shm
when that is a tmpfs; otherwise, when running as root, a tmpfs mounted for the
run on a temporary folder (unmounted afterwards); otherwise it is skipped and
the reason is recorded.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from fixtures import BENCH

DISK_SCRATCH = BENCH / "results" / ".scratch"
SHM = Path("/dev/shm")
TMPFS_SIZE = "2g"


@dataclass(frozen=True)
class Target:
    """A folder to run scenarios in, and the file system it is on."""

    label: str  # "disk" or "tmpfs"
    root: Path
    fstype: str
    mount_point: str
    device: str

    def describe(self) -> str:
        return f"{self.fstype} on {self.mount_point}"

    def facts(self) -> dict[str, str]:
        return {
            "label": self.label,
            "root": str(self.root),
            "fstype": self.fstype,
            "mount_point": self.mount_point,
            "device": self.device,
        }


def mount_of(path: Path) -> tuple[str, str, str]:
    """(fstype, mount point, device) of the mount holding path, from /proc/self/mounts
    (the longest mount point that is a prefix of the resolved path wins)."""
    real = os.path.realpath(path)
    best = ("unknown", "?", "?")
    best_len = -1
    for line in Path("/proc/self/mounts").read_text().splitlines():
        device, mount, fstype, *_ = line.split()
        mount = mount.replace("\\040", " ")
        inside = real == mount or real.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= best_len:
            best, best_len = (fstype, mount, device), len(mount)
    return best


def _target(label: str, root: Path) -> Target:
    fstype, mount, device = mount_of(root)
    return Target(label, root, fstype, mount, device)


@contextmanager
def targets() -> Iterator[tuple[list[Target], dict[str, str]]]:
    """The disk and (if possible) tmpfs targets, and why any was skipped."""
    DISK_SCRATCH.mkdir(parents=True, exist_ok=True)
    skipped: dict[str, str] = {}
    found = [_target("disk", DISK_SCRATCH)]
    with _tmpfs_root(skipped) as tmpfs:
        if tmpfs is not None:
            found.append(_target("tmpfs", tmpfs))
        try:
            yield found, skipped
        finally:
            shutil.rmtree(DISK_SCRATCH, ignore_errors=True)


@contextmanager
def _tmpfs_root(skipped: dict[str, str]) -> Iterator[Path | None]:
    if SHM.is_dir() and mount_of(SHM)[0] == "tmpfs" and os.access(SHM, os.W_OK):
        yield SHM
        return
    if os.geteuid() != 0:
        skipped["tmpfs"] = "/dev/shm is not a writable tmpfs and not root: cannot mount one"
        yield None
        return
    mount_dir = Path(tempfile.mkdtemp(prefix="spoolbench-tmpfs-"))
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs", str(mount_dir)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        skipped["tmpfs"] = f"mount -t tmpfs failed: {proc.stderr.strip()[:200]}"
        mount_dir.rmdir()
        yield None
        return
    try:
        yield mount_dir
    finally:
        subprocess.run(["umount", str(mount_dir)], check=False)
        mount_dir.rmdir()
