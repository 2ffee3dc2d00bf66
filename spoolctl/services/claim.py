"""The claim: the atomic hand-over of queued jobs to one worker.

Runs inside the caller's write transaction. On SQLite that is BEGIN
IMMEDIATE, so the take of the jobs, their attempts and their events happen
under the write lock; on PostgreSQL the jobs are picked FOR UPDATE SKIP
LOCKED (claimants skip each other's rows instead of waiting), and the update
is still guarded by `state = 'queued'`. Either way two workers can never
both take one job.

Who claims is one value, `Claimant`, and what each claim gives a worker
another, `Claim` (`services/claimant.py`); `claim_up_to` is the claim, and
`Claiming` the same in two halves for a pass that sends other statements
beside it (`services/settle.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection, case, delete, func, select, update

from spoolctl import layout
from spoolctl.db import codec
from spoolctl.db.backends import statements
from spoolctl.db.prepared import Sent, item_bind, item_binds
from spoolctl.db.tables import attempts, job_events, jobs
from spoolctl.resources import PLAIN, Free, Inventory, Request
from spoolctl.services import claim_limits, lingering, placement
from spoolctl.services import claim_statements as sql
from spoolctl.services.claimant import Claim as Claim
from spoolctl.services.claimant import Claimant as Claimant
from spoolctl.services.claimant import steering_of
from spoolctl.services.deadletter import RELEASE_LOCK
from spoolctl.services.dependencies import cancel_dependents
from spoolctl.services.event_row import event_row
from spoolctl.services.events import record_event, record_events
from spoolctl.services.lanes import is_paused
from spoolctl.services.lingering import attempt_token
from spoolctl.states import EventKind, JobState


def running_in_queue(conn: Connection, queue: str) -> int:
    return int(
        conn.execute(
            select(func.count())
            .select_from(jobs)
            .where(jobs.c.state == JobState.RUNNING.value, jobs.c.queue == queue)
        ).scalar_one()
    )


def claim_up_to(
    conn: Connection, claimant: Claimant, wanted: int, now: float, room: Free | None = None
) -> list[Claim]:
    """Claim up to `wanted` due jobs of the claimant's lane (a worker's free
    slots), in claim order: priority (high first), then next_run_at, then id.

    Within a lane's cap, no more are claimed than leave that many jobs of the
    lane running fleet-wide. A job whose stored row is damaged (argv, env,
    timeout or cwd that are not what the schema promises) is sent to dead
    unexecuted, with the reason in its last_error, and the next job is
    tried. A job whose previous attempt was canceled or abandoned while its
    process still lives stays queued until that process is gone. Nothing is
    claimed from a paused lane. A job that requires its limits is claimed
    only when the claimant enforces them.

    A job that asks for resources (a weight, GPUs, memory) is claimed only
    if it fits `room` (what the worker has free; None: `wanted` slots), and
    given its devices (`services/placement.py`).

    The common case is one statement for all of them (`claim_statements.take`:
    where the backend runs writes inside a WITH, it also creates the
    attempts and their events; else a statement each follows); where it
    comes up short, or a due job asks for resources, the claim looks again
    one job at a time."""
    return Claiming(conn, claimant, wanted, now, room).claims()


class Claiming:
    """`claim_up_to` in two halves: made, it sends the claim's statement
    (after the lane cap's count, which it reads); `claims()` reads its answer
    and claims the rest. In a pipeline (`Statements.pipeline`), statements
    sent before `claims()` is called share that statement's round trip. Where
    the statement came up short, `claims()` looks again one job at a time,
    and so sees what the caller did meanwhile (a pass: releasing the jobs
    that waited for its successes)."""

    def __init__(
        self,
        conn: Connection,
        claimant: Claimant,
        wanted: int,
        now: float,
        room: Free | None = None,
    ) -> None:
        cap = claimant.cap
        if cap is not None and cap.lane_cap is not None:
            statements(conn).before_cap_count(conn, claimant.lane)
            wanted = cap.within_lane_cap(wanted, running_in_queue(conn, claimant.lane))
        self._conn, self._claimant, self._wanted, self._now = conn, claimant, wanted, now
        self._room = room
        self._take, self._begins = sql.take(conn)
        self._sent = self._send(wanted) if wanted > 0 else None

    def _send(self, asked: int) -> tuple[int, Sent]:
        params = {**self._claimant.binds, "b_now": self._now, "b_limit": asked}
        return asked, self._take.send(self._conn, params)

    def claims(self) -> list[Claim]:
        """The jobs claimed, in claim order."""
        conn, wanted, begins, now = self._conn, self._wanted, self._begins, self._now
        claims: list[Claim] = []
        while self._sent is not None:
            asked, sent = self._sent
            rows = sent.all()
            rows.sort(key=lambda row: (-row.priority, row.next_run_at, row.id))
            sound: list[_Taken] = []
            for row in rows:
                try:
                    decoded = _decode(row)
                except codec.DamagedValue as exc:
                    if begins:
                        _unbegin(conn, row)
                    _quarantine(conn, row.id, str(exc), now)
                    continue
                number = row.attempt_no if begins else 1 if row.last_no is None else row.last_no + 1
                sound.append((row, number, decoded))
            claims += _begin_attempts(conn, sound, self._claimant, now, begun=begins)
            more = len(rows) == asked and len(claims) < wanted
            self._sent = self._send(wanted - len(claims)) if more else None
        if len(claims) < wanted:
            room = self._room if self._room is not None else Free(wanted)
            room.slots -= len(claims)  # each job the statement took has one slot
            claims += _look_again(conn, self._claimant, now, room, wanted - len(claims))
        return claims


_Decoded = tuple[list[str], dict[str, str], int, str | None]


def _decode(row: Any) -> _Decoded:
    """argv, env, timeout and cwd as the schema promises them (DamagedValue if not)."""
    return (
        codec.load_argv(row.argv),
        codec.load_str_map(row.env),
        codec.load_timeout(row.timeout_seconds),
        codec.load_cwd(row.cwd),
    )


MAX_PASSED = 64
"""The one-at-a-time claim passes over at most this many due jobs that do
not fit (or whose previous attempt lingers) before it gives up until the
next pass: its cost stays bounded however long the lane."""


def _look_again(
    conn: Connection, claimant: Claimant, now: float, room: Free, most: int
) -> list[Claim]:
    """Look at the lane's due jobs one at a time, in claim order, and take at
    most `most` of them while `room` has slots, together at the end: where
    the claim's statement came up short (the lane is paused, it has nothing
    due, its first job's previous attempt was ended elsewhere: checked here
    for a lingering process) or a due job asks for resources. A job that does
    not fit what is free is passed over (`placement.Walk`, which may reserve
    for it)."""
    queue = claimant.lane
    if room.slots <= 0 or most <= 0 or is_paused(conn, queue):
        return []
    inventory = claimant.inventory or Inventory(room.slots, host=claimant.host)
    if inventory.devices:
        room.units = placement.free_units(conn, inventory)
    walk = placement.Walk(
        conn, inventory, room, lane=queue, now=now, threshold_s=claimant.live_within_s
    )
    chosen: list[_Taken] = []
    placed: dict[int, tuple[Request, tuple[str, ...]]] = {}
    skip: list[int] = []
    params = {
        "queue": queue,
        "now": now,
        "w_slots": inventory.slots,
        "w_gpus": len(inventory.devices),
        "w_memory": inventory.memory_bytes or sql.UNBOUNDED,
        **claim_limits.binds(claimant.enforces, ""),
    }
    while not walk.full and len(chosen) < most and len(skip) - len(chosen) <= MAX_PASSED:
        passed = {item_bind("s", i): job_id for i, job_id in enumerate(skip)}
        row = sql.CLAIMABLE.of(len(skip)).first(conn, {**params, **passed})
        if row is None:
            break
        skip.append(row.id)
        previous = lingering.latest_attempt(conn, row.id)
        if lingering.still_running(previous, now):
            continue
        try:
            decoded = _decode(row)
        except codec.DamagedValue as exc:
            _quarantine(conn, row.id, str(exc), now)
            continue
        request = Request.of_row(row)
        devices = walk.take(row.id, request)
        if devices is None:
            continue
        chosen.append((row, 1 if previous is None else previous.attempt_no + 1, decoded))
        placed[row.id] = (request, devices)
    return _take_placed(conn, chosen, placed, claimant, now)


def _take_placed(
    conn: Connection,
    chosen: list[_Taken],
    placed: dict[int, tuple[Request, tuple[str, ...]]],
    claimant: Claimant,
    now: float,
) -> list[Claim]:
    """The jobs the walk chose become running, with their attempts and
    `claimed` events (a statement each for all of them), and their devices
    are held."""
    taken = {"b_worker": claimant.worker_id, "b_pid": claimant.worker_pid, "b_now": now}
    for row, _, _ in chosen:
        sql.TAKE.execute(conn, {**taken, "b_id": row.id})
    claims = _begin_attempts(conn, chosen, claimant, now, placed)
    for claim in claims:
        if claim.devices:
            who = (claimant.worker_id, now)
            placement.hold(conn, claim.attempt_id, claim.job_id, claim.request, claim.devices, who)
    return claims


_Taken = tuple[Any, int, _Decoded]
"""A taken job: its row, its new attempt's number, its decoded command."""
UNPLACED: tuple[Request, tuple[str, ...]] = (PLAIN, ())


