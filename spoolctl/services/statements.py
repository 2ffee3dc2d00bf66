"""The statements the lean path runs (`services/submission.py` and
`services/readings.py` name them), written once with SQLAlchemy Core
against `db/tables.py`.

The full path runs them as `Prepared` statements (`PreparedStatements`).
The lean path runs the same SQL as SQLAlchemy compiles it for SQLite, kept
in `db/lean_sql.py`: `lean_sql_module()` writes that file's text
(`scripts/gen_docs.py`), and tests/unit/test_lean.py fails when the
committed file differs from what SQLAlchemy compiles now, so the tables and
the revisions stay the one definition of the schema."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sqlalchemy import (
    Connection,
    Select,
    bindparam,
    func,
    insert,
    literal,
    literal_column,
    select,
)
from sqlalchemy.dialects import sqlite
from sqlalchemy.sql.elements import BindParameter

from spoolctl.db.prepared import Prepared
from spoolctl.db.revisions import HEAD_REVISION
from spoolctl.db.tables import (
    asks_for_resources,
    attempts,
    device_holds,
    devices,
    job_dependencies,
    job_events,
    jobs,
    lanes,
    schedules,
    workers,
)
from spoolctl.services import placement_views as p
from spoolctl.services import readings as r
from spoolctl.services.claim_limits import needs_limits
from spoolctl.services.events import INSERT_EVENT_STATEMENT
from spoolctl.services.job_spec import LISTED, ROW_COLUMNS
from spoolctl.services.submission import ACTIVE_WITH_KEY, INSERT_EVENT, INSERT_JOB
from spoolctl.states import ACTIVE_JOB_STATES, AttemptState, EventKind, JobState, WorkerState


def list_statement(shape: r.ListShape) -> Select[Any]:
    """`list`'s columns, newest first, each filter of the shape a bind."""
    query = select(*(c for c in jobs.c if c.name in r.LIST_COLUMNS)).order_by(jobs.c.id.desc())
    if shape.state:
        query = query.where(jobs.c.state == bindparam("state"))
    if shape.lane:
        query = query.where(jobs.c.queue == bindparam("lane"))
    if shape.priority:
        query = query.where(jobs.c.priority >= bindparam("priority_min"))
    return query.limit(bindparam("limit")) if shape.limited else query


def _server_waits(*, include_all: bool) -> Select[Any]:
    """A worker's registration event of a wait for the server: lane events
    are few, read through the job_id index (job_id null)."""
    query = (
        select(job_events.c.worker_id, job_events.c.detail)
        .join(
            workers,
            (workers.c.id == job_events.c.worker_id) & (job_events.c.at >= workers.c.started_at),
        )
        .where(
            job_events.c.job_id.is_(None),
            job_events.c.event == EventKind.WAITED_FOR_SERVER.value,
        )
        .order_by(job_events.c.id)
    )
    return query if include_all else query.where(workers.c.state == WorkerState.RUNNING.value)


def _recent_dead() -> Select[Any]:
    return (
        select(
            jobs.c.id,
            jobs.c.argv,
            jobs.c.attempts,
            jobs.c.crashes,
            jobs.c.last_error,
            jobs.c.finished_at,
        )
        .where(jobs.c.state == JobState.DEAD.value)
        .order_by(jobs.c.finished_at.desc())
    )


def _workers(*, include_all: bool) -> Select[Any]:
    query = select(workers).order_by(workers.c.started_at)
    return query if include_all else query.where(workers.c.state == WorkerState.RUNNING.value)


CHUNK_IDS: list[BindParameter[Any]] = [bindparam(f"id_{i}") for i in range(r.CHUNK)]

