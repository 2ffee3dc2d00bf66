"""A database path SQLite cannot use gives a clear error, never a traceback,
and changes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import cli, cli_json

pytestmark = pytest.mark.subprocess


def assert_storage_error(result_stdout: str, exit_code: int, fragment: str, reason: str) -> None:
    envelope = json.loads(result_stdout)
    assert exit_code == 3
    assert envelope["ok"] is False
    error = envelope["errors"][0]
    assert (error["code"], error["detail"]["reason"]) == ("DB_UNUSABLE", reason)
    assert fragment in error["message"]
    assert "Traceback" not in result_stdout


@pytest.mark.parametrize("verb", [["status"], ["list"], ["add", "--", "true"]])
def test_a_file_that_is_not_sqlite(tmp_path: Path, verb: list[str]) -> None:
    bogus = tmp_path / "queue.db"
    bogus.write_text("this is not a database\n" * 50)
    before = bogus.read_bytes()
    result = cli_json(*verb, db=bogus)
    assert_storage_error(result.stdout, result.exit_code, "not an SQLite database", "damaged")
    assert bogus.read_bytes() == before


@pytest.mark.parametrize("content", [b"x", b"notes\n", b"SQLite format"])
@pytest.mark.parametrize("verb", [["status"], ["add", "--", "true"]])
def test_a_tiny_file_that_is_not_sqlite_is_not_overwritten(
    tmp_path: Path, verb: list[str], content: bytes
) -> None:
    """SQLite itself takes a file shorter than its header for an empty
    database and writes a new one over it: the header is checked first, so
    a few bytes of someone's file are refused like any other file."""
    bogus = tmp_path / "queue.db"
    bogus.write_bytes(content)
    result = cli_json(*verb, db=bogus)
    assert_storage_error(result.stdout, result.exit_code, "not an SQLite database", "damaged")
    assert bogus.read_bytes() == content


def test_a_folder_at_the_database_path(tmp_path: Path) -> None:
    """A folder given as the queue is a wrong --db, an input error (as 0.4.11
    said), not a storage fault; nothing is created."""
    result = cli_json("status", db=tmp_path)
    error = json.loads(result.stdout)["errors"][0]
    assert (result.exit_code, error["code"]) == (1, "INVALID_INPUT")
    assert str(tmp_path) in error["message"]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("verb", [["status"], ["add", "--", "true"], ["doctor"]])
def test_a_spool_under_a_file_is_a_wrong_path(tmp_path: Path, verb: list[str]) -> None:
    """A file where the path needs a folder is a wrong --db (like a folder
    given as the file), an input error; nothing is created."""
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    result = cli_json(*verb, db=blocker / "spool" / "queue.db")
    if verb == ["doctor"]:
        checks = {c["id"]: c for c in result.data["checks"]}
        assert (result.exit_code, checks["db_path_resolved"]["status"]) == (3, "fail")
        assert "is a file, not a folder" in checks["db_path_resolved"]["message"]
    else:
        error = json.loads(result.stdout)["errors"][0]
        assert (result.exit_code, error["code"]) == (1, "INVALID_INPUT")
        assert f"{blocker} is a file, not a folder" in error["message"]
    assert sorted(tmp_path.iterdir()) == [blocker] and blocker.read_text() == ""


def test_text_mode_says_what_to_check(tmp_path: Path) -> None:
    bogus = tmp_path / "queue.db"
    bogus.write_text("x" * 4096)
    result = cli("list", db=bogus)
    assert result.exit_code == 3
    assert result.stderr.startswith("spoolctl: DB_UNUSABLE: cannot use the queue database")
    assert "please report this as a bug" not in result.stderr
    assert "Traceback" not in result.stderr
