"""`spoolctl migrate` on PostgreSQL, against a real server (tests/pg_fixtures.py).

The revision chain SQLite runs, run in place: every step keeps every row and
id, sequences continue past the highest id ever handed out, the migrated
schema matches the models, the idempotency-key index stays partial. A change
runs in one transaction under an advisory lock: racing runs upgrade once, a
failure anywhere leaves the database exactly as it was. Every run's output is
checked for the password. The fixtures pg_url and pg_databases come from
tests/pg_fixtures.py (registered in tests/conftest.py).
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

from spoolctl.db.backends.postgresql import MIGRATE_LOCK_KEY
from spoolctl.db.revision import DELETE_STORED_OUTPUT_FLAG, HEAD_REVISION, KNOWN_REVISIONS
from spoolctl.db.tables import metadata
from spoolctl.db.url import masked
from tests.helpers import Result, child_env, inproc, wait_for
from tests.pg_server import libpq_url
from tests.unit.test_migrations import ATTEMPTS_0005, JOBS_0005, WORKERS_0001

FIRST = KNOWN_REVISIONS[0]
CATALOG = {
    "columns": "SELECT table_name, column_name, data_type, character_maximum_length, "
    "is_nullable, column_default FROM information_schema.columns "
    "WHERE table_schema = 'public' ORDER BY 1, 2",
    "constraints": "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) "
    "FROM pg_constraint WHERE connamespace = 'public'::regnamespace ORDER BY 1, 2",
    "indexes": "SELECT tablename, indexname, indexdef FROM pg_indexes "
    "WHERE schemaname = 'public' ORDER BY 1, 2",
    "triggers": "SELECT tgrelid::regclass::text, tgname FROM pg_trigger "
    "WHERE NOT tgisinternal ORDER BY 1, 2",
    "sequences": "SELECT sequencename, last_value FROM pg_sequences "
    "WHERE schemaname = 'public' ORDER BY 1",
}


@contextmanager
def connect(url: str) -> Iterator[psycopg.Connection[Any]]:
    """A plain connection of the test's own; commits on a clean exit."""
    with psycopg.connect(libpq_url(url), connect_timeout=10) as conn:
        yield conn


