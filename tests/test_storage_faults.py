"""A database path SQLite cannot use gives a clear error, never a traceback,
and changes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import cli, cli_json


def assert_storage_error(result_stdout: str, exit_code: int, fragment: str) -> None:
    envelope = json.loads(result_stdout)
    assert exit_code == 3
    assert envelope["ok"] is False
    error = envelope["errors"][0]
    assert error["code"] == "INTERNAL"
    assert fragment in error["message"]
    assert "Traceback" not in result_stdout


@pytest.mark.parametrize("verb", [["status"], ["list"], ["add", "--", "true"]])
def test_a_file_that_is_not_sqlite(tmp_path: Path, verb: list[str]) -> None:
    bogus = tmp_path / "queue.db"
    bogus.write_text("this is not a database\n" * 50)
    before = bogus.read_bytes()
    result = cli_json(*verb, db=bogus)
    assert_storage_error(result.stdout, result.exit_code, "not a spoolctl queue")
    assert bogus.read_bytes() == before


def test_a_folder_at_the_database_path(tmp_path: Path) -> None:
    """A folder given as the queue is a wrong --db, an input error (as 0.4.11
    said), not a storage fault; nothing is created."""
    result = cli_json("status", db=tmp_path)
    error = json.loads(result.stdout)["errors"][0]
    assert (result.exit_code, error["code"]) == (1, "INVALID_INPUT")
    assert str(tmp_path) in error["message"]
    assert list(tmp_path.iterdir()) == []


def test_a_spool_under_a_file_cannot_be_created(tmp_path: Path) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    result = cli_json("add", "--", "true", db=blocker / "queue.db")
    assert_storage_error(result.stdout, result.exit_code, "cannot create the queue")


def test_text_mode_says_what_to_check(tmp_path: Path) -> None:
    bogus = tmp_path / "queue.db"
    bogus.write_text("x" * 4096)
    result = cli("list", db=bogus)
    assert result.exit_code == 3
    assert result.stderr.startswith("spoolctl: INTERNAL: cannot use the queue database")
    assert "Traceback" not in result.stderr
