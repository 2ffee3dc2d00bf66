"""Input that looked valid and was not: each is refused with its documented
code and changes nothing, whichever way it comes in (the command line, an
`add --batch` line, the environment, a config file, the dashboard).

- `metrics --output` writes only a new file or a text file such as an earlier
  exposition: never through a symbolic link, onto a folder, device, FIFO or
  socket, into the queue's spool folder, or over a file that is not text.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import add_job
from tests.populated import run_quiet

pytestmark = pytest.mark.subprocess  # the batch reader is fed from a real process


def fingerprint(path: Path) -> tuple[Any, ...]:
    """What a path is, without following it: its inode and type, and what it
    holds (a file's bytes, a folder's names, a link's target)."""
    found = os.lstat(path)
    if stat.S_ISREG(found.st_mode):
        held: Any = path.read_bytes()
    elif stat.S_ISDIR(found.st_mode):
        held = sorted(os.listdir(path))
    elif stat.S_ISLNK(found.st_mode):
        held = os.readlink(path)
    else:
        held = None
    return found.st_ino, stat.S_IFMT(found.st_mode), found.st_rdev, held


def refused_output(db: Path, target: Path) -> dict[str, Any]:
    """`metrics --output target`: INVALID_INPUT, exit 1, and target as it was."""
    existed = os.path.lexists(target)
    before = fingerprint(target) if existed else None
    beside = sorted(os.listdir(target.parent)) if target.parent.is_dir() else None
    result = run_quiet("metrics", "--db", str(db), "--output", str(target), "--json")
    assert result.exit_code == 1, (target, result.stdout)
    error: dict[str, Any] = result.envelope["errors"][0]
    assert error["code"] == "INVALID_INPUT" and error["detail"]["flag"] == "--output", error
    if existed:
        assert fingerprint(target) == before, target
    else:
        assert not os.path.lexists(target), target
    if beside is not None:
        assert sorted(os.listdir(target.parent)) == beside, "no temporary file either"
    return error


EXPOSITION = "# HELP spoolctl_jobs Jobs.\n# TYPE spoolctl_jobs gauge\nspoolctl_jobs 1.0\n"


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A folder with a short path: a unix socket's path has at most 107 bytes."""
    folder = Path(tempfile.mkdtemp(prefix="spool-", dir="/tmp"))
    yield folder
    for child in folder.iterdir():
        child.unlink()
    folder.rmdir()


def test_metrics_output_never_replaces_what_is_not_a_metrics_file(
    db: Path, tmp_path: Path, short_dir: Path
) -> None:
    add_job(db, "true")
    fifo = tmp_path / "fifo.prom"
    os.mkfifo(fifo)
    folder = tmp_path / "folder.prom"
    folder.mkdir()
    (folder / "inside").write_text("kept\n")
    earlier = tmp_path / "real.prom"
    earlier.write_text(EXPOSITION)
    link = tmp_path / "link.prom"
    link.symlink_to(earlier)
    other = tmp_path / "other.db"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE notes (body TEXT)")
    conn.commit()
    conn.close()
    alias = tmp_path / "alias.prom"
    os.link(db, alias)  # the queue file under a name outside its spool folder
    sock = short_dir / "s.prom"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(sock))
    try:
        for target, reason in [
            (fifo, "not_a_regular_file"), (folder, "not_a_regular_file"),
            (sock, "not_a_regular_file"), (link, "symlink"), (db, "inside_spool"),
            (db.parent / "queue.db-wal", "inside_spool"),
            (db.parent / "queue.db-shm", "inside_spool"),
            (db.parent / "output" / "x.prom", "inside_spool"), (db.parent, "inside_spool"),
            (other, "not_a_metrics_file"), (alias, "not_a_metrics_file"),
        ]:  # fmt: skip
            assert refused_output(db, target)["detail"]["reason"] == reason, target
    finally:
        listener.close()
    assert fingerprint(earlier)[3] == EXPOSITION.encode()
    listed = run_quiet("list", "--db", str(db), "--json")
    assert listed.envelope["data"]["count"] == 1, "the queue is whole"


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can make a device node")
def test_metrics_output_never_replaces_a_device(db: Path, tmp_path: Path) -> None:
    """As root a rename replaced /dev/null itself; a null device of the
    test's own stands in for it."""
    add_job(db, "true")
    device = tmp_path / "null"
    os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    assert refused_output(db, device)["detail"]["reason"] == "not_a_regular_file"
    assert stat.S_ISCHR(os.lstat(device).st_mode)


def test_metrics_output_replaces_an_earlier_exposition_and_makes_a_new_file(
    db: Path, tmp_path: Path
) -> None:
    add_job(db, "true")
    earlier = tmp_path / "spoolctl.prom"
    earlier.write_text(EXPOSITION)
    for target in (earlier, tmp_path / "new.prom"):
        result = run_quiet("metrics", "--db", str(db), "--output", str(target), "--json")
        assert result.exit_code == 0, result.stdout
        assert 'spoolctl_jobs{queue="default",state="queued"} 1.0' in target.read_text()