def query(url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with connect(url) as conn:
        return conn.execute(sql, params).fetchall()


def execute(url: str, *statements: str) -> None:
    with connect(url) as conn:
        for statement in statements:
            conn.execute(statement)


def run(capsys: pytest.CaptureFixture[str], url: str, *args: str, json: bool = True) -> Result:
    """`spoolctl migrate --db URL [--json] ARGS` in this process; its output
    never holds the password and names the database masked."""
    result = inproc("migrate", "--db", url, *(["--json"] if json else []), *args, capsys=capsys)
    assert_no_password(url, result.stdout + result.stderr)
    if json and result.exit_code == 0 and "db_path" in result.data:
        assert result.data["db_path"] == masked(url)
    return result


def assert_no_password(url: str, output: str) -> None:
    password = make_url(url).password
    assert password, "the test server's URL has a password"
    assert str(password) not in output


def error(result: Result) -> dict[str, Any]:
    assert result.envelope["ok"] is False, result.stdout
    return result.envelope["errors"][0]  # type: ignore[no-any-return]


def revision_of(url: str) -> str | None:
    if query(url, "SELECT to_regclass('alembic_version')")[0][0] is None:
        return None
    return str(query(url, "SELECT version_num FROM alembic_version")[0][0])


def tables(url: str) -> list[str]:
    found = query(
        url,
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' ORDER BY 1",
    )
    return [r[0] for r in found]


EVERY_REVISIONS_COLUMNS = {
    "job_events": "id, job_id, at, event, worker_id, detail",
    "jobs": JOBS_0005,
    "attempts": ATTEMPTS_0005,
    "workers": WORKERS_0001,
}
"""Columns compared across revisions where a later one adds some (0005's
job_events.seq, which starts equal to the id: `positions`; 0007's
cgroup, usage and limit columns and 0008's workers.pid_space start null)."""


def contents(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every spoolctl table, ordered by its leading columns."""
    return {
        table: sorted(
            query(url, f'SELECT {compared_columns(url, table)} FROM "{table}"'),
            key=lambda r: (r[0], repr(r)),
        )
        for table in tables(url)
        if table != "alembic_version"
    }


def compared_columns(url: str, table: str) -> str:
    """EVERY_REVISIONS_COLUMNS' list for a spoolctl table; every column of a
    table that merely shares its name (a database that is not a queue)."""
    listed = EVERY_REVISIONS_COLUMNS.get(table)
    if listed is None:
        return "*"
    present = {
        r[0]
        for r in query(
            url, f"SELECT column_name FROM information_schema.columns WHERE table_name = '{table}'"
        )
    }
    return listed if all(c.strip() in present for c in listed.split(",")) else "*"


def positions(url: str) -> list[tuple[Any, ...]]:
    """(id, seq) of every event: at 0005 each event present then has seq = id."""
    return query(url, "SELECT id, seq FROM job_events ORDER BY id")


def catalog(url: str) -> dict[str, list[tuple[Any, ...]]]:
    return {name: query(url, sql) for name, sql in CATALOG.items()}


def snapshot(url: str) -> dict[str, Any]:
    """Everything a failed or refused migration must leave as it was."""
    return {"revision": revision_of(url), "rows": contents(url), **catalog(url)}


JOB_STATES = ("queued", "done", "dead", "canceled", "running", "done")


def populate(url: str) -> None:
    """At 0001: jobs (ids from the sequence) in several states with attempts,
    events and a worker; the newest job is then deleted, as prune does."""
    with connect(url) as conn:
        for n, state in enumerate(JOB_STATES, 1):
            row = conn.execute(
                "INSERT INTO jobs (argv, state, queue, priority, next_run_at, created_at, "
                "started_at, finished_at, attempts, crashes, max_crashes, idempotency_key, "
                "tags, env, note, cwd, locked_by, locked_pid, heartbeat_at, last_exit_code, "
                "last_error, last_failure_reason) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, "
                "%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING id",
                (
                    f'["echo","{n}"]',
                    state,
                    f"q{n % 2}",
                    n - 3,
                    10.5 + n,
                    1.25 + n,
                    2.5 + n,
                    3.5 + n,
                    n,
                    n // 2,
                    n if n % 2 else None,
                    f"key-{n}" if n % 3 else None,
                    '{"t":"v"}',
                    '{"K":"V"}',
                    f"note {n}",
                    "/tmp",
                    "w" if state == "running" else None,
                    42 if state == "running" else None,
                    2.75 + n,
                    n - 1,
                    f"error {n}",
                    "process_exit" if state == "dead" else None,
                ),
            ).fetchone()
            assert row is not None and row[0] == n
            conn.execute(
                "INSERT INTO attempts (job_id, attempt_no, worker_id, worker_pid, state, "
                "started_at, finished_at, exit_code, failure_reason, stdout_path, stderr_path, "
                "job_pid, job_pgid, job_started_at) "
                "VALUES (%s, 1, 'w', 42, 'failed', 2.5, 3.5, 1, 'process_exit', %s, %s, 7, 7, 2.5)",
                (n, f"/s/output/{n}/1/stdout", f"/s/output/{n}/1/stderr"),
            )
            for event in ("added", "claimed", "failed"):
                conn.execute(
                    "INSERT INTO job_events (job_id, at, event, worker_id, detail) "
                    "VALUES (%s, %s, %s, 'w', %s)",
                    (n, 1.5 + n, event, f'{{"n":{n}}}'),
                )
        conn.execute(
            "INSERT INTO workers (id, hostname, pid, process_started_at, boot_id, queue, slots, "
            "concurrency, started_at, heartbeat_at, stopped_at, state, jobs_run) "
            "VALUES ('w', 'h', 42, 1.5, 'boot', 'q0', 2, 3, 1, 2, 3, 'stopped', 9)"
        )
        last = len(JOB_STATES)
        for table in ("job_events", "attempts"):
            conn.execute(f"DELETE FROM {table} WHERE job_id = {last}")
        conn.execute(f"DELETE FROM jobs WHERE id = {last}")


def new_job(url: str, state: str = "queued", key: str | None = None) -> int:
    row = query(
        url,
        "INSERT INTO jobs (argv, state, next_run_at, created_at, idempotency_key) "
        "VALUES ('[\"x\"]', %s, 1, 1, %s) RETURNING id",
        (state, key),
    )
    return int(row[0][0])


def test_migrate_creates_the_schema_in_an_empty_database_at_head(
    pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    result = run(capsys, pg_url)
    assert result.exit_code == 0, result.stdout
    data = result.data
    assert (data["from_revision"], data["to_revision"]) == (None, HEAD_REVISION)
    assert data["applied"] == list(KNOWN_REVISIONS)
    assert (data["backup_path"], data["legacy_adopted"], data["direction"]) == (
        None,
        False,
        "upgrade",
    )
    assert data["db_path"] == masked(pg_url) and "***" in data["db_path"]
    assert revision_of(pg_url) == HEAD_REVISION
    assert {"jobs", "attempts", "workers", "job_events", "lanes"} <= set(tables(pg_url))
    again = run(capsys, pg_url, json=False)
    assert again.stdout.strip() == f"{masked(pg_url)} is already at {HEAD_REVISION}: nothing to do"


def test_every_step_keeps_every_row_and_id_and_sequences_continue(
    pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(capsys, pg_url, "--to", FIRST).data["applied"] == [FIRST]
    populate(pg_url)
    highest = len(JOB_STATES)  # the deleted job's id was handed out once
    for previous, rev in itertools.pairwise(KNOWN_REVISIONS):
        before = contents(pg_url)
        data = run(capsys, pg_url, "--to", rev).data
        assert (data["from_revision"], data["to_revision"], data["applied"]) == (
            previous,
            rev,
            [rev],
        )
        assert revision_of(pg_url) == rev
        after = contents(pg_url)
        for table, rows in before.items():
            assert len(after[table]) == len(rows), table
            for old_row, new_row in zip(rows, after[table], strict=True):
                assert new_row == old_row, (rev, table)
        assert all(not after[t] for t in set(after) - set(before)), "new tables start empty"
        if rev == "0005_ledger_positions":
            assert positions(pg_url) == [(r[0], r[0]) for r in after["job_events"]]
        fresh = new_job(pg_url)
        assert fresh == highest + 1, f"after {rev} a new job must get the next unused id"
        highest = fresh


def test_downgrade_needs_yes_and_round_trips_every_row(
    pg_url: str, pg_databases: Callable[[], str], capsys: pytest.CaptureFixture[str]
) -> None:
    run(capsys, pg_url, "--to", FIRST)
    populate(pg_url)
    run(capsys, pg_url)
    before = snapshot(pg_url)
    refused = run(capsys, pg_url, "--downgrade", FIRST)
    assert refused.exit_code == 2 and error(refused)["code"] == "SAFETY_BLOCK"
    assert masked(pg_url) in error(refused)["message"]
    assert snapshot(pg_url) == before

    down = run(capsys, pg_url, "--downgrade", FIRST, "--yes").data
    assert down["applied"] == list(reversed(KNOWN_REVISIONS[1:]))
    assert (down["to_revision"], down["direction"], down["backup_path"]) == (
        FIRST,
        "downgrade",
        None,
    )
    assert contents(pg_url) == {t: before["rows"][t] for t in contents(pg_url)}
    assert_shaped_like_a_fresh(FIRST, pg_url, pg_databases(), capsys)

    up = run(capsys, pg_url).data
    assert up["applied"] == list(KNOWN_REVISIONS[1:])
    assert contents(pg_url) == before["rows"]
    assert model_differences(pg_url) == []
    assert new_job(pg_url) == len(JOB_STATES) + 1


def assert_shaped_like_a_fresh(
    rev: str, url: str, fresh: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The downgraded schema is the one `--to rev` builds, but for one documented
    difference: job_events.event keeps the 32 characters 0003 gave it."""
    run(capsys, fresh, "--to", rev)
    found, expected = catalog(url), catalog(fresh)
    for name in ("constraints", "indexes", "triggers"):
        assert found[name] == expected[name], name
    assert [s[0] for s in found["sequences"]] == [s[0] for s in expected["sequences"]]
    widened = [c for c in found["columns"] if c not in expected["columns"]]
    assert [c[:4] for c in widened] == [("job_events", "event", "character varying", 32)]


def model_differences(url: str) -> list[Any]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn, opts={"compare_type": True, "compare_server_default": True}
            )
            return list(compare_metadata(context, metadata))
    finally:
        engine.dispose()


def shape(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """The schema as the catalog states it, alembic's own table and the
    0004 notification trigger (which no model describes) left out."""
    found = catalog(url)
    return {
        "columns": [c for c in found["columns"] if c[0] != "alembic_version"],
        "constraints": [c for c in found["constraints"] if c[0] != "alembic_version"],
        "indexes": [i for i in found["indexes"] if i[0] != "alembic_version"],
        "sequences": [s[:1] for s in found["sequences"]],
    }


def test_the_migrated_schema_matches_the_models(
    pg_databases: Callable[[], str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Stricter than autogenerate (which compares no CHECK and no index
    predicate): the catalog of the migrated database equals that of one
    built by `metadata.create_all`."""
    migrated = pg_databases()
    run(capsys, migrated)
    assert model_differences(migrated) == []
    modeled = pg_databases()
    engine = create_engine(modeled)
    metadata.create_all(engine)
    engine.dispose()
    assert shape(migrated) == shape(modeled)
    (definition,) = [i[2] for i in shape(migrated)["indexes"] if i[1] == "uq_jobs_active_key"]
    assert "WHERE ((idempotency_key IS NOT NULL)" in definition and "'waiting'" in definition


@pytest.mark.parametrize("rev", [FIRST, HEAD_REVISION])
def test_a_finished_jobs_key_is_reusable_an_active_one_is_not(
    pg_url: str, capsys: pytest.CaptureFixture[str], rev: str
) -> None:
    run(capsys, pg_url, "--to", rev)
    new_job(pg_url, "done", "k")
    new_job(pg_url, "dead", "k")
    new_job(pg_url, "queued", "k")
    with pytest.raises(psycopg.errors.UniqueViolation):
        new_job(pg_url, "running", "k")
    if rev == HEAD_REVISION:
        with pytest.raises(psycopg.errors.UniqueViolation):
            new_job(pg_url, "waiting", "k")
    assert [r[0] for r in query(pg_url, "SELECT state FROM jobs ORDER BY id")] == [
        "done",
        "dead",
        "queued",
    ]


def test_status_history_and_sql_change_nothing(
    pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = run(capsys, pg_url, "--status").data
    assert (empty["exists"], empty["current"], empty["pending"]) == (
        False,
        None,
        list(KNOWN_REVISIONS),
    )
    create = run(capsys, pg_url, "--sql").data["sql"]
    for fragment in ("BEGIN;", "CREATE TABLE jobs", "id SERIAL NOT NULL", "COMMIT;"):
        assert fragment in create
    assert "WHERE idempotency_key IS NOT NULL AND state IN ('queued', 'running')" in create
    assert tables(pg_url) == [], "--sql creates nothing"

    run(capsys, pg_url, "--to", KNOWN_REVISIONS[1])
    before = snapshot(pg_url)
    status = run(capsys, pg_url, "--status").data
    assert status == {
        "db_path": masked(pg_url),
        "exists": True,
        "current": KNOWN_REVISIONS[1],
        "head": HEAD_REVISION,
        "pending": list(KNOWN_REVISIONS[2:]),
        "legacy_detected": False,
        "legacy_schema_version": None,
        "up_to_date": False,
    }
    history = run(capsys, pg_url, "--history").data
    assert [r["revision"] for r in history["revisions"]] == list(KNOWN_REVISIONS)
    assert [r["is_current"] for r in history["revisions"]] == [
        r == KNOWN_REVISIONS[1] for r in KNOWN_REVISIONS
    ]
    assert_postgres_sql(run(capsys, pg_url, "--sql").data["sql"])
    down = run(capsys, pg_url, "--sql", "--downgrade", FIRST).data["sql"]
    assert "ALTER TABLE jobs DROP CONSTRAINT ck_jobs_state;" in down
    assert "DROP INDEX ix_jobs_state_id;" in down
    text = run(capsys, pg_url, "--status", json=False).stdout
    assert f"database: {masked(pg_url)}" in text
    assert snapshot(pg_url) == before


def assert_postgres_sql(sql: str) -> None:
    """0002 -> head as PostgreSQL runs it: in place, in one transaction."""
    for fragment in (
        "BEGIN;",
        "ALTER TABLE jobs DROP CONSTRAINT ck_jobs_state;",
        "ALTER TABLE job_events ALTER COLUMN job_id DROP NOT NULL;",
        "ALTER TABLE job_events ALTER COLUMN event TYPE VARCHAR(32);",
        "CREATE UNIQUE INDEX uq_jobs_active_key ON jobs (idempotency_key) WHERE "
        "idempotency_key IS NOT NULL AND state IN ('queued', 'running', 'waiting');",
        f"UPDATE alembic_version SET version_num='{HEAD_REVISION}'",
        "COMMIT;",
    ):
        assert fragment in sql
    for sqlite_only in ("sqlite_sequence", "_alembic_tmp", "DROP TABLE jobs", "PRAGMA"):
        assert sqlite_only not in sql


def waiting_for_the_lock(url: str) -> int:
    found = query(
        url,
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
        "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    return int(found[0][0])


@pytest.mark.subprocess
def test_two_racing_migrates_upgrade_once(pg_url: str) -> None:
    """Both runs are started while the migration lock is held, so both wait
    for it: the first to get it upgrades, the second then finds nothing to do."""
    with connect(pg_url) as holder:
        holder.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATE_LOCK_KEY,))
        runs = [
            subprocess.Popen(
                [sys.executable, "-m", "spoolctl", "migrate", "--db", pg_url, "--json"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=child_env(),
                stdin=subprocess.DEVNULL,
            )
            for _ in range(2)
        ]
        try:
            wait_for(lambda: waiting_for_the_lock(pg_url) == 2, timeout=60, what="both waiting")
        finally:
            holder.rollback()
    outputs = [proc.communicate(timeout=120) for proc in runs]
    for proc, (out, err) in zip(runs, outputs, strict=True):
        assert proc.returncode == 0, (out, err)
        assert_no_password(pg_url, out + err)
    applied = sorted(json.loads(out)["data"]["applied"] for out, _ in outputs)
    assert applied == [[], list(KNOWN_REVISIONS)]
    assert revision_of(pg_url) == HEAD_REVISION


def test_an_upgrade_failing_midway_leaves_the_database_as_it_was(
    pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stray `lanes` table makes 0003 fail after 0002 ran: 0002 is undone too."""
    run(capsys, pg_url, "--to", FIRST)
    populate(pg_url)
    execute(pg_url, "CREATE TABLE lanes (stray INTEGER)", "INSERT INTO lanes VALUES (1)")
    before = snapshot(pg_url)
    failed = run(capsys, pg_url)
    assert failed.exit_code == 3, failed.stdout
    assert '"lanes" already exists' in error(failed)["message"]
    assert snapshot(pg_url) == before


def test_a_refused_downgrade_leaves_the_database_as_it_was(
    pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """0004's downgrade (dropping output_chunks and the trigger, as told to)
    runs before 0003's refuses a paused lane: the table, its rows and the
    trigger stay."""
    run(capsys, pg_url, "--to", FIRST)
    populate(pg_url)
    run(capsys, pg_url)
    execute(
        pg_url,
        "INSERT INTO lanes (queue, paused_at, paused_by) VALUES ('q0', 1, 'me')",
        'INSERT INTO output_chunks (attempt_id, stream, "offset", data) '
        "VALUES (1, 'stdout', 0, 'hello')",
    )
    before = snapshot(pg_url)
    refused = run(
        capsys, pg_url, "--downgrade", KNOWN_REVISIONS[1], "--yes", DELETE_STORED_OUTPUT_FLAG
    )
    assert refused.exit_code == 5 and error(refused)["code"] == "CONFLICT"
    assert "paused lanes q0" in error(refused)["message"]
    assert snapshot(pg_url) == before
    assert before["rows"]["output_chunks"] and before["triggers"]


STORED = (
    (1, "stdout", 0, b"hello"),
    (1, "stdout", 5, b" world"),
    (1, "stderr", 0, b""),
    (2, "stdout", 0, b"abc"),
)
"""Stored output of two attempts, 14 bytes (an empty stream is one empty chunk)."""


def store_output(url: str) -> None:
    with connect(url) as conn:
        for row in STORED:
            conn.execute(
                'INSERT INTO output_chunks (attempt_id, stream, "offset", data) '
                "VALUES (%s, %s, %s, %s)",
                row,
            )


BELOW_OUTPUT_CHUNKS = KNOWN_REVISIONS[: KNOWN_REVISIONS.index("0004_output_chunks")]


@pytest.mark.parametrize("target", BELOW_OUTPUT_CHUNKS)
def test_a_downgrade_that_would_drop_stored_output_is_refused(
    pg_url: str, capsys: pytest.CaptureFixture[str], target: str
) -> None:
    """Below 0004 output_chunks goes, and with it the only copy of the output
    other machines can read: refused, naming how much and the flag, with the
    queue exactly as it was; the flag deletes it."""
    run(capsys, pg_url, "--to", FIRST)
    populate(pg_url)
    run(capsys, pg_url)
    store_output(pg_url)
    before = snapshot(pg_url)
    refused = run(capsys, pg_url, "--downgrade", target, "--yes")
    assert refused.exit_code == 2, refused.stdout
    found = error(refused)
    assert found["code"] == "SAFETY_BLOCK"
    assert found["detail"] == {"attempts": 2, "bytes": 14, "flag": DELETE_STORED_OUTPUT_FLAG}
    command = f"spoolctl migrate --downgrade {target} --yes {DELETE_STORED_OUTPUT_FLAG}"
    for part in ("2 attempt(s)", "14 bytes", "nothing was changed", command):
        assert part in found["message"]
    assert snapshot(pg_url) == before
    text = run(capsys, pg_url, "--downgrade", target, "--yes", json=False)
    assert text.exit_code == 2 and "SAFETY_BLOCK" in text.stderr
    assert DELETE_STORED_OUTPUT_FLAG in text.stderr
    assert snapshot(pg_url) == before

    down = run(capsys, pg_url, "--downgrade", target, "--yes", DELETE_STORED_OUTPUT_FLAG)
    assert down.exit_code == 0, down.stdout
    assert down.data["to_revision"] == target == revision_of(pg_url)
    assert "output_chunks" not in tables(pg_url)
    kept = contents(pg_url)
    assert kept == {t: before["rows"][t] for t in kept}, "only the stored output went"
    run(capsys, pg_url)
    assert contents(pg_url)["output_chunks"] == []


def test_the_sql_of_such_a_downgrade_aborts_while_output_is_stored(
    pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`migrate --sql` checks no data itself, but the script it prints refuses
    in its turn: run while output is stored it aborts, changing nothing; with
    the flag it goes ahead."""
    run(capsys, pg_url, "--to", FIRST)
    populate(pg_url)
    run(capsys, pg_url)
    store_output(pg_url)
    before = snapshot(pg_url)
    guarded = run(capsys, pg_url, "--sql", "--downgrade", KNOWN_REVISIONS[2]).data["sql"]
    assert "RAISE EXCEPTION" in guarded
    assert f"--sql --downgrade {KNOWN_REVISIONS[2]} {DELETE_STORED_OUTPUT_FLAG}" in guarded
    with (
        psycopg.connect(libpq_url(pg_url), autocommit=True) as conn,
        pytest.raises(psycopg.errors.RaiseException, match=r"2 attempt\(s\) \(14 bytes"),
    ):
        conn.execute(guarded.encode())
    assert snapshot(pg_url) == before

    unguarded = run(
        capsys, pg_url, "--sql", "--downgrade", KNOWN_REVISIONS[2], DELETE_STORED_OUTPUT_FLAG
    ).data["sql"]
    assert "RAISE EXCEPTION" not in unguarded and "DROP TABLE output_chunks;" in unguarded
    assert snapshot(pg_url) == before, "--sql changes nothing"
    with psycopg.connect(libpq_url(pg_url), autocommit=True) as conn:
        conn.execute(unguarded.encode())
    assert revision_of(pg_url) == KNOWN_REVISIONS[2]
    assert "output_chunks" not in tables(pg_url)


def test_without_stored_output_a_downgrade_needs_no_flag(
    pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run(capsys, pg_url)
    new_job(pg_url)
    down = run(capsys, pg_url, "--downgrade", KNOWN_REVISIONS[2], "--yes")
    assert down.exit_code == 0 and revision_of(pg_url) == KNOWN_REVISIONS[2]


@pytest.mark.parametrize(
    "args",
    [(), ("--to", FIRST), ("--status",), ("--history",), ("--sql",), ("--yes",)],
    ids=["upgrade", "to", "status", "history", "sql", "yes"],
)
def test_the_flag_without_a_downgrade_is_invalid_input(
    pg_url: str, capsys: pytest.CaptureFixture[str], args: tuple[str, ...]
) -> None:
    refused = run(capsys, pg_url, *args, DELETE_STORED_OUTPUT_FLAG)
    assert refused.exit_code == 1 and error(refused)["code"] == "INVALID_INPUT"
    assert DELETE_STORED_OUTPUT_FLAG in error(refused)["message"]
    assert tables(pg_url) == [], "nothing was created"


def test_the_flag_is_published_from_its_click_definition(
    capsys: pytest.CaptureFixture[str],
) -> None:
    published = inproc("capabilities", "--json", capsys=capsys).data["verbs"]["migrate"]
    assert DELETE_STORED_OUTPUT_FLAG in [f["name"] for f in published["flags"]]
    assert ["--to", DELETE_STORED_OUTPUT_FLAG] in published["exclusive"]


@pytest.mark.parametrize(
    "statements",
    [
        ("CREATE TABLE stuff (x INTEGER)", "INSERT INTO stuff VALUES (1)"),
        (
            "CREATE TABLE meta (key TEXT, value TEXT)",
            "INSERT INTO meta VALUES ('schema_version', '6')",
            "CREATE TABLE jobs (id INTEGER)",
        ),
    ],
    ids=["other_tables", "legacy_table_names"],
)
def test_a_database_that_is_not_a_queue_is_refused_and_left_alone(
    pg_url: str, capsys: pytest.CaptureFixture[str], statements: tuple[str, ...]
) -> None:
    """The original spoolctl never wrote PostgreSQL: even its table names there
    are just foreign tables."""
    execute(pg_url, *statements)
    before = snapshot(pg_url)
    status = run(capsys, pg_url, "--status").data
    assert (status["current"], status["legacy_detected"]) == (None, False)
    for args in ((), ("--sql",), ("--to", FIRST)):
        refused = run(capsys, pg_url, *args)
        assert refused.exit_code == 3, args
        assert "a PostgreSQL database but not a spoolctl queue" in error(refused)["message"]
    assert snapshot(pg_url) == before