PLACEMENT_READS: dict[str, Prepared] = {
    p.DEVICE_TOTALS: Prepared(
        # an empty table where no worker registered a device
        select(func.count().label("n"), func.coalesce(func.sum(devices.c.held), 0).label("held"))
    ),
    p.DEVICE_ROWS: Prepared(select(devices).order_by(devices.c.host, devices.c.idx)),
    p.DEVICE_HOLDERS: Prepared(
        select(
            device_holds.c.device_uuid,
            device_holds.c.job_id,
            device_holds.c.attempt_id,
            device_holds.c.worker_id,
            device_holds.c.units,
        ).order_by(device_holds.c.id)
    ),
    p.ASKING: Prepared(
        # the partial index ix_jobs_requests alone (tables.REQUESTS_WHERE), for
        # one lane: empty where no queued job asks for resources. `before`
        # bounds next_run_at as the index does (placement_views.ANY_TIME): with
        # that third term SQLite's planner prefers it to ix_jobs_claim and
        # ix_jobs_state_id, which would read every queued job
        select(
            jobs.c.id,
            jobs.c.queue,
            jobs.c.weight,
            jobs.c.gpus,
            jobs.c.gpu_share,
            jobs.c.gpu_memory_bytes,
            jobs.c.gpu_model,
            jobs.c.memory_bytes,
        )
        .where(
            jobs.c.state == literal_column(f"'{JobState.QUEUED.value}'"),
            asks_for_resources(jobs),
            jobs.c.queue == bindparam("queue"),
            jobs.c.next_run_at <= bindparam("before"),
        )
        .order_by(jobs.c.id)
    ),
    p.LIVE_INVENTORIES: Prepared(
        select(workers.c.id, workers.c.queue, workers.c.concurrency, workers.c.inventory).where(
            workers.c.state == WorkerState.RUNNING.value,
            workers.c.heartbeat_at >= bindparam("since"),
        )
    ),
    p.JOB_HOLDS: Prepared(
        # the job's attempts (their unique index), then ix_device_holds_attempt_id
        select(device_holds.c.attempt_id, device_holds.c.device_uuid)
        .join(attempts, attempts.c.id == device_holds.c.attempt_id)
        .where(attempts.c.job_id == bindparam("job_id"))
        .order_by(device_holds.c.id)
    ),
    p.RUNNING_PLACES: Prepared(
        select(attempts.c.job_id, attempts.c.host, attempts.c.devices).where(
            attempts.c.job_id.in_(CHUNK_IDS), attempts.c.state == AttemptState.RUNNING.value
        )
    ),
}
"""What the views read of placement (`services/placement_views.py` names them)."""

