"""Prune owns only what it derives from a pruned job's id: its files in the
shared folder, `<spool>/output/<F>xxx/<job id>.<n>.<stream>`, and in its own
folder, `<spool>/output/<job id>/` (attempts claimed before 0.5.1, adopted
legacy output), never where its rows point; none is unlinked while the write
lock is held. On SQLite and on PostgreSQL."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from spoolctl.services import prune as pruning
from tests.helpers import Db, attempts_of, cli_json, execute, rows, write_lock_free
from tests.populated import Populated, populate, run_json

pytestmark = [pytest.mark.timeout(90), pytest.mark.both_backends, pytest.mark.subprocess]


@pytest.fixture
def q(db: Db) -> Populated:
    return populate(db)


def tamper(db: Db, sql: str, params: tuple[object, ...]) -> None:
    execute(db, sql, params)


def own_files(q: Populated, job_id: int) -> list[Path]:
    """Where the job's attempt 1 wrote (claimed since 0.5.1: the shared folder)."""
    folder = q.spool / "output" / f"{job_id // 1000}xxx"
    return [folder / f"{job_id}.1.{stream}" for stream in ("stdout", "stderr")]


def to_folder_layout(q: Populated, job_id: int) -> Path:
    """Make the job's attempt 1 look claimed before 0.5.1 (or adopted from a
    legacy spool): its files in the job's own folder `output/<job>/1/`, as
    its row says. Returns that job folder."""
    job_folder = q.spool / "output" / str(job_id)
    (job_folder / "1").mkdir(parents=True)
    moved = []
    for old in own_files(q, job_id):
        new = job_folder / "1" / old.name.rsplit(".", 1)[1]
        old.rename(new)
        moved.append(str(new))
    tamper(
        q.db,
        "UPDATE attempts SET stdout_path = ?, stderr_path = ? WHERE job_id = ?",
        (*moved, job_id),
    )
    return job_folder


def prune_done(q: Populated) -> Any:
    result = cli_json("prune", "--older-than", "0", "--state", "done", "--yes", db=q.db)
    assert result.exit_code == 0 and result.data["deleted_jobs"] == 1, result.stdout
    return result.data


@pytest.mark.parametrize("layout", ["shared folder", "job folder"])
def test_a_row_pointing_at_another_jobs_output_deletes_nothing_of_it(
    q: Populated, tmp_path: Path, layout: str
) -> None:
    (victim,) = attempts_of(q.db, q.dead)
    outside = tmp_path / "outside.txt"
    outside.write_text("not the spool's")
    own = own_files(q, q.done)
    if layout == "job folder":
        job_folder = to_folder_layout(q, q.done)
        own = [job_folder / "1" / stream for stream in ("stdout", "stderr")]
    assert own[0].read_text() == "hello\n"
    tamper(
        q.db,
        "UPDATE attempts SET stdout_path = ?, stderr_path = ? WHERE job_id = ?",
        (victim["stderr_path"], str(outside), q.done),
    )

    dry = cli_json("prune", "--older-than", "0", "--state", "done", "--dry-run", db=q.db).data
    assert all(path.exists() for path in own), "a dry run deleted"
    data = prune_done(q)

    assert Path(victim["stderr_path"]).read_text() == "oops\n", "another job's output was deleted"
    assert Path(victim["stdout_path"]).exists()
    assert outside.read_text() == "not the spool's"
    assert not any(path.exists() for path in own), "the pruned job's own output stays"
    if layout == "job folder":
        assert not job_folder.exists(), "the pruned job's emptied folder stays"
    assert data["freed_bytes"] == dry["freed_bytes"] == len("hello\n")
    assert sorted(data["skipped_paths"]) == sorted([victim["stderr_path"], str(outside)])
    assert rows(q.db, "SELECT id FROM jobs WHERE id = ?", (q.dead,)) != []


def test_a_job_folder_that_is_a_symlink_is_not_followed(q: Populated) -> None:
    job_folder = to_folder_layout(q, q.done)
    for stream in ("stdout", "stderr"):
        (job_folder / "1" / stream).unlink()
    (job_folder / "1").rmdir()
    job_folder.rmdir()
    dead_folder = to_folder_layout(q, q.dead)
    job_folder.symlink_to(dead_folder)

    data = prune_done(q)

    assert (dead_folder / "1" / "stderr").read_text() == "oops\n"
    assert (dead_folder / "1" / "stdout").exists()
    assert data["freed_bytes"] == 0


def test_a_shared_folder_that_is_a_symlink_is_not_followed(q: Populated, tmp_path: Path) -> None:
    """The shared folder of the pruned job points at a copy of it elsewhere:
    nothing there is deleted, and nothing in the spool either."""
    folder = own_files(q, q.done)[0].parent
    elsewhere = tmp_path / "elsewhere"
    folder.rename(elsewhere)
    folder.symlink_to(elsewhere)

    data = prune_done(q)

    assert (elsewhere / f"{q.done}.1.stdout").read_text() == "hello\n"
    assert (elsewhere / f"{q.dead}.1.stderr").read_text() == "oops\n"
    assert data["freed_bytes"] == 0


def test_a_symlinked_output_file_is_left_and_reported(q: Populated, tmp_path: Path) -> None:
    stdout, stderr = own_files(q, q.done)
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    stdout.unlink()
    stdout.symlink_to(target)

    data = prune_done(q)

    assert target.read_text() == "keep me"
    assert stdout.is_symlink(), "prune removed a symlink it does not own"
    assert not stderr.exists()
    assert str(stdout) in data["skipped_paths"]


def test_an_emptied_shared_folder_is_removed_and_made_again_by_the_next_attempt(
    q: Populated,
) -> None:
    """Prune removes a shared folder it emptied; a worker claiming a job of
    that thousand later makes it again (0700) instead of failing the spawn."""
    every = ("--state", "done,dead,canceled")
    result = cli_json("prune", "--older-than", "0", "--yes", *every, db=q.db)
    assert result.exit_code == 0 and result.data["deleted_jobs"] == 3, result.stdout
    folder = own_files(q, q.done)[0].parent
    assert not folder.exists(), "an emptied shared folder stays"

    job_id = cli_json("add", "--", "sh", "-c", "echo again", db=q.db).data["job_id"]
    work = cli_json("work", "--once", db=q.db)
    assert work.exit_code == 0 and work.data["job_state"] == "done", work.stdout
    assert job_id // 1000 == q.done // 1000, "the new job belongs to another thousand"
    assert folder.is_dir() and folder.stat().st_mode & 0o777 == 0o700
    (attempt,) = attempts_of(q.db, job_id)
    assert Path(attempt["stdout_path"]).read_text() == "again\n"


def test_no_file_is_unlinked_while_the_write_lock_is_held(
    q: Populated, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At every unlink another connection can take the write lock at once."""
    lock_free_at_unlink: list[bool] = []
    real_unlink = os.unlink

    def watched_unlink(path: str | os.PathLike[str]) -> None:
        lock_free_at_unlink.append(write_lock_free(q.db))
        real_unlink(path)

    monkeypatch.setattr(pruning.os, "unlink", watched_unlink)
    every = ("--state", "done,dead,canceled")
    result = run_json("prune", "--db", str(q.db), "--older-than", "0", "--yes", *every)

    assert result.envelope["data"]["deleted_jobs"] == 3, result.stdout
    assert lock_free_at_unlink == [True] * 4, lock_free_at_unlink
