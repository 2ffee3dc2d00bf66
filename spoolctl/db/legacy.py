"""Adopting databases of the original standard-library spoolctl (schema_version 1-6).

Such a file has a `meta` table holding `schema_version` and no
`alembic_version`. Adoption happens in place, inside the caller's write
transaction (foreign keys off), in three steps the caller interleaves with
alembic:

1. `detach_statements`: the legacy tables are renamed `legacy_*`;
2. the caller creates the revision `ADOPTION_REVISION` schema;
3. `fill_statements`: every row is copied with its id, the AUTOINCREMENT
   high-water marks are carried over (the next job id is the one the original
   would have given), output paths of a moved spool folder are relocated, and
   the legacy tables and `meta` are dropped.

The steps are plain SQL, so `spoolctl migrate --sql` prints exactly what an
adoption runs. Mapping, for columns an old version lacks: queue `default`,
priority 0, crashes 0, tags and env `{}`; an attempt's failure_reason is
derived from its state (failed -> unknown, timed_out -> timeout, canceled ->
canceled, abandoned -> worker_crash); a job's last_failure_reason is its latest
attempt's. JSON texts are minified; event details (free text in the original)
become JSON strings. Odd rows are adopted as they are, never "fixed".

Except one kind: a row whose value no spoolctl state machine can hold (a job
state outside the original vocabulary, a negative or non-integer count, an
unknown attempt state or failure reason) would abort the whole adoption at the
first CHECK of a later revision. Such a row is quarantined instead: a job
becomes `dead` (finished now if it had not finished), the offending counts take
their column defaults, its running attempts end `abandoned`, and last_error
says what was wrong and what the row held (its former last_error included); an
attempt is ended `abandoned` with the same kind of note in `error`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Connection

from spoolctl import layout

ADOPTION_REVISION = "0001_initial"
"""The revision whose layout the legacy rows are copied into; later revisions
then run as for any other database."""

LEGACY_VERSIONS = range(1, 7)
"""schema_version values the original spoolctl wrote (0.4.11 wrote 6)."""
LEGACY_TABLES = ("jobs", "attempts", "job_events")

JOB_DEFAULTS = {
    "queue": "'default'",
    "priority": "0",
    "crashes": "0",
    "tags": "'{}'",
    "env": "'{}'",
}
RENAMED = {"argv": "argv_json", "tags": "tags_json", "env": "env_json"}
JSON_TEXT = ("argv", "tags", "env")
JOB_COLUMNS = (
    "id",
    "argv",
    "state",
    "queue",
    "priority",
    "next_run_at",
    "created_at",
    "started_at",
    "finished_at",
    "attempts",
    "crashes",
    "max_retries",
    "max_crashes",
    "timeout_seconds",
    "idempotency_key",
    "tags",
    "note",
    "cwd",
    "env",
    "locked_by",
    "locked_pid",
    "locked_at",
    "heartbeat_at",
    "last_exit_code",
    "last_error",
)
ATTEMPT_COLUMNS = (
    "id",
    "job_id",
    "attempt_no",
    "worker_id",
    "worker_pid",
    "state",
    "started_at",
    "finished_at",
    "exit_code",
    "error",
    "stdout_path",
    "stderr_path",
)
LEGACY_JOB_STATES = ("queued", "running", "done", "failed", "dead", "canceled")
LEGACY_ATTEMPT_STATES = ("running", "succeeded", "failed", "timed_out", "abandoned", "canceled")
LEGACY_FAILURE_REASONS = (
    "process_exit",
    "timeout",
    "spawn_failed",
    "worker_crash",
    "canceled",
    "unknown",
)
COUNT_DEFAULTS = {
    "attempts": "0",
    "crashes": "0",
    "max_retries": "3",
    "max_crashes": "NULL",
    "timeout_seconds": "300",
}
"""Counts a quarantined job falls back to; max_crashes may also be NULL."""
QUARANTINE_NOTE = "quarantined on adoption: "
NOW_EPOCH_SQL = "((julianday('now') - 2440587.5) * 86400.0)"
DERIVED_FAILURE_REASON = (
    "CASE state WHEN 'failed' THEN 'unknown' WHEN 'timed_out' THEN 'timeout' "
    "WHEN 'canceled' THEN 'canceled' WHEN 'abandoned' THEN 'worker_crash' END"
)


@dataclass(frozen=True)
class Layout:
    """What one legacy file holds: its version and the columns its tables have."""

    schema_version: int
    job_columns: frozenset[str]
    attempt_columns: frozenset[str]


@dataclass(frozen=True)
class Relocation:
    attempt_id: int
    column: str
    path: str


def read_layout(conn: Connection, schema_version: int) -> Layout:
    return Layout(
        schema_version=schema_version,
        job_columns=_columns(conn, "jobs"),
        attempt_columns=_columns(conn, "attempts"),
    )


def _columns(conn: Connection, table: str) -> frozenset[str]:
    return frozenset(row[1] for row in conn.exec_driver_sql(f"PRAGMA table_info({table})"))


def detach_statements() -> list[str]:
    """Move the legacy tables (and their indexes) out of the way."""
    return [f"ALTER TABLE {t} RENAME TO legacy_{t}" for t in LEGACY_TABLES]


def fill_statements(layout: Layout, relocations: list[Relocation]) -> list[str]:
    """Copy every row into the new tables, then drop the legacy ones."""
    return [
        _copy_jobs(layout),
        _copy_attempts(layout),
        _end_attempts_of_quarantined_jobs(layout),
        "INSERT INTO job_events (id, job_id, at, event, worker_id, detail) "
        "SELECT id, job_id, at, event, worker_id, "
        "CASE WHEN detail IS NULL THEN NULL ELSE json_quote(detail) END FROM legacy_job_events",
        "UPDATE jobs SET last_failure_reason = (SELECT a.failure_reason FROM attempts a "
        "WHERE a.job_id = jobs.id ORDER BY a.attempt_no DESC LIMIT 1)",
        *_carry_sequences(),
        *(_relocate(r) for r in relocations),
        *(f"DROP TABLE legacy_{t}" for t in reversed(LEGACY_TABLES)),
        "DROP TABLE meta",
    ]


def _copy_jobs(layout: Layout) -> str:
    exprs = [_quarantined_job_expr(column, layout.job_columns) for column in JOB_COLUMNS]
    return (
        f"INSERT INTO jobs ({', '.join(JOB_COLUMNS)}) "
        f"SELECT {', '.join(exprs)} FROM "
        f"(SELECT *, {job_problems(layout)} AS spoolctl_problem FROM legacy_jobs) ORDER BY id"
    )


def _quarantined_job_expr(column: str, present: frozenset[str]) -> str:
    """The adopted value: as held, or the quarantine's when the row is odd."""
    held = _job_expr(column, present)
    odd = "spoolctl_problem IS NOT NULL"
    if column == "state":
        return f"CASE WHEN {odd} THEN 'dead' ELSE {held} END"
    if column == "finished_at":
        return f"CASE WHEN {odd} THEN COALESCE({held}, {NOW_EPOCH_SQL}) ELSE {held} END"
    if column == "last_error":
        note = f"'{QUARANTINE_NOTE}' || spoolctl_problem"
        former = f"CASE WHEN {held} IS NULL THEN '' ELSE '; last_error was ' || quote({held}) END"
        return f"CASE WHEN {odd} THEN {note} || {former} ELSE {held} END"
    if column in COUNT_DEFAULTS and column in present:
        bad = _bad_count(column)
        return f"CASE WHEN {odd} AND {bad} THEN {COUNT_DEFAULTS[column]} ELSE {held} END"
    return held