READS: dict[str, Prepared] = {
    r.LANE_COUNTS: Prepared(
        # grouped in the claim index's own order (state, lane), which holds
        # next_run_at too: one walk of that index, no table row read, no sort
        select(
            jobs.c.state,
            jobs.c.queue,
            func.count().label("n"),
            func.count().filter(jobs.c.next_run_at > bindparam("now")).label("future"),
        ).group_by(jobs.c.state, jobs.c.queue)
    ),
    r.SUSPENDED_COUNTS: Prepared(
        # the running rows only (as many as busy slots), whatever the table holds
        select(jobs.c.queue, func.count().label("n"))
        .where(jobs.c.state == JobState.RUNNING.value, jobs.c.suspended_at.is_not(None))
        .group_by(jobs.c.queue)
    ),
    r.RECENT_DEAD: Prepared(_recent_dead().limit(bindparam("limit"))),
    r.RECENT_DEAD_ALL: Prepared(_recent_dead()),
    r.LAST_ATTEMPT_PATHS: Prepared(
        select(attempts.c.stdout_path, attempts.c.stderr_path)
        .where(attempts.c.job_id == bindparam("job_id"))
        .order_by(attempts.c.attempt_no.desc())
        .limit(1)
    ),
    r.WORKERS_RUNNING: Prepared(_workers(include_all=False)),
    r.WORKERS_ALL: Prepared(_workers(include_all=True)),
    r.WORKER_JOBS: Prepared(
        select(jobs.c.id, jobs.c.suspended_at)
        .where(jobs.c.state == JobState.RUNNING.value, jobs.c.locked_by == bindparam("worker"))
        .order_by(jobs.c.id)
    ),
    r.SERVER_WAITS_RUNNING: Prepared(_server_waits(include_all=False)),
    r.SERVER_WAITS_ALL: Prepared(_server_waits(include_all=True)),
    r.ORPHANS: Prepared(
        # the running rows and their own events only, oldest flag first
        select(
            job_events.c.job_id,
            job_events.c.at,
            job_events.c.detail,
            attempts.c.id.label("attempt_id"),
        )
        .join(jobs, jobs.c.id == job_events.c.job_id)
        .join(
            attempts,
            (attempts.c.job_id == jobs.c.id) & (attempts.c.state == AttemptState.RUNNING.value),
        )
        .where(
            jobs.c.state == JobState.RUNNING.value,
            job_events.c.event == EventKind.ORPHAN_UNCONFIRMED.value,
        )
        .order_by(job_events.c.id)
    ),
    r.PAUSED_LANES: Prepared(select(lanes).order_by(lanes.c.queue)),
    r.SCHEDULE_COUNT: Prepared(select(func.count().label("n")).select_from(schedules)),
    r.NEXT_SCHEDULE: Prepared(
        select(schedules.c.name, schedules.c.next_fire_at)
        .where(schedules.c.paused_at.is_(None))
        .order_by(schedules.c.next_fire_at)
        .limit(1)
    ),
    r.WAITING_FOR_LIMITS: Prepared(
        # served by the partial index ix_jobs_needs_limits: those jobs only
        select(jobs.c.id)
        .where(needs_limits(jobs), jobs.c.next_run_at <= bindparam("now"))
        .order_by(jobs.c.id)
        .limit(r.WAITING_FOR_LIMITS_SHOWN)
    ),
    r.FIRST_JOB_ID: Prepared(select(func.min(jobs.c.id).label("n"))),
    r.JOB_BY_ID: Prepared(select(jobs).where(jobs.c.id == bindparam("id"))),
    r.JOB_ATTEMPTS: Prepared(
        select(attempts)
        .where(attempts.c.job_id == bindparam("job_id"))
        .order_by(attempts.c.attempt_no)
    ),
    r.JOB_EVENTS: Prepared(
        # seq: the ledger's, not the job's
        select(*(c for c in job_events.c if c.name != "seq"))
        .where(job_events.c.job_id == bindparam("job_id"))
        .order_by(job_events.c.id)
    ),
    r.DEPENDENTS: Prepared(
        # served by ix_job_dependencies_after_job_id
        select(job_dependencies.c.job_id)
        .where(job_dependencies.c.after_job_id == bindparam("job_id"))
        .order_by(job_dependencies.c.job_id)
    ),
    r.ATTEMPT_COUNTS: Prepared(
        # the (job_id, attempt_no) unique index alone: the cost grows with the page
        select(attempts.c.job_id, func.count().label("n"))
        .where(attempts.c.job_id.in_(CHUNK_IDS))
        .group_by(attempts.c.job_id)
    ),
    r.WAITS_FOR: Prepared(
        # the dependency primary key
        select(job_dependencies.c.job_id, job_dependencies.c.after_job_id, jobs.c.state)
        .join(jobs, jobs.c.id == job_dependencies.c.after_job_id)
        .where(job_dependencies.c.job_id.in_(CHUNK_IDS))
        .order_by(job_dependencies.c.job_id, job_dependencies.c.after_job_id)
    ),
    **{r.list_name(shape): Prepared(list_statement(shape)) for shape in r.LIST_SHAPES},
    **PLACEMENT_READS,
}
"""The reads of `status`, `list` and `show`, by the name `readings.py` gives them."""

LEAN: dict[str, Prepared] = {
    ACTIVE_WITH_KEY: Prepared(
        select(jobs).where(
            jobs.c.idempotency_key == bindparam("key"),
            jobs.c.state.in_([literal(s) for s in sorted(s.value for s in ACTIVE_JOB_STATES)]),
        )
    ),
    INSERT_JOB: Prepared(
        insert(jobs).values({c: bindparam(c) for c in ROW_COLUMNS}).returning(jobs.c.id)
    ),
    INSERT_EVENT: INSERT_EVENT_STATEMENT,
    **READS,
}
"""Every statement the lean path runs, by the name `submission.py` or
`readings.py` gives it."""


