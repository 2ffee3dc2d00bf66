"""Prune owns only what it derives: the files of a pruned job are found in its
own folder, `<spool>/output/<job id>/`, never where its rows point, and none is
unlinked while the write lock is held. On SQLite and on PostgreSQL."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from spoolctl.services import prune as pruning
from tests.helpers import Db, attempts_of, cli_json, execute, rows, write_lock_free
from tests.populated import Populated, populate, run_json

pytestmark = [pytest.mark.timeout(90), pytest.mark.both_backends]


@pytest.fixture
def q(db: Db) -> Populated:
    return populate(db)


def tamper(db: Db, sql: str, params: tuple[object, ...]) -> None:
    execute(db, sql, params)


def test_a_row_pointing_at_another_jobs_output_deletes_nothing_of_it(
    q: Populated, tmp_path: Path
) -> None:
    (victim,) = attempts_of(q.db, q.dead)
    outside = tmp_path / "outside.txt"
    outside.write_text("not the spool's")
    (own,) = attempts_of(q.db, q.done)
    tamper(
        q.db,
        "UPDATE attempts SET stdout_path = ?, stderr_path = ? WHERE id = ?",
        (victim["stderr_path"], str(outside), own["id"]),
    )
    own_folder = q.spool / "output" / str(q.done)
    assert (own_folder / "1" / "stdout").read_text() == "hello\n"

    dry = cli_json("prune", "--older-than", "0", "--state", "done", "--dry-run", db=q.db).data
    result = cli_json("prune", "--older-than", "0", "--state", "done", "--yes", db=q.db)

    assert result.exit_code == 0, result.stdout
    assert result.data["deleted_jobs"] == 1
    assert Path(victim["stderr_path"]).read_text() == "oops\n", "another job's output was deleted"
    assert outside.read_text() == "not the spool's"
    assert not own_folder.exists(), "the pruned job's own output folder stays"
    assert result.data["freed_bytes"] == dry["freed_bytes"] == len("hello\n")
    assert sorted(result.data["skipped_paths"]) == sorted([victim["stderr_path"], str(outside)])
    assert rows(q.db, "SELECT id FROM jobs WHERE id = ?", (q.dead,)) != []


def test_a_job_folder_that_is_a_symlink_is_not_followed(q: Populated) -> None:
    output = q.spool / "output"
    (victim,) = attempts_of(q.db, q.dead)
    own_folder = output / str(q.done)
    for stream in ("stdout", "stderr"):
        (own_folder / "1" / stream).unlink()
    (own_folder / "1").rmdir()
    own_folder.rmdir()
    own_folder.symlink_to(output / str(q.dead))

    result = cli_json("prune", "--older-than", "0", "--state", "done", "--yes", db=q.db)

    assert result.exit_code == 0 and result.data["deleted_jobs"] == 1, result.stdout
    assert Path(victim["stderr_path"]).read_text() == "oops\n"
    assert Path(victim["stdout_path"]).exists()
    assert result.data["freed_bytes"] == 0


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
