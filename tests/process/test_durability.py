"""A submission acknowledged by `add` is committed with synchronous=FULL, so
it survives a power cut; workers commit with NORMAL (in WAL mode that can lose
only the newest transactions on a power cut, never corrupt the file, and the
reaper re-runs whatever a lost record left `running`).

Observed, not assumed: a listener on every SQLAlchemy engine reads
`PRAGMA synchronous` on the very connection at the moment each transaction
commits, while the real verb runs in this process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, event

from spoolctl.db.lean import LeanQueue
from tests.helpers import rows
from tests.populated import run_quiet

FULL, NORMAL = 2, 1  # what PRAGMA synchronous reads back


@pytest.fixture
def commits(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The synchronous level in force at each commit, in order: an engine's,
    and the lean path's (`db/lean.py`, which `add` of one command takes)."""
    seen: list[int] = []

    def on_commit(conn: Connection) -> None:
        raw: Any = conn.connection.dbapi_connection
        seen.append(raw.execute("PRAGMA synchronous").fetchone()[0])

    lean_write = LeanQueue.write

    def write(self: LeanQueue, fn: Callable[[LeanQueue], Any]) -> Any:
        def then_look(queue: LeanQueue) -> Any:
            found = fn(queue)
            seen.append(queue.conn.execute("PRAGMA synchronous").fetchone()[0])
            return found

        return lean_write(self, then_look)

    monkeypatch.setattr(LeanQueue, "write", write)
    event.listen(Engine, "commit", on_commit)
    yield seen
    event.remove(Engine, "commit", on_commit)


def test_add_commits_with_synchronous_full(db: Path, commits: list[int]) -> None:
    assert run_quiet("add", "--db", str(db), "--json", "--", "true").exit_code == 0  # creates
    commits.clear()

    result = run_quiet("add", "--db", str(db), "--json", "--", "echo", "kept")

    assert result.exit_code == 0
    assert commits and set(commits) == {FULL}, commits
    assert len(rows(db, "SELECT id FROM jobs")) == 2


def test_a_batch_add_commits_with_synchronous_full(
    db: Path, tmp_path: Path, commits: list[int]
) -> None:
    batch = tmp_path / "jobs.ndjson"
    batch.write_text('{"argv": ["true"]}\n{"argv": ["echo", "two"]}\n')
    assert run_quiet("add", "--db", str(db), "--json", "--", "true").exit_code == 0  # creates
    commits.clear()

    assert run_quiet("add", "--db", str(db), "--json", "--batch", str(batch)).exit_code == 0

    assert commits and set(commits) == {FULL}, commits
    assert len(rows(db, "SELECT id FROM jobs")) == 3


@pytest.mark.subprocess
def test_workers_commit_with_synchronous_normal(db: Path, commits: list[int]) -> None:
    assert run_quiet("add", "--db", str(db), "--json", "--", "true").exit_code == 0
    commits.clear()

    result = run_quiet("work", "--db", str(db), "--json", "--once")

    assert result.exit_code == 0, result.stdout
    assert len(commits) >= 3, "register, claim, record"
    assert set(commits) == {NORMAL}, commits
    assert rows(db, "SELECT state FROM jobs")[0]["state"] == "done"