class PreparedStatements:
    """The full path's runner of the named statements, on an SQLAlchemy
    connection inside its transaction (any backend)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def first(self, name: str, params: Mapping[str, Any]) -> dict[str, Any] | None:
        row = LEAN[name].first(self.conn, params)
        return None if row is None else dict(row._asdict())

    def all(self, name: str, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Every row, by column."""
        cursor = LEAN[name].execute(self.conn, params)
        columns = [d[0] for d in cursor.description]
        return [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]


def reads(conn: Connection) -> PreparedStatements:
    """The named statements on conn (`services/readings.py` takes them)."""
    return PreparedStatements(conn)


def lean_sql_module() -> str:
    """The text of `db/lean_sql.py`: each statement of LEAN as SQLAlchemy
    compiles it for SQLite (the SQL, its binds in order, the binds it sets
    itself), laid out as `ruff format` leaves it, the long strings cut at
    spaces into adjacent literals."""
    dialect = sqlite.dialect()
    lines = [
        '"""Generated by scripts/gen_docs.py from services/statements.py: the lean',
        "path's statements as SQLAlchemy compiles them for SQLite. Do not edit:",
        'tests/unit/test_lean.py fails when this differs from what it compiles."""',
        "",
        "from __future__ import annotations",
        "",
        "from typing import Any",
        "",
        f"HEAD_REVISION = {_literal(HEAD_REVISION)}",
        '"""The revision these statements were compiled against."""',
        "LISTED = (",
        *(f"    {_literal(key)}," for key in LISTED),
        ")",
        '"""The job attributes declared `listed` (services/job_spec.py), which `list`',
        'shows: here, so that reading them loads no declaration of attributes."""',
        "STATEMENTS: dict[str, tuple[str, str, dict[str, Any]]] = {",
    ]
    for name in sorted(LEAN):
        compiled = LEAN[name].compiled_for(dialect)
        lines.append(f"    {_literal(name)}: (")
        pieces = _pieces(compiled.sql)
        lines.extend(f"        {_literal(piece)}" for piece in pieces[:-1])
        lines.append(f"        {_literal(pieces[-1])},")
        binds = _pieces(" ".join(compiled.order or ()))
        lines.extend(f"        {_literal(piece)}" for piece in binds[:-1])
        lines.append(f"        {_literal(binds[-1])},")
        set_here = {k: v for k, v in sorted(compiled.defaults.items()) if v is not None}
        pairs = [f"{_literal(k)}: {_literal(v)}" for k, v in set_here.items()]
        if len("        {" + ", ".join(pairs) + "},") <= LINE:
            lines.append("        {" + ", ".join(pairs) + "},")
        else:
            lines += ["        {", *(f"            {pair}," for pair in pairs), "        },"]
        lines.append("    ),")
    lines += [
        "}",
        '"""Name -> (SQL, its bind names in order, space-separated, the binds it',
        'sets itself)."""',
        "",
    ]
    return "\n".join(lines)


LINE = 100
"""The longest line `ruff format` leaves as it is."""
ONE_LINE = 91
"""The longest literal `ruff format` keeps on one line of the file there
(100 columns, less the indent and the comma)."""


def _literal(value: Any) -> str:
    """A Python literal as ruff formats it (double quotes)."""
    return json.dumps(value) if isinstance(value, str) else repr(value)


def _pieces(sql: str, width: int = 80) -> list[str]:
    """The SQL cut at spaces into pieces that fit a line (adjacent string
    literals: one string again); whole where it fits one line of the file."""
    if len(_literal(sql)) <= ONE_LINE:
        return [sql]
    pieces, current = [], ""
    for word in sql.split(" "):
        candidate = f"{current} {word}" if current else word
        if len(_literal(candidate)) > width and current:
            pieces.append(current + " ")
            current = word
        else:
            current = candidate
    pieces.append(current)
    return pieces