def _begin_attempts(
    conn: Connection,
    taken: list[_Taken],
    claimant: Claimant,
    now: float,
    placed: Mapping[int, tuple[Request, tuple[str, ...]]] | None = None,
    *,
    begun: bool = False,
) -> list[Claim]:
    """The taken jobs' attempt rows and their `claimed` events (a statement
    each for all of them; `begun`: the claim's statement made both), in the
    order given; and for a job with limits the claimant cannot enforce,
    `limits_not_enforced`. placed: job id -> the request and devices of
    each job the walk placed (the claim's statement takes plain jobs only)."""
    if not taken:
        return []
    worker_id, enforces = claimant.worker_id, claimant.enforces
    if begun:
        paths = [(row.stdout_path, row.stderr_path) for row, _, _ in taken]
        made = {row.id: int(row.attempt_id) for row, _, _ in taken}
    else:
        root = claimant.output_root
        paths = [layout.attempt_paths(root, row.id, no) for row, no, _ in taken]
        made = _insert_attempts(conn, taken, paths, claimant, now, placed or {})
    claims = []
    for (row, attempt_no, decoded), (stdout_path, stderr_path) in zip(taken, paths, strict=True):
        argv, env, timeout_seconds, cwd = decoded
        attempt_id = made[row.id]
        request, devices = (placed or {}).get(row.id, UNPLACED)
        limits = claim_limits.limits_of(row)
        if limits.any:
            who = (worker_id, now)
            claim_limits.note_unenforced(conn, row.id, attempt_no, limits, enforces, who)
        claims.append(
            Claim(
                job_id=row.id,
                attempt_id=attempt_id,
                attempt_no=attempt_no,
                argv=argv,
                cwd=cwd,
                env=env,
                timeout_seconds=timeout_seconds,
                queue=claimant.lane,
                stdout_path=stdout_path,
                stderr_path=stderr_path,
                token=attempt_token(worker_id, attempt_id, now),
                limits=limits,
                request=request,
                devices=devices,
                **steering_of(row),
            )
        )
    return claims


