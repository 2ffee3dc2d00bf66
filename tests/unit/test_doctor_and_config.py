"""doctor, config-show and config-validate: read-only, they explain the setup."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from tests.populated import run_json, run_quiet


@pytest.fixture(autouse=True)
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SPOOLCTL_DB", raising=False)
    return tmp_path


def checks(envelope: dict) -> dict[str, str]:
    return {c["id"]: c["status"] for c in envelope["data"]["checks"]}


def test_doctor_on_a_fresh_folder_is_not_ready_says_why_and_creates_nothing(
    tmp_path: Path,
) -> None:
    """No queue yet: not ready, exit 3 (as 0.4.11 answers), naming the verbs
    that create one; doctor itself creates nothing."""
    result = run_json("doctor")
    assert result.exit_code == 3 and result.envelope["ok"] is True
    assert result.envelope["data"]["ready"] is False
    found = checks(result.envelope)
    assert found["database_exists"] == "fail" and found["schema_version"] == "skip"
    assert found["contract_metadata"] == "pass"
    (check,) = [c for c in result.envelope["data"]["checks"] if c["id"] == "database_exists"]
    assert "does not exist yet" in check["message"]
    assert "`spoolctl add`" in check["remediation"] and "`spoolctl work`" in check["remediation"]
    assert not (tmp_path / ".spoolctl").exists()
    text = run_quiet("doctor")
    assert text.exit_code == 3 and "the queue does not exist yet" in text.stdout


def test_doctor_on_an_empty_file_is_not_ready_either(tmp_path: Path) -> None:
    """A file of zero bytes holds no queue yet (the first add makes one there)."""
    db = tmp_path / "empty.db"
    db.touch()
    result = run_json("doctor", "--db", str(db))
    assert (result.exit_code, result.envelope["data"]["ready"]) == (3, False)
    (check,) = [c for c in result.envelope["data"]["checks"] if c["id"] == "schema_version"]
    assert check["status"] == "fail" and "does not exist yet" in check["message"]
    assert db.stat().st_size == 0


def test_doctor_not_ready_exits_3_but_stays_ok(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE alembic_version (version_num TEXT)")
        conn.execute("INSERT INTO alembic_version VALUES ('9999_future')")
    result = run_json("doctor", "--db", str(db))
    assert result.exit_code == 3 and result.envelope["ok"] is True
    assert result.envelope["data"]["ready"] is False
    assert checks(result.envelope)["schema_version"] == "fail"


def test_doctor_reports_a_broken_config_and_bad_knobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / ".spoolctl").mkdir()
    (tmp_path / ".spoolctl" / "config.json").write_text('{"version": 7}')
    monkeypatch.setenv("SPOOLCTL_TEST_HEARTBEAT_INTERVAL", "-1")
    result = run_json("doctor")
    found = checks(result.envelope)
    assert result.exit_code == 3
    assert (found["config_valid"], found["env_valid"], found["db_path_resolved"]) == (
        "fail",
        "fail",
        "fail",
    )
    assert found["spool_directory_writable"] == "skip"
    text = run_quiet("doctor")
    assert "not ready" in text.stdout and text.exit_code == 3


def test_config_show_explains_each_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    default = run_json("config-show").envelope["data"]
    assert default["sources"]["db_path"] == "default"
    assert default["values"]["db_path"] == str(tmp_path / ".spoolctl" / "queue.db")
    (tmp_path / ".spoolctl").mkdir()
    (tmp_path / ".spoolctl" / "config.json").write_text(
        json.dumps({"version": 1, "db_path": "q/x.db", "colour": "blue"})
    )
    configured = run_json("config-show").envelope["data"]
    assert configured["values"]["db_path"] == str(tmp_path / ".spoolctl" / "q" / "x.db")
    assert (configured["sources"]["db_path"], configured["ignored_keys"]) == ("config", ["colour"])
    monkeypatch.setenv("SPOOLCTL_DB", "/elsewhere/env.db")
    assert run_json("config-show").envelope["data"]["sources"]["db_path"] == "env"
    flagged = run_json("config-show", "--db", "/flag.db").envelope["data"]
    assert (flagged["values"]["db_path"], flagged["sources"]["db_path"]) == ("/flag.db", "flag")
    assert flagged["precedence"][0] == "flag --db"


def test_config_validate(tmp_path: Path) -> None:
    good = tmp_path / "good.json"
    good.write_text('{"version": 1, "db_path": "a.db"}')
    ok = run_json("config-validate", str(good))
    assert ok.exit_code == 0
    assert ok.envelope["data"]["valid"] is True and ok.envelope["data"]["unknown_keys"] == []
    assert ok.envelope["data"]["recognized_keys"] == ["db_path", "defaults"]
    for name, text in (
        ("extra", '{"db_path": "a.db", "extra": 1}'),
        ("bad", "[1, 2"),
        ("version", '{"version": 2}'),
    ):
        path = tmp_path / f"{name}.json"
        path.write_text(text)
        refused = run_json("config-validate", str(path))
        assert (refused.exit_code, refused.envelope["ok"]) == (1, False), name
        assert refused.envelope["errors"][0]["code"] == "INVALID_INPUT", name
    unreadable = tmp_path / "folder.json"
    unreadable.mkdir()
    refused = run_json("config-validate", str(unreadable))
    assert (refused.exit_code, refused.envelope["errors"][0]["code"]) == (1, "INVALID_INPUT")
    missing = run_json("config-validate", str(tmp_path / "absent.json"))
    assert (missing.exit_code, missing.envelope["data"]["exists"]) == (0, False), "defaults apply"
    assert run_json("config-validate").envelope["data"]["valid"] is True