def _bad_count(column: str) -> str:
    allowed = "('integer', 'null')" if column == "max_crashes" else "('integer')"
    return f"(typeof({column}) NOT IN {allowed} OR {column} < 0)"


def job_problems(layout: Layout) -> str:
    """SQL over a legacy jobs row: what is wrong with it and what it held, or NULL."""
    checks = [
        (
            f"state IS NULL OR state NOT IN {_listed(LEGACY_JOB_STATES)}",
            "'state ' || quote(state) || ' is not a job state'",
        ),
        *(
            (_bad_count(c), f"'{c} ' || quote({c}) || ' is not a count'")
            for c in COUNT_DEFAULTS
            if c in layout.job_columns
        ),
    ]
    return _problems(checks)


def attempt_problems(layout: Layout) -> str:
    """SQL over a legacy attempts row: what is wrong with it, or NULL."""
    checks = [
        (
            f"state IS NULL OR state NOT IN {_listed(LEGACY_ATTEMPT_STATES)}",
            "'state ' || quote(state) || ' is not an attempt state'",
        ),
    ]
    if "failure_reason" in layout.attempt_columns:
        checks.append(
            (
                f"failure_reason NOT IN {_listed(LEGACY_FAILURE_REASONS)}",
                "'failure_reason ' || quote(failure_reason) || ' is not a failure reason'",
            )
        )
    return _problems(checks)


def _problems(checks: list[tuple[str, str]]) -> str:
    parts = " || ".join(
        f"CASE WHEN {cond} THEN {text} || '; ' ELSE '' END" for cond, text in checks
    )
    return f"NULLIF(rtrim({parts}, '; '), '')"


def _listed(values: tuple[str, ...]) -> str:
    return "(" + ", ".join(f"'{v}'" for v in values) + ")"