def _insert_attempts(
    conn: Connection,
    taken: list[_Taken],
    paths: list[tuple[str, str]],
    claimant: Claimant,
    now: float,
    placed: Mapping[int, tuple[Request, tuple[str, ...]]],
) -> dict[int, int]:
    """The attempts' rows and `claimed` events: each job's new attempt id
    (placed: the GPUs of each job the walk placed)."""
    worker_id = claimant.worker_id
    devices = {job_id: uuids for job_id, (_, uuids) in placed.items() if uuids}
    items = [
        {
            "b_job": row.id,
            "b_no": no,
            "b_stdout": stdout,
            "b_stderr": stderr,
            "b_devices": ",".join(devices.get(row.id, ())) or None,
        }
        for (row, no, _), (stdout, stderr) in zip(taken, paths, strict=True)
    ]
    params = {**item_binds(items), "b_worker": worker_id, "b_pid": claimant.worker_pid}
    params["b_now"], params["b_host"] = now, claimant.host
    made = {r.job_id: int(r.id) for r in sql.INSERT_ATTEMPTS.of(len(taken)).all(conn, params)}
    record_events(
        conn,
        [
            event_row(row.id, EventKind.CLAIMED, now, worker_id=worker_id, detail=detail)
            for row, no, _ in taken
            for detail in [{"attempt": no, **_devices_of(devices.get(row.id))}]
        ],
    )
    return made


def _devices_of(uuids: tuple[str, ...] | None) -> dict[str, list[str]]:
    """A `claimed` event's `devices`, where the attempt was given some."""
    return {"devices": list(uuids)} if uuids else {}


def _unbegin(conn: Connection, row: Any) -> None:
    """Take back the attempt and the `claimed` event the claim's statement
    made for a job whose row turned out damaged, in the same transaction:
    nothing of the claim remains, as if it had been quarantined before its
    attempt began."""
    conn.execute(delete(job_events).where(job_events.c.id == row.event_id))
    conn.execute(delete(attempts).where(attempts.c.id == row.attempt_id))


def _quarantine(conn: Connection, job_id: int, problem: str, now: float) -> None:
    """A job whose stored command cannot be trusted goes to dead, unexecuted:
    from queued (one job at a time), or from the running state the claim's
    statement has just given it in this transaction."""
    conn.execute(
        update(jobs)
        .where(
            jobs.c.id == job_id,
            jobs.c.state.in_([JobState.QUEUED.value, JobState.RUNNING.value]),
        )
        .values(
            **RELEASE_LOCK,
            state=JobState.DEAD.value,
            started_at=case(
                (jobs.c.state == JobState.RUNNING.value, sql.NEWEST_START), else_=jobs.c.started_at
            ),
            finished_at=now,
            last_error=f"damaged row, not executed: {problem}",
        )
    )
    record_event(conn, job_id, EventKind.DEAD, now, detail={"reason": "damaged_row"})
    cancel_dependents(conn, job_id, JobState.DEAD.value, now)
