"""`add`: every grammar and limit of docs/design.md that applies to it, the
idempotency key rules, cwd and file permissions, and all-or-nothing batches.

Runs the CLI in-process (fast); every rejected input must leave the queue
exactly as it was. Runs on SQLite and on PostgreSQL (but file permissions)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import Db, Result, has_queue, inproc, rows

pytestmark = pytest.mark.both_backends
Capsys = pytest.CaptureFixture[str]


def add(db: Db, capsys: Capsys, *args: str) -> Result:
    return inproc("add", "--db", str(db), "--json", *args, capsys=capsys)


def job_count(db: Db) -> int:
    return 0 if not has_queue(db) else int(rows(db, "SELECT count(*) FROM jobs")[0][0])


def stored(db: Db, job_id: int) -> Any:
    return rows(db, "SELECT * FROM jobs WHERE id = ?", (job_id,))[0]


LONG = "x" * 5000
REJECTED: list[tuple[str, list[str], str]] = [
    ("duration unit", ["--after", "5x", "--", "true"], "INVALID_INPUT"),
    ("duration upper-case unit", ["--after", "1H", "--", "true"], "INVALID_INPUT"),
    ("duration negative", ["--after", "-1", "--", "true"], "INVALID_INPUT"),
    ("duration infinite", ["--after", "1e400", "--", "true"], "INVALID_INPUT"),
    ("duration too long", ["--after", "31536000001", "--", "true"], "INVALID_INPUT"),
    ("at not a time", ["--at", "next tuesday", "--", "true"], "INVALID_INPUT"),
    ("at nan", ["--at", "nan", "--", "true"], "INVALID_INPUT"),
    ("after with at", ["--after", "1", "--at", "0", "--", "true"], "INVALID_INPUT"),
    ("priority above int32", ["--priority", "2147483648", "--", "true"], "INVALID_INPUT"),
    ("priority below int32", ["--priority", "-2147483649", "--", "true"], "INVALID_INPUT"),
    ("priority not whole", ["--priority", "1.5", "--", "true"], "INVALID_INPUT"),
    ("timeout negative", ["--timeout", "-1", "--", "true"], "INVALID_INPUT"),
    ("timeout None", ["--timeout", "None", "--", "true"], "INVALID_INPUT"),
    ("timeout compound out of order", ["--timeout", "30m1h", "--", "true"], "INVALID_INPUT"),
    ("cpus below a cgroup's quantum", ["--cpus", "0.0001", "--", "true"], "INVALID_INPUT"),
    ("timeout above 2**63-1", ["--timeout", str(2**63), "--", "true"], "INVALID_INPUT"),
    ("timeout garbage", ["--timeout", "soon", "--", "true"], "INVALID_INPUT"),
    ("max-retries negative", ["--max-retries", "-1", "--", "true"], "INVALID_INPUT"),
    ("max-crashes negative", ["--max-crashes", "-1", "--", "true"], "INVALID_INPUT"),
    ("queue empty", ["--queue", "", "--", "true"], "INVALID_INPUT"),
    ("queue leading dash", ["--queue", "-gpu", "--", "true"], "INVALID_INPUT"),
    ("queue with space", ["--queue", "a b", "--", "true"], "INVALID_INPUT"),
    ("queue too long", ["--queue", "q" * 65, "--", "true"], "INVALID_INPUT"),
    ("env without =", ["--env", "NOVALUE", "--", "true"], "INVALID_INPUT"),
    ("env empty key", ["--env", "=v", "--", "true"], "INVALID_INPUT"),
    ("env key too long", ["--env", "K" * 129 + "=v", "--", "true"], "INVALID_INPUT"),
    ("env value too long", ["--env", "K=" + "v" * 4097, "--", "true"], "INVALID_INPUT"),
    ("tag without =", ["--tag", "team", "--", "true"], "INVALID_INPUT"),
    ("tag empty key", ["--tag", "=v", "--", "true"], "INVALID_INPUT"),
    ("tag key too long", ["--tag", "k" * 129 + "=v", "--", "true"], "INVALID_INPUT"),
    ("tag value too long", ["--tag", "k=" + "v" * 1025, "--", "true"], "INVALID_INPUT"),
    (
        "seventeen tags",
        [*(a for i in range(17) for a in ("--tag", f"k{i}=v")), "--", "true"],
        "INVALID_INPUT",
    ),
    ("note too long", ["--note", "n" * 10_001, "--", "true"], "INVALID_INPUT"),
    ("key empty", ["--key", "", "--", "true"], "INVALID_INPUT"),
    ("key too long", ["--key", "k" * 257, "--", "true"], "INVALID_INPUT"),
    ("key with newline", ["--key", "a\nb", "--", "true"], "INVALID_INPUT"),
    ("key with control character", ["--key", "a\x07b", "--", "true"], "INVALID_INPUT"),
    ("cwd empty", ["--cwd", "", "--", "true"], "INVALID_INPUT"),
    ("cwd too long", ["--cwd", "/" + "d" * 4096, "--", "true"], "INVALID_INPUT"),
    ("-c empty", ["-c", ""], "MISSING_REQUIRED"),
    ("-c blank", ["-c", "   "], "MISSING_REQUIRED"),
    ("-c and argv", ["-c", "echo hi", "--", "ls"], "INVALID_INPUT"),
    ("no command", [], "MISSING_REQUIRED"),
    ("no command after --", ["--"], "MISSING_REQUIRED"),
]


@pytest.mark.parametrize(("args", "code"), [c[1:] for c in REJECTED], ids=[c[0] for c in REJECTED])
def test_invalid_input_is_rejected_and_changes_nothing(
    db: Db, capsys: Capsys, args: list[str], code: str
) -> None:
    result = add(db, capsys, *args)

    assert result.exit_code == 1, result.stdout
    envelope = result.envelope
    assert envelope["ok"] is False and envelope["data"] is None
    assert [e["code"] for e in envelope["errors"]] == [code]
    assert envelope["errors"][0]["exit_code"] == 1
    assert "Traceback" not in result.stdout + result.stderr
    assert job_count(db) == 0


def test_values_at_the_limits_are_accepted(db: Db, capsys: Capsys) -> None:
    tags = [a for i in range(16) for a in ("--tag", f"k{i}=" + "v" * 1024)]
    result = add(
        db,
        capsys,
        "--priority",
        "2147483647",
        "--timeout",
        str(2**63 - 1),
        "--queue",
        "q" * 64,
        "--key",
        "k" * 256,
        "--note",
        "n" * 10_000,
        "--after",
        "0",
        *tags,
        "--env",
        "K" * 128 + "=" + "v" * 4096,
        "--env",
        "A=first",
        "--env",
        "A=x=y",
        "--",
        "true",
    )

    assert result.exit_code == 0, result.stdout
    row = stored(db, result.data["job_id"])
    assert (row["priority"], row["timeout_seconds"], row["queue"]) == (
        2**31 - 1,
        2**63 - 1,
        "q" * 64,
    )
    assert json.loads(row["env"])["A"] == "x=y", "later duplicates win, split on the first ="
    assert len(json.loads(row["tags"])) == 16
    assert result.data["env_keys"] == sorted(["A", "K" * 128])
    low = add(db, capsys, "--priority", "-2147483648", "--timeout", "1", "--", "true")
    assert low.exit_code == 0 and stored(db, low.data["job_id"])["priority"] == -(2**31)


def test_shell_string_and_durations_are_stored_as_documented(db: Db, capsys: Capsys) -> None:
    shell = add(db, capsys, "--timeout", "5m", "--after", "1.5h", "-c", "echo $HOME")
    assert shell.exit_code == 0
    row = stored(db, shell.data["job_id"])
    assert json.loads(row["argv"]) == ["sh", "-c", "echo $HOME"]
    assert row["timeout_seconds"] == 300
    assert row["next_run_at"] - row["created_at"] == pytest.approx(5400)

    past = add(db, capsys, "--at", "2001-01-01T00:00:00", "--", "true")
    row = stored(db, past.data["job_id"])
    assert row["next_run_at"] == pytest.approx(row["created_at"]), "a past time means now"


def test_same_key_and_command_deduplicates(db: Db, capsys: Capsys) -> None:
    first = add(db, capsys, "--key", "nightly", "--", "make", "all")
    again = add(db, capsys, "--key", "nightly", "--", "make", "all")

    assert again.exit_code == 0
    assert again.data["deduplicated"] is True and first.data["deduplicated"] is False
    assert again.data["job_id"] == first.data["job_id"]
    assert again.envelope["warnings"] == []
    assert job_count(db) == 1


def test_same_key_with_another_command_is_a_conflict(db: Db, capsys: Capsys) -> None:
    add(db, capsys, "--key", "nightly", "--", "make", "all")
    clash = add(db, capsys, "--key", "nightly", "--", "make", "clean")

    assert clash.exit_code == 5
    assert [e["code"] for e in clash.envelope["errors"]] == ["IDEMPOTENCY_CONFLICT"]
    assert job_count(db) == 1


def test_only_metadata_differing_deduplicates_with_a_warning(db: Db, capsys: Capsys) -> None:
    first = add(db, capsys, "--key", "k", "--tag", "a=1", "--note", "one", "--", "true")
    again = add(db, capsys, "--key", "k", "--tag", "a=2", "--note", "two", "--", "true")

    assert again.exit_code == 0 and again.data["deduplicated"] is True
    assert again.data["job_id"] == first.data["job_id"]
    assert [w["code"] for w in again.envelope["warnings"]] == ["IDEMPOTENCY_METADATA_DIFFERS"]
    assert set(again.data["idempotency"]["metadata_differences"]) == {"tags", "note"}
    row = stored(db, first.data["job_id"])
    assert (json.loads(row["tags"]), row["note"]) == ({"a": "1"}, "one"), "the job kept its own"


def test_cwd_is_made_absolute_without_resolving_symlinks(
    db: Db, capsys: Capsys, tmp_path: Path
) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")

    result = add(db, capsys, "--cwd", "link/./", "--", "pwd")

    assert result.data["cwd"] == str(tmp_path / "link")
    assert stored(db, result.data["job_id"])["cwd"] == str(tmp_path / "link")


@pytest.mark.sqlite_only("file modes of the queue file")
def test_the_spool_folder_and_database_are_private(db: Path, capsys: Capsys) -> None:
    old = os.umask(0o022)
    try:
        assert add(db, capsys, "--", "true").exit_code == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(db.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(db.stat().st_mode) == 0o600


def test_a_batch_is_all_or_nothing(db: Db, capsys: Capsys, tmp_path: Path) -> None:
    good = [{"argv": ["echo", "1"]}, {"cmd": "echo 2", "priority": 3, "queue": "gpu"}]
    bad = tmp_path / "bad.ndjson"
    bad.write_text("\n".join(json.dumps(o) for o in [*good, {"cmd": "x", "queue": "no way"}]))

    refused = add(db, capsys, "--batch", str(bad))

    assert refused.exit_code == 1
    assert [e["code"] for e in refused.envelope["errors"]] == ["INVALID_INPUT"]
    assert "line 3" in refused.envelope["errors"][0]["message"]
    assert job_count(db) == 0

    ok = tmp_path / "ok.ndjson"
    ok.write_text("\n".join(json.dumps(o) for o in good) + "\n")
    accepted = add(db, capsys, "--batch", str(ok))
    assert accepted.exit_code == 0 and accepted.data["count"] == 2
    second = stored(db, accepted.data["job_ids"][1])
    assert (second["priority"], second["queue"]) == (3, "gpu")
    assert job_count(db) == 2


def test_batch_lines_take_the_flags_given_with_it_as_defaults(
    db: Db, capsys: Capsys, tmp_path: Path
) -> None:
    """Every per-job flag given with --batch is the default of every line; a
    line's own key wins, and tags and env merge (a line's own tag wins)."""
    lines = [
        {"argv": ["true"]},
        {
            "argv": ["true"],
            "queue": "own",
            "priority": -1,
            "tags": {"team": "line"},
            "max_retries": 0,
            "note": None,
            "after": "0",
        },
    ]
    batch = tmp_path / "jobs.ndjson"
    batch.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    flags = [
        "--queue",
        "lane",
        "--priority",
        "7",
        "--after",
        "1h",
        "--tag",
        "team=flag",
        "--tag",
        "env=prod",
        "--max-retries",
        "9",
        "--max-crashes",
        "2",
        "--timeout",
        "60",
        "--note",
        "nightly",
        "--env",
        "A=1",
        "--cwd",
        str(tmp_path),
    ]
    accepted = add(db, capsys, "--batch", str(batch), *flags)
    assert accepted.exit_code == 0, accepted.stdout
    first, second = (stored(db, job_id) for job_id in accepted.data["job_ids"])
    assert (first["queue"], first["priority"], first["max_retries"]) == ("lane", 7, 9)
    assert (first["max_crashes"], first["timeout_seconds"], first["note"]) == (2, 60, "nightly")
    assert json.loads(first["tags"]) == {"team": "flag", "env": "prod"}
    assert json.loads(first["env"]) == {"A": "1"} and first["cwd"] == str(tmp_path)
    assert first["next_run_at"] - first["created_at"] > 3500, "--after applies to every line"
    assert (second["queue"], second["priority"], second["max_retries"]) == ("own", -1, 0)
    assert json.loads(second["tags"]) == {"team": "line", "env": "prod"}
    assert second["note"] is None and second["next_run_at"] - second["created_at"] < 60


def test_batch_parents_given_as_a_flag_hold_every_line(
    db: Db, capsys: Capsys, tmp_path: Path
) -> None:
    parent = add(db, capsys, "--", "true").data["job_id"]
    batch = tmp_path / "jobs.ndjson"
    batch.write_text('{"argv": ["true"]}\n{"argv": ["true"], "after_jobs": []}\n')
    accepted = add(db, capsys, "--batch", str(batch), "--after-job", str(parent))
    held, free = (stored(db, job_id) for job_id in accepted.data["job_ids"])
    assert (held["state"], free["state"]) == ("waiting", "queued")


def test_a_flag_that_cannot_apply_to_a_batch_is_refused_by_name(
    db: Db, capsys: Capsys, tmp_path: Path
) -> None:
    batch = tmp_path / "jobs.ndjson"
    batch.write_text('{"argv": ["true"]}\n{"argv": ["false"]}\n')
    refused = add(db, capsys, "--batch", str(batch), "--key", "nightly")
    (error,) = refused.envelope["errors"]
    assert (refused.exit_code, error["code"], error["detail"]["flag"]) == (
        1,
        "INVALID_INPUT",
        "--key",
    )
    assert job_count(db) == 0