def _job_expr(column: str, present: frozenset[str]) -> str:
    source = RENAMED.get(column, column)
    if source not in present:
        return JOB_DEFAULTS.get(column, "NULL")
    if column in JSON_TEXT:
        return f"CASE WHEN json_valid({source}) THEN json({source}) ELSE {source} END"
    return source


def _copy_attempts(layout: Layout) -> str:
    reason = (
        "failure_reason" if "failure_reason" in layout.attempt_columns else DERIVED_FAILURE_REASON
    )
    odd = "spoolctl_problem IS NOT NULL"
    exprs = {column: column for column in ATTEMPT_COLUMNS}
    exprs["state"] = f"CASE WHEN {odd} THEN 'abandoned' ELSE state END"
    exprs["error"] = (
        f"CASE WHEN {odd} THEN '{QUARANTINE_NOTE}' || spoolctl_problem || CASE WHEN error IS "
        "NULL THEN '' ELSE '; error was ' || quote(error) END ELSE error END"
    )
    exprs["finished_at"] = (
        f"CASE WHEN {odd} THEN COALESCE(finished_at, {NOW_EPOCH_SQL}) ELSE finished_at END"
    )
    return (
        f"INSERT INTO attempts ({', '.join(ATTEMPT_COLUMNS)}, failure_reason) "
        f"SELECT {', '.join(exprs.values())}, CASE WHEN {odd} THEN 'unknown' ELSE {reason} END "
        f"FROM (SELECT *, {attempt_problems(layout)} AS spoolctl_problem FROM legacy_attempts) "
        "ORDER BY id"
    )


def _end_attempts_of_quarantined_jobs(layout: Layout) -> str:
    """A quarantined job's running attempts end with it: nothing stays running."""
    return (
        "UPDATE attempts SET state = 'abandoned', failure_reason = 'unknown', "
        f"finished_at = COALESCE(finished_at, {NOW_EPOCH_SQL}), "
        f"error = '{QUARANTINE_NOTE}its job was quarantined' "
        "WHERE state = 'running' AND job_id IN "
        f"(SELECT id FROM legacy_jobs WHERE {job_problems(layout)} IS NOT NULL)"
    )


def quarantine_counts(conn: Connection, layout: Layout) -> tuple[list[int], int]:
    """(ids of the jobs, number of attempt rows) adoption will quarantine; read
    from the legacy tables before they are detached."""
    job_ids = [
        int(row[0])
        for row in conn.exec_driver_sql(
            f"SELECT id FROM jobs WHERE {job_problems(layout)} IS NOT NULL ORDER BY id"
        )
    ]
    n_attempts = conn.exec_driver_sql(
        f"SELECT count(*) FROM attempts WHERE {attempt_problems(layout)} IS NOT NULL"
    ).scalar_one()
    return job_ids, int(n_attempts)


def _carry_sequences() -> list[str]:
    names = ", ".join(f"'{t}'" for t in LEGACY_TABLES)
    legacy = ", ".join(f"'legacy_{t}'" for t in LEGACY_TABLES)
    return [
        f"DELETE FROM sqlite_sequence WHERE name IN ({names})",
        "INSERT INTO sqlite_sequence (name, seq) SELECT substr(name, 8), seq "
        f"FROM sqlite_sequence WHERE name IN ({legacy})",
    ]


def _relocate(relocation: Relocation) -> str:
    return (
        f"UPDATE attempts SET {relocation.column} = {_quote(relocation.path)} "
        f"WHERE id = {relocation.attempt_id}"
    )


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def relocations(conn: Connection, spool: Path) -> list[Relocation]:
    """Output paths that point where the spool folder used to be.

    A stored path is moved to `<spool>/output/<job>/<attempt>/<stream>` only
    when the stored file is gone and the file exists at the new place; any
    other path is kept as it was.
    """
    rows = conn.exec_driver_sql(
        "SELECT id, job_id, attempt_no, stdout_path, stderr_path FROM attempts ORDER BY id"
    ).all()
    found = []
    for attempt_id, job_id, attempt_no, *paths in rows:
        for stream, stored in zip(layout.STREAMS, paths, strict=True):
            moved = _moved_path(
                stored, spool, layout.folder_layout_tail(job_id, attempt_no, stream)
            )
            if moved is not None:
                found.append(Relocation(attempt_id, f"{stream}_path", str(moved)))
    return found


def _moved_path(stored: str | None, spool: Path, tail: str) -> Path | None:
    if not stored or not stored.endswith("/" + tail):
        return None
    candidate = spool / tail
    if Path(stored) == candidate or Path(stored).exists() or not candidate.is_file():
        return None
    return candidate
