"""`copy-to` moves a queue up from SQLite to PostgreSQL losslessly: every row of
every table with every column (floats bit for bit), ids and the id sequences
past every id the file gave out, and each attempt's output files as chunks
that reassemble to the same bytes. The verbs read the same answers from both.
A target that holds anything, a source that is not ready, and a bad URL are
refused without writing, and the password never reaches the output."""

from __future__ import annotations

import shutil
import socket
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy.engine import make_url

from spoolctl.db.backends.postgresql.output import CHUNK_BYTES as OUTPUT_CHUNK_BYTES
from spoolctl.db.tables import metadata
from tests.helpers import Result, execute, rows
from tests.pg_server import libpq_url
from tests.populated import run_json, run_quiet
from tests.unit.test_legacy import copy_fixture

pytestmark = pytest.mark.subprocess

COMPARED = [t for t in metadata.sorted_tables if t.name != "output_chunks"]


@dataclass(frozen=True)
class Source:
    db: Path
    ids: dict[str, int]
    pruned_top: int
    missing_attempt: tuple[int, int]

    def run(self, verb: str, *args: str) -> Result:
        return run_quiet(verb, "--json", "--db", str(self.db), *args)


def ok(result: Result) -> dict[str, Any]:
    assert result.exit_code == 0, result.stdout + result.stderr
    data: dict[str, Any] = result.envelope["data"]
    return data


def add(db: Path, *args: str) -> int:
    return int(ok(run_json("add", "--db", str(db), *args))["job_id"])


def drain(db: Path) -> None:
    ok(run_json("work", "--db", str(db), "--drain"))


def build_source(db: Path) -> Source:
    """A queue made by the verbs: a job in every state a stopped queue can
    hold, waiting dependencies, a paused lane, a job retried into three
    attempts, binary and multi-chunk output, a missing output file, and ids
    pruned from the middle and from the top."""
    ids: dict[str, int] = {}
    gap = add(db, "--", "true")
    ok(run_json("cancel", "--db", str(db), str(gap)))
    ids["done"] = add(
        db,
        "--tag",
        "team=ml",
        "--env",
        "SECRET=xyz",
        "--note",
        "ünï\u2028code",
        "--key",
        "k1",
        "-c",
        "echo hello; echo err >&2",
    )
    ids["binary"] = add(db, "-c", r"printf '\000\377\376\r\n'; head -c 200000 /dev/urandom")
    ids["retried"] = add(db, "--max-retries", "0", "-c", "echo oops >&2; exit 3")
    ids["to_cancel"] = add(db, "--", "true")
    ids["parent"] = add(db, "--max-retries", "0", "--", "false")
    ids["orphaned"] = add(db, "--after-job", str(ids["parent"]), "--", "true")
    ids["scheduled"] = add(db, "--after", "1h", "--queue", "other", "--priority", "5", "--", "true")
    ids["waiting"] = add(
        db, "--after-job", str(ids["scheduled"]), "--after-job", str(ids["done"]), "--", "true"
    )
    add(db, "--after-job-any", str(ids["scheduled"]), "--", "true")
    ids["requeued"] = add(
        db, "--requeue-exit", "75", "--max-requeues", "1", "--max-retries", "0", "-c", "exit 75"
    )
    ids["warned"] = add(db, "--after", "1h", "--signal-before-timeout", "USR1@1m", "--", "true")
    for name in ("nightly", "hourly"):
        ok(
            run_json(
                "schedule add",
                "--db",
                str(db),
                name,
                "--cron",
                "0 3 * * *",
                "--timezone",
                "Europe/Berlin",
                "--tag",
                "k=v",
                "--",
                "true",
            )
        )
    ok(run_json("schedule run", "--db", str(db), "nightly"))
    ok(run_json("schedule pause", "--db", str(db), "hourly", "--reason", "later"))
    top = add(db, "--", "true")
    ok(run_json("cancel", "--db", str(db), str(top)))
    pruned = ok(
        run_json("prune", "--db", str(db), "--older-than", "0", "--state", "canceled", "--yes")
    )
    assert pruned["deleted_jobs"] == 2
    ok(run_json("cancel", "--db", str(db), str(ids["to_cancel"])))
    drain(db)
    for _ in range(2):
        ok(run_json("retry", "--db", str(db), str(ids["retried"])))
        drain(db)
    done_attempt = rows(db, "SELECT id FROM attempts WHERE job_id = ?", (ids["done"],))[0]["id"]
    execute(  # a request its worker delivered, as `signal` leaves it
        db,
        "INSERT INTO control_requests (job_id, attempt_id, action, signal, requested_at, "
        "settled_at, result) VALUES (?, ?, 'signal', 'SIGUSR1', 1.5, 1.625, 'delivered')",
        (ids["done"], done_attempt),
    )
    ok(run_json("pause", "--db", str(db), "other", "--reason", "moving up"))
    place_on_devices(db, ids)
    first = rows(
        db,
        "SELECT stdout_path FROM attempts WHERE job_id = ? AND attempt_no = 1",
        (ids["retried"],),
    )[0]
    Path(first["stdout_path"]).unlink()
    return Source(db, ids, pruned_top=top, missing_attempt=(ids["retried"], 1))


