"""Changing jobs that have not started: `spoolctl update`.

A queued job (due, delayed, in a paused lane, or waiting for its retry) or
a waiting one (`add --after-job`) takes new values for the attributes a
submission sets and a worker reads at its claim: priority, lane, timeout,
retry budget, run time, tags and resource limits. The values arrive read by
the rules of `add` (`services/job_spec.py`); this module decides what the
queue does with them.

The jobs are chosen by id, or by a filter (a lane, tags) over the queued
and waiting jobs, and changed in one transaction, all or none: an id that
names no job is NOT_FOUND, a job that runs or ended is CONFLICT, and then
nothing changes. The rows are read with `FOR UPDATE` (PostgreSQL; SQLite's
one writer holds the database from BEGIN IMMEDIATE on), and each write is
conditional on the state read: a job a claim took meanwhile makes the whole
change CONFLICT, never half of it, so a job runs either with every new value
or with none of them.

Each job whose values change gets one `updated` event; its detail's
`changes` maps each changed column to `[old, new]` (tags as objects). Values
equal to the job's own are left out, and a job they would not change at all
gets no event.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import ColumnElement, Connection, Select, select, update

from spoolctl import validate
from spoolctl.db import codec
from spoolctl.db.tables import jobs
from spoolctl.errors import Conflict, InvalidInput, NotFound
from spoolctl.services.event_row import event_row
from spoolctl.services.events import record_events
from spoolctl.services.query import has_tag
from spoolctl.states import EventKind, JobState

UPDATABLE = (JobState.QUEUED.value, JobState.WAITING.value)
COLUMNS = (
    "priority",
    "queue",
    "timeout_seconds",
    "max_retries",
    "memory_bytes",
    "cpus",
    "require_limits",
)
"""The columns `update` sets to a value given as it is stored (their flags
are `add`'s); the run time and the tags are computed per job."""
READ = (
    jobs.c.id,
    jobs.c.state,
    jobs.c.next_run_at,
    jobs.c.tags,
    jobs.c.signal_before_timeout_s,
    *(jobs.c[c] for c in COLUMNS),
)
ID_CHUNK = 500
"""Ids per SELECT, events per INSERT: within every backend's limit of bound values."""


@dataclass(frozen=True)
class Change:
    """The new values. `values`: column -> value as stored (COLUMNS only);
    `run_at`: the run time on the queue's clock (a past time means now);
    `tags`: set (an existing key takes the new value, the others stay);
    `untag`: keys removed."""

    values: Mapping[str, Any] = field(default_factory=dict)
    run_at: float | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    untag: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        unknown = set(self.values) - set(COLUMNS)
        if unknown:
            raise AssertionError(f"update sets no column {sorted(unknown)}")
        if not (self.values or self.run_at is not None or self.tags or self.untag):
            raise InvalidInput("nothing to change: give at least one new value (see --help)")
        both = sorted(set(self.tags) & set(self.untag))
        if both:
            raise InvalidInput(
                f"tag {both[0]!r} is both set (--tag) and removed (--untag)", key=both[0]
            )


@dataclass(frozen=True)
class Selection:
    """Which jobs: by id, or every queued or waiting job that matches a
    filter (its lane, its tags: K=V, or K with any value; all must match)."""

    ids: tuple[int, ...] = ()
    lane: str | None = None
    tags: tuple[tuple[str, str | None], ...] = ()

    def __post_init__(self) -> None:
        filtered = self.lane is not None or bool(self.tags)
        if self.ids and filtered:
            raise InvalidInput(
                "choose the jobs either by id (JOB_IDS, --batch) or by a filter "
                "(--in-queue, --with-tag), not both"
            )
        if not (self.ids or filtered):
            raise InvalidInput(
                "no job chosen: give JOB_IDS, --batch, or a filter (--in-queue, --with-tag)"
            )

    @property
    def by_id(self) -> bool:
        return bool(self.ids)


@dataclass(frozen=True)
class Updated:
    job_id: int
    changes: dict[str, list[Any]]
    """column -> [old, new], only the columns whose value changed."""


def update_jobs(
    conn: Connection, chosen: Selection, change: Change, *, now: float
) -> list[Updated]:
    """Apply `change` to every chosen job in the caller's one transaction, or
    raise (NotFound, Conflict, InvalidInput) with nothing changed."""
    found = _read(conn, chosen)
    if chosen.by_id:
        _check(sorted(set(chosen.ids)), found)
    done: list[Updated] = []
    events: list[dict[str, Any]] = []
    for job_id in sorted(found):
        row = found[job_id]
        old, new = _old(row), _new(row, change, now)
        changes = {k: [old[k], v] for k, v in new.items() if v != old[k]}
        done.append(Updated(job_id, changes))
        if not changes:
            continue
        _write(conn, row, {k: _stored(k, new[k]) for k in changes})
        events.append(event_row(job_id, EventKind.UPDATED, now, detail={"changes": changes}))
    for start in range(0, len(events), ID_CHUNK):
        record_events(conn, events[start : start + ID_CHUNK])
    return done


def _read(conn: Connection, chosen: Selection) -> dict[int, Any]:
    found: dict[int, Any] = {}
    if chosen.by_id:
        wanted = sorted(set(chosen.ids))
        for start in range(0, len(wanted), ID_CHUNK):
            part = wanted[start : start + ID_CHUNK]
            found.update(_rows(conn, _locked(jobs.c.id.in_(part))))
        return found
    where: list[ColumnElement[bool]] = [jobs.c.state.in_(UPDATABLE)]
    if chosen.lane is not None:
        where.append(jobs.c.queue == chosen.lane)
    where += [has_tag(key, value) for key, value in chosen.tags]
    return _rows(conn, _locked(*where))


def _locked(*where: ColumnElement[bool]) -> Select[Any]:
    """The rows, locked until the end of the transaction where the backend
    locks rows (PostgreSQL: a claim's SKIP LOCKED passes them by; one that
    took a row first makes this read wait and then leave it out, or see it
    running). In id order, so that two updates lock alike."""
    return select(*READ).where(*where).order_by(jobs.c.id).with_for_update()


def _rows(conn: Connection, query: Select[Any]) -> dict[int, Any]:
    return {int(row.id): row for row in conn.execute(query)}


def _check(wanted: Sequence[int], found: Mapping[int, Any]) -> None:
    missing = [i for i in wanted if i not in found]
    if missing:
        listed = ", ".join(map(str, missing))
        raise NotFound(f"no job {listed}; nothing was changed", job_id=missing[0], job_ids=missing)
    for job_id in wanted:
        state = str(found[job_id].state)
        if state not in UPDATABLE:
            raise Conflict(
                f"job {job_id} is {state}; update takes only queued or waiting jobs; "
                "nothing was changed",
                job_id=job_id,
                state=state,
            )


def _old(row: Any) -> dict[str, Any]:
    values = {c: getattr(row, c) for c in COLUMNS}
    values["next_run_at"] = row.next_run_at
    try:
        values["tags"] = codec.load_str_map(row.tags)
    except codec.DamagedValue:
        values["tags"] = None  # a damaged value: any new one replaces it
    return values


def _new(row: Any, change: Change, now: float) -> dict[str, Any]:
    new: dict[str, Any] = dict(change.values)
    _check_warning(row, new.get("timeout_seconds"))
    if change.run_at is not None:
        new["next_run_at"] = max(change.run_at, now)
    if change.tags or change.untag:
        tags = {**(_old(row)["tags"] or {}), **change.tags}
        for key in change.untag:
            tags.pop(key, None)
        try:
            new["tags"] = validate.tag_map(tags)
        except InvalidInput as exc:
            raise InvalidInput(f"job {row.id}: {exc.message}", job_id=int(row.id)) from None
    return new


def _check_warning(row: Any, timeout: int | None) -> None:
    """A job warned before its timeout (`--signal-before-timeout`) keeps a
    timeout longer than the warning's lead, as `add` requires."""
    before = row.signal_before_timeout_s
    if timeout is None or before is None:
        return
    if timeout == validate.NO_TIMEOUT or before >= timeout:
        raise InvalidInput(
            f"job {row.id} is warned {before}s before its timeout (--signal-before-timeout): "
            "its timeout must stay longer than that; nothing was changed",
            job_id=int(row.id),
            field="timeout_seconds",
        )


def _stored(column: str, value: Any) -> Any:
    return codec.dumps(value) if column == "tags" else value


def _write(conn: Connection, row: Any, values: dict[str, Any]) -> None:
    """Write one job's new values if it is still in the state read. Setting
    the state to itself names it in the UPDATE, so that on PostgreSQL the
    trigger that wakes idle workers fires for a queued job (its lane or run
    time may have changed)."""
    written = conn.execute(
        update(jobs)
        .where(jobs.c.id == row.id, jobs.c.state == row.state)
        .values(**values, state=row.state)
    )
    if written.rowcount != 1:
        raise Conflict(
            f"job {row.id} changed while it was being updated (a worker claimed it?); "
            "nothing was changed",
            job_id=int(row.id),
        )


def updated_ids(done: Iterable[Updated]) -> list[int]:
    """The jobs whose values changed (each with an `updated` event)."""
    return [u.job_id for u in done if u.changes]
