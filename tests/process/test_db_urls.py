"""What `--db` names, through real `spoolctl` processes: a relative path with
a colon is usable as `./name`, and an SQLite URL names a file. How values are
parsed and masked is in tests/unit/test_db_urls.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import cli_json


@pytest.mark.subprocess
def test_a_relative_path_with_a_colon_is_usable_with_dot_slash(tmp_path: Path) -> None:
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        refused = cli_json("add", "--db", "name:with:colon.db", "--", "true")
        assert refused.envelope["errors"][0]["code"] == "INVALID_INPUT"
        assert "./name:with:colon" in refused.envelope["errors"][0]["message"]
        added = cli_json("add", "--db", "./name:with:colon.db", "--", "true")
        assert added.exit_code == 0, added.stdout
    finally:
        os.chdir(cwd)
    assert (tmp_path / "name:with:colon.db").is_file()


@pytest.mark.subprocess
@pytest.mark.parametrize("slashes", ["///", "////"])
def test_an_sqlite_url_names_a_file(slashes: str, tmp_path: Path) -> None:
    path = f"{tmp_path}/spool/queue.db".lstrip("/") if slashes == "////" else "spool/queue.db"
    url = f"sqlite:{slashes}{path}"
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        added = cli_json("add", "--db", url, "--", "true")
        listed = cli_json("list", "--db", str(tmp_path / "spool" / "queue.db"))
    finally:
        os.chdir(cwd)
    assert added.exit_code == 0, added.stdout
    assert listed.data["count"] == 1