HELD, FREE = (f"GPU-5f1a3c9e-0000-4000-8000-00000000000{n}" for n in (1, 2))
WHOLE = 720720
"""A whole device's units (`tables.DEVICE_UNITS`)."""


def place_on_devices(db: Path, ids: dict[str, int]) -> None:
    """What placement leaves behind, written as its statements would: the
    worker's inventory and two registered devices, the done job's request
    and the devices its attempt ran on, and a hold that outlived its
    attempt (the retried job's last: an orphan not confirmed gone)."""
    inventory = (
        '{"slots": 4, "memory_bytes": 68719476736, "host": "gpu-a", "devices": '
        f'[{{"uuid": "{HELD}", "index": 0, "model": "NVIDIA H100 80GB HBM3", '
        '"memory_bytes": 85520809984}]}'
    )
    execute(db, "UPDATE workers SET inventory = ?", (inventory,))
    for n, uuid in enumerate((HELD, FREE)):
        execute(
            db,
            "INSERT INTO devices (uuid, host, idx, model, memory_bytes, held, seen_at) "
            "VALUES (?, 'gpu-a', ?, 'NVIDIA H100 80GB HBM3', 85520809984, ?, 1.0000000000000002)",
            (uuid, n, WHOLE // 2 if uuid == HELD else 0),
        )
    execute(
        db,
        "UPDATE jobs SET weight = 2, gpus = 1, gpu_share = 2, gpu_memory_bytes = 40000000000, "
        "gpu_model = 'H100*' WHERE id = ?",
        (ids["done"],),
    )
    execute(
        db,
        "UPDATE attempts SET host = 'gpu-a', devices = ? WHERE job_id IN (?, ?)",
        (HELD, ids["done"], ids["retried"]),
    )
    last = rows(
        db, "SELECT id FROM attempts WHERE job_id = ? ORDER BY attempt_no DESC", (ids["retried"],)
    )[0]["id"]
    execute(
        db,
        "INSERT INTO device_holds (device_uuid, attempt_id, job_id, units, worker_id, held_at) "
        "SELECT ?, ?, ?, ?, min(id), 2.5 FROM workers",
        (HELD, last, ids["retried"], WHOLE // 2),
    )


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Source:
    return build_source(tmp_path_factory.mktemp("copy") / "spool" / "queue.db")


def test_the_source_has_what_the_copy_must_carry(source: Source) -> None:
    states = {r["id"]: r["state"] for r in rows(source.db, "SELECT id, state FROM jobs")}
    assert {states[source.ids[k]] for k in source.ids} == {
        "done",
        "dead",
        "canceled",
        "queued",
        "waiting",
    }
    assert (
        len(rows(source.db, "SELECT id FROM attempts WHERE job_id = ?", (source.ids["retried"],)))
        == 3
    )
    assert rows(source.db, "SELECT queue FROM lanes")[0]["queue"] == "other"
    assert len(rows(source.db, "SELECT * FROM control_requests")) == 1
    requeued = rows(
        source.db,
        "SELECT state FROM attempts WHERE job_id = ? ORDER BY id",
        (source.ids["requeued"],),
    )
    assert [r["state"] for r in requeued] == ["requeued", "failed"]
    assert len(rows(source.db, "SELECT * FROM job_dependencies")) >= 2
    assert [
        (r["device_uuid"], r["units"]) for r in rows(source.db, "SELECT * FROM device_holds")
    ] == [(HELD, WHOLE // 2)]
    assert [r["held"] for r in rows(source.db, "SELECT held FROM devices ORDER BY uuid")] == [
        WHOLE // 2,
        0,
    ]
    asked = rows(
        source.db, "SELECT weight, gpus, gpu_model FROM jobs WHERE id = ?", (source.ids["done"],)
    )
    assert [tuple(r) for r in asked] == [(2, 1, "H100*")]
    assert (
        rows(source.db, "SELECT count(*) AS n FROM attempts WHERE devices = ?", (HELD,))[0]["n"] > 1
    )
    assert all(r["inventory"] for r in rows(source.db, "SELECT inventory FROM workers"))
    issued = rows(source.db, "SELECT seq FROM sqlite_sequence WHERE name = 'jobs'")[0]["seq"]
    assert issued == source.pruned_top > max(states)
    assert 1 not in states


def pg_password(url: str) -> str:
    password = make_url(url).password
    assert password
    return str(password)


def copy_to(url: str, *args: str) -> Result:
    """copy-to with --json; the password never appears in what it prints."""
    result = run_quiet("copy-to", "--json", url, *args)
    assert pg_password(url) not in result.stdout + result.stderr
    return result


def sqlite_table(db: Path, table: str, columns: list[str], order: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(f"SELECT {', '.join(columns)} FROM {table} ORDER BY {order}").fetchall()
    finally:
        conn.close()


def pg_query(url: str, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(libpq_url(url)) as conn:
        return conn.execute(sql).fetchall()  # type: ignore[arg-type]


def select_sql(table: Any) -> tuple[list[str], str]:
    columns = [f'"{c.name}"' for c in table.columns]
    return columns, ", ".join(f'"{c.name}"' for c in table.primary_key.columns)


def same_value(a: Any, b: Any) -> bool:
    """Equal, and a float equal to the last bit (a REAL stays a double)."""
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, float) and isinstance(b, float) and a.hex() == b.hex()
    return bool(a == b) and type(a) is type(b)


def assert_tables_equal(db: Path, url: str) -> dict[str, int]:
    counted = {}
    for table in COMPARED:
        columns, order = select_sql(table)
        mine = sqlite_table(db, table.name, columns, order)
        theirs = pg_query(url, f"SELECT {', '.join(columns)} FROM {table.name} ORDER BY {order}")
        assert len(mine) == len(theirs), table.name
        for row_a, row_b in zip(mine, theirs, strict=True):
            for column, a, b in zip(table.columns, row_a, row_b, strict=True):
                if (table.name, column.name) == ("job_events", "seq"):
                    a = row_a[0]  # an SQLite event's id is its ledger position
                assert same_value(a, b), (table.name, column.name, row_a[0], a, b)
        counted[table.name] = len(mine)
    return counted


def chunks_of(url: str) -> dict[tuple[int, str], list[tuple[int, bytes, int]]]:
    found: dict[tuple[int, str], list[tuple[int, bytes, int]]] = {}
    query = 'SELECT attempt_id, stream, "offset", data, truncated FROM output_chunks ORDER BY id'
    for attempt_id, stream, offset, data, truncated in pg_query(url, query):
        found.setdefault((attempt_id, stream), []).append((offset, bytes(data), truncated))
    return found


def test_copy_to_postgresql_is_lossless(source: Source, pg_url: str) -> None:
    before = sqlite_snapshot(source.db)
    data = ok(copy_to(pg_url, "--db", str(source.db)))
    assert sqlite_snapshot(source.db) == before, "the source is only read"
    counted = assert_tables_equal(source.db, pg_url)
    assert {k: v for k, v in data["tables"].items() if k != "output_chunks"} == counted
    assert min(counted.values()) > 0, counted
    chunks = chunks_of(pg_url)
    assert data["tables"]["output_chunks"] == sum(len(c) for c in chunks.values())
    stored = 0
    attempts = rows(
        source.db, "SELECT id, job_id, attempt_no, stdout_path, stderr_path FROM attempts"
    )
    for attempt in attempts:
        for stream in ("stdout", "stderr"):
            path = Path(attempt[f"{stream}_path"])
            kept = chunks.get((attempt["id"], stream), [])
            if not path.exists():
                assert (attempt["job_id"], attempt["attempt_no"]) == source.missing_attempt
                assert kept == []
                continue
            assert [offset for offset, _, _ in kept] == [
                i * OUTPUT_CHUNK_BYTES for i in range(len(kept))
            ]
            assert all(len(d) <= OUTPUT_CHUNK_BYTES and t == 0 for _, d, t in kept)
            assert b"".join(d for _, d, _ in kept) == path.read_bytes()
            stored += path.stat().st_size
    binary = rows(
        source.db, "SELECT stdout_path FROM attempts WHERE job_id = ?", (source.ids["binary"],)
    )[0]["stdout_path"]
    assert Path(binary).read_bytes().startswith(b"\x00\xff\xfe\r\n")
    assert Path(binary).stat().st_size > 3 * OUTPUT_CHUNK_BYTES
    output = data["output"]
    assert output["bytes_stored"] == stored and output["streams_truncated"] == 0
    assert output["attempts_missing_output"] == 1 == output["streams_missing"]
    job_id, attempt_no = source.missing_attempt
    assert [(m["job_id"], m["attempt_no"], m["stream"]) for m in output["missing"]] == [
        (job_id, attempt_no, "stdout")
    ]
    assert data["source"] == str(source.db) and data["dry_run"] is False
    assert data["target"] == pg_url.replace(pg_password(pg_url), "***")
    assert data["next_ids"]["jobs"] == source.pruned_top + 1
    assert data["next_ids"]["device_holds"] == 2, "a new hold never takes a copied one's id"

    new_job = add_on(pg_url)
    assert new_job == source.pruned_top + 1, "ids the file gave out are never reused"
    events = pg_query(pg_url, f"SELECT max(id) FROM job_events WHERE job_id = {new_job}")
    last = rows(source.db, "SELECT max(id) AS m FROM job_events")[0]["m"]
    assert events[0][0] > last
    after = ok(run_json("events", "--db", pg_url, "--since-id", str(last)))["events"]
    assert [(e["job_id"], e["event"]) for e in after] == [(new_job, "added")]
    assert after[0]["id"] > last, "a cursor read from the file stays valid on the server"


def add_on(url: str) -> int:
    return int(ok(run_json("add", "--db", url, "--", "true"))["job_id"])


def sqlite_snapshot(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    return {t.name: sqlite_table(db, t.name, *select_sql(t)) for t in metadata.sorted_tables}


def test_the_verbs_read_the_same_queue_from_both(source: Source, pg_url: str) -> None:
    ok(copy_to(pg_url, "--db", str(source.db)))
    job_ids = [r["id"] for r in rows(source.db, "SELECT id FROM jobs ORDER BY id")]
    for args in (
        ["status"],
        ["list", "--limit", "0"],
        ["list", "--waiting"],
        ["events", "--limit", "0"],
        ["workers", "--all"],
        *(["show", str(i)] for i in job_ids),
    ):
        mine = ok(run_json(args[0], "--db", str(source.db), *args[1:]))
        theirs = ok(run_json(args[0], "--db", pg_url, *args[1:]))
        assert without_ages(theirs) == without_ages(mine), args


def without_ages(data: Any) -> Any:
    """The data without heartbeat ages (they grow between the two reads)."""
    if isinstance(data, dict):
        return {k: without_ages(v) for k, v in data.items() if k != "heartbeat_age_s"}
    if isinstance(data, list):
        return [without_ages(v) for v in data]
    return data


def test_output_beyond_the_cap_keeps_its_head_and_is_marked_truncated(
    source: Source, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cap = 100_000
    monkeypatch.setenv("SPOOLCTL_PG_OUTPUT_CAP", str(cap))
    data = ok(copy_to(pg_url, "--db", str(source.db)))
    attempt = rows(
        source.db, "SELECT id, stdout_path FROM attempts WHERE job_id = ?", (source.ids["binary"],)
    )[0]
    kept = chunks_of(pg_url)[(attempt["id"], "stdout")]
    assert [(o, len(d), t) for o, d, t in kept] == [
        (0, OUTPUT_CHUNK_BYTES, 0),
        (OUTPUT_CHUNK_BYTES, cap - OUTPUT_CHUNK_BYTES, 1),
    ]
    assert b"".join(d for _, d, _ in kept) == Path(attempt["stdout_path"]).read_bytes()[:cap]
    assert data["output"]["streams_truncated"] == 1 and data["output"]["cap_bytes"] == cap

    monkeypatch.setenv("SPOOLCTL_PG_OUTPUT_CAP", "8MiB")
    refused = copy_to(pg_url, "--db", str(source.db))
    assert (refused.exit_code, refused.envelope["errors"][0]["code"]) == (1, "INVALID_INPUT")


def test_output_paths_outside_the_spool_are_never_read(
    source: Source, pg_url: str, tmp_path: Path
) -> None:
    """A spool folder moved elsewhere: its rows name files of the old folder,
    outside the one holding the queue, and those are not followed."""
    moved = Path(shutil.copytree(source.db.parent, tmp_path / "moved"))
    data = ok(copy_to(pg_url, "--db", str(moved / "queue.db")))
    n_attempts = len(rows(source.db, "SELECT id FROM attempts"))
    assert data["output"]["streams_refused"] == 2 * n_attempts
    assert data["output"]["chunks"] == data["output"]["streams_stored"] == 0
    assert chunks_of(pg_url) == {}


def pg_everything(url: str) -> dict[str, list[tuple[Any, ...]]]:
    tables = pg_query(url, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    return {name: pg_query(url, f'SELECT * FROM "{name}" ORDER BY 1') for (name,) in tables}


def test_a_target_that_holds_anything_is_refused_and_left_unchanged(
    source: Source, pg_url: str
) -> None:
    ok(copy_to(pg_url, "--db", str(source.db)))
    add_on(pg_url)
    before = pg_everything(pg_url)
    again = copy_to(pg_url, "--db", str(source.db))
    assert (again.exit_code, again.envelope["errors"][0]["code"]) == (5, "CONFLICT")
    assert "already holds" in again.envelope["errors"][0]["message"]
    assert pg_everything(pg_url) == before

    text = run_quiet("copy-to", pg_url, "--db", str(source.db), "--dry-run")
    assert text.exit_code == 5 and text.stderr.startswith("spoolctl: CONFLICT: ")
    assert pg_password(pg_url) not in text.stdout + text.stderr
    assert pg_everything(pg_url) == before


def test_a_database_of_another_program_is_refused(source: Source, pg_url: str) -> None:
    with psycopg.connect(libpq_url(pg_url)) as conn:
        conn.execute("CREATE TABLE invoices (id serial PRIMARY KEY, total numeric)")
    before = pg_everything(pg_url)
    refused = copy_to(pg_url, "--db", str(source.db))
    assert (refused.exit_code, refused.envelope["errors"][0]["code"]) == (5, "CONFLICT")
    assert pg_everything(pg_url) == before


def test_an_empty_queue_schema_is_filled_and_a_dry_run_writes_nothing(
    source: Source, pg_url: str
) -> None:
    dry = ok(copy_to(pg_url, "--db", str(source.db), "--dry-run"))
    assert dry["dry_run"] is True and dry["tables"]["jobs"] > 0
    assert pg_everything(pg_url) == {}, "a dry run leaves the database as it was: empty"
    ok(run_json("migrate", "--db", pg_url))
    done = ok(copy_to(pg_url, "--db", str(source.db)))
    assert (done["tables"], done["output"]) == (dry["tables"], dry["output"])
    assert_tables_equal(source.db, pg_url)


def test_a_failed_copy_leaves_the_target_empty(source: Source, pg_url: str, tmp_path: Path) -> None:
    """A row PostgreSQL refuses midway (text holding a NUL character, which
    SQLite stores and PostgreSQL cannot) rolls the whole copy back."""
    spool = Path(shutil.copytree(source.db.parent, tmp_path / "spool"))
    db = spool / "queue.db"
    job = add(db, "--", "true")
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("UPDATE jobs SET note = ? WHERE id = ?", ("a\x00b", job))
    conn.close()
    refused = copy_to(pg_url, "--db", str(db))
    error = refused.envelope["errors"][0]
    assert (refused.exit_code, error["code"]) == (1, "INVALID_INPUT"), refused.envelope
    assert "text" in error["message"]
    assert pg_everything(pg_url) == {}


def test_a_source_with_a_running_job_is_refused(
    source: Source, pg_url: str, tmp_path: Path
) -> None:
    spool = Path(shutil.copytree(source.db.parent, tmp_path / "spool"))
    db = spool / "queue.db"
    job = add(db, "--", "sleep", "60")
    conn = sqlite3.connect(db)  # what a worker's claim leaves; the refusal reads the state
    with conn:
        conn.execute("UPDATE jobs SET state = 'running', locked_by = 'w1' WHERE id = ?", (job,))
    conn.close()
    refused = copy_to(pg_url, "--db", str(db))
    error = refused.envelope["errors"][0]
    assert (refused.exit_code, error["code"]) == (5, "CONFLICT")
    assert "stop its workers" in error["message"] and error["detail"]["running_job_ids"] == [job]
    assert pg_everything(pg_url) == {}


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SPOOLCTL_DB", raising=False)
    yield tmp_path


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_sources_that_are_not_ready_are_refused_untouched(scratch: Path, pg_url: str) -> None:
    older = scratch / "older" / "queue.db"
    ok(run_json("migrate", "--db", str(older), "--to", "0003_lanes_and_dependencies"))
    (scratch / "legacy").mkdir()
    legacy = copy_fixture("v1-populated.db", scratch / "legacy")
    newer = scratch / "newer" / "queue.db"
    add(newer, "--", "true")
    foreign = scratch / "foreign" / "queue.db"
    foreign.parent.mkdir()
    for db, sql in (
        (newer, "UPDATE alembic_version SET version_num = '9999_newer'"),
        (foreign, "CREATE TABLE notes (body TEXT)"),
    ):
        conn = sqlite3.connect(db)
        with conn:
            conn.execute(sql)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
    for db, code in (
        (older, "SCHEMA_OUTDATED"),
        (legacy, "SCHEMA_OUTDATED"),
        (newer, "SCHEMA_TOO_NEW"),
        (foreign, "DB_UNUSABLE"),
    ):
        before = folder_bytes(db.parent)
        refused = copy_to(pg_url, "--db", str(db))
        error = refused.envelope["errors"][0]
        assert (refused.exit_code, error["code"]) == (3, code), (db, error)
        assert folder_bytes(db.parent) == before, db
        if code == "SCHEMA_OUTDATED":
            assert "spoolctl migrate --db" in error["message"]
    missing = copy_to(pg_url, "--db", str(scratch / "nothing" / "queue.db"))
    assert (missing.exit_code, missing.envelope["errors"][0]["code"]) == (1, "INVALID_INPUT")
    assert not (scratch / "nothing").exists()
    from_pg = copy_to(pg_url, "--db", pg_url)
    assert (from_pg.exit_code, from_pg.envelope["errors"][0]["code"]) == (1, "INVALID_INPUT")
    assert pg_everything(pg_url) == {}


def test_only_a_postgresql_url_is_a_target(source: Source, scratch: Path) -> None:
    secret = "s3cr3t-pw"
    for target in (
        f"mysql://user:{secret}@localhost/queue",
        f"sqlite:///{scratch}/other.db",
        str(scratch / "other.db"),
        "",
    ):
        result = run_quiet("copy-to", "--json", target, "--db", str(source.db))
        assert (result.exit_code, result.envelope["errors"][0]["code"]) == (1, "INVALID_INPUT")
        assert secret not in result.stdout + result.stderr
    assert not (scratch / "other.db").exists()
    missing = run_quiet("copy-to", "--json", "--db", str(source.db))
    assert (missing.exit_code, missing.envelope["errors"][0]["code"]) == (1, "MISSING_REQUIRED")


def test_an_unreachable_server_or_a_refused_login_never_shows_the_password(
    source: Source, pg_url: str
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    closed = make_url(pg_url).set(port=port).render_as_string(hide_password=False)
    wrong = make_url(pg_url).set(password="wr0ng-pw").render_as_string(hide_password=False)
    for url, secret, code in (
        (closed, pg_password(pg_url), "UNREACHABLE"),
        (wrong, "wr0ng-pw", "DB_UNUSABLE"),
    ):
        for as_json in (True, False):
            args = ["copy-to", *(["--json"] if as_json else []), url, "--db", str(source.db)]
            result = run_quiet(*args)
            assert code in result.stdout + result.stderr, result.stdout + result.stderr
            assert result.exit_code == (4 if code == "UNREACHABLE" else 3)
            assert secret not in result.stdout + result.stderr
            assert "***" in result.stdout + result.stderr
    assert pg_everything(pg_url) == {}
