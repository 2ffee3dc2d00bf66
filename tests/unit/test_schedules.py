"""Schedules, driven through the firing service with chosen clock readings
(no sleeps): one job per slot, the schema's unique (schedule, slot), catch-up
after downtime in each mode, overlap skip and allow, pause and resume,
removal while an occurrence runs, daylight-saving transitions both ways, and
fire times against cronsim's over random expressions and zones. On SQLite
and on PostgreSQL. The verbs, prune and real workers are in
tests/process/test_schedules.py."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spoolctl.cli.database import open_write
from spoolctl.services import firing, schedules
from spoolctl.services.fire_times import Recurrence
from spoolctl.services.job_spec import JobSpec
from spoolctl.states import CatchUp, Overlap
from tests.helpers import Db, execute, rows

pytestmark = pytest.mark.both_backends

T0 = 1_800_000_000.0  # a fixed clock reading: the tests tell the services what time it is


def write(db: Db, fn: Any) -> Any:
    queue = open_write(str(db))
    try:
        return queue.write(fn)
    finally:
        queue.engine.dispose()


def add(
    db: Db,
    name: str = "s",
    *,
    every: float | None = 60.0,
    cron: str | None = None,
    zone: str = "UTC",
    overlap: Overlap = Overlap.SKIP,
    catch_up: CatchUp = CatchUp.LATEST,
    now: float = T0,
    argv: tuple[str, ...] = ("true",),
) -> dict[str, Any]:
    spec = schedules.ScheduleSpec(
        name,
        Recurrence(cron, None if cron else every, zone, now),
        JobSpec(argv=list(argv), tags={"team": "ops"}, env={"A": "1"}),
        overlap,
        catch_up,
    )
    return write(db, lambda conn: schedules.add(conn, spec, now, replace=False))  # type: ignore[no-any-return]


def tick(db: Db, now: float) -> list[firing.Fired]:
    """What a worker's schedule duty does at `now`."""

    def run(conn: Any) -> list[firing.Fired]:
        fired = [firing.fire(conn, i, now, "w") for i in firing.due_schedules(conn, now)]
        return [f for f in fired if f is not None]

    return write(db, run)  # type: ignore[no-any-return]


def occurrences(db: Db) -> list[Any]:
    return rows(db, "SELECT slot_at, outcome, job_id FROM schedule_occurrences ORDER BY slot_at")


def next_fire(db: Db, name: str = "s") -> float:
    return float(rows(db, "SELECT next_fire_at FROM schedules WHERE name = ?", (name,))[0][0])


def set_state(db: Db, job_id: int, state: str) -> None:
    execute(db, "UPDATE jobs SET state = ? WHERE id = ?", (state, job_id))


def test_each_slot_makes_one_job_carrying_the_schedule(db: Db) -> None:
    add(db)
    (first,) = tick(db, T0 + 0.5)
    assert tick(db, T0 + 0.9) == []  # the slot is taken; the next is not due
    (job,) = rows(db, "SELECT * FROM jobs WHERE id = ?", (first.job_ids[0],))
    assert json.loads(job["env"]) == {
        "A": "1",
        "SPOOLCTL_SCHEDULE": "s",
        "SPOOLCTL_SCHEDULED_FOR": "2027-01-15T08:00:00+00:00",
    }
    assert json.loads(job["tags"]) == {"team": "ops", "schedule": "s"}
    set_state(db, first.job_ids[0], "done")
    (second,) = tick(db, T0 + 60.2)
    assert [(o["slot_at"], o["outcome"]) for o in occurrences(db)] == [
        (T0, "fired"),
        (T0 + 60, "fired"),
    ]
    assert next_fire(db) == T0 + 120
    fired = rows(db, "SELECT job_id FROM job_events WHERE event = 'schedule_fired' ORDER BY id")
    assert [r[0] for r in fired] == [first.job_ids[0], second.job_ids[0]]


def test_a_second_job_for_a_slot_is_refused_by_the_schema(db: Db) -> None:
    """Not a check in Python: the unique index refuses the row itself."""
    add(db)
    tick(db, T0)
    (schedule_id,) = rows(db, "SELECT id FROM schedules")[0]
    with pytest.raises(Exception, match=r"(?i)unique|duplicate"):
        execute(
            db,
            "INSERT INTO schedule_occurrences (schedule_id, slot_at, at, outcome) "
            "VALUES (?, ?, ?, 'fired')",
            (schedule_id, T0, T0),
        )
    assert len(occurrences(db)) == 1


def test_a_worker_that_lost_the_race_changes_nothing(db: Db) -> None:
    add(db)
    (schedule_id,) = rows(db, "SELECT id FROM schedules")[0]
    assert write(db, lambda conn: firing.fire(conn, schedule_id, T0, "a")) is not None
    # A second worker read the schedule as due before the first committed:
    assert write(db, lambda conn: firing.fire(conn, schedule_id, T0, "b")) is None
    assert len(rows(db, "SELECT id FROM jobs")) == 1


@pytest.mark.parametrize(
    ("mode", "slots"),
    [
        (CatchUp.LATEST, [T0 + 600]),
        (CatchUp.NONE, []),
        (CatchUp.ALL, [T0 + 60 * k for k in range(11)]),
    ],
)
def test_catch_up_after_downtime(db: Db, mode: CatchUp, slots: list[float]) -> None:
    """No worker ran for ten minutes and a half: eleven slots passed."""
    add(db, catch_up=mode, overlap=Overlap.ALLOW)
    tick(db, T0 + 630)
    assert [o["slot_at"] for o in occurrences(db)] == slots
    assert len(rows(db, "SELECT id FROM jobs")) == len(slots)
    assert next_fire(db) == T0 + 660  # never drifting: anchored at the start
    skipped = rows(db, "SELECT detail FROM job_events WHERE event = 'schedule_skipped'")
    assert len(skipped) == (0 if mode == CatchUp.ALL else 1)
    tick(db, T0 + 661)  # then on time again, in every mode
    assert occurrences(db)[-1]["slot_at"] == T0 + 660


def test_catch_up_none_still_fires_a_slot_found_on_time(db: Db) -> None:
    add(db, catch_up=CatchUp.NONE)
    assert [f.job_ids for f in tick(db, T0 + 2)] == [[1]]


def test_catch_up_all_is_bounded(db: Db) -> None:
    add(db, every=1.0, catch_up=CatchUp.ALL, overlap=Overlap.ALLOW)
    tick(db, T0 + 10_000)
    found = occurrences(db)
    assert len(found) == firing.CATCH_UP_ALL_MAX
    assert found[-1]["slot_at"] == T0 + 10_000


@pytest.mark.parametrize("state", ["queued", "waiting", "running"])
def test_overlap_skip_skips_a_slot_while_the_previous_job_is_active(db: Db, state: str) -> None:
    add(db)
    (first,) = tick(db, T0)
    set_state(db, first.job_ids[0], state)
    (second,) = tick(db, T0 + 60)
    assert second.job_ids == [] and second.skipped == [T0 + 60]
    assert [o["outcome"] for o in occurrences(db)] == ["fired", "skipped"]
    detail = rows(db, "SELECT detail FROM job_events WHERE event = 'schedule_skipped'")
    assert '"reason":"overlap"' in detail[0][0].replace(" ", "")
    set_state(db, first.job_ids[0], "dead")  # a failed job never blocks the schedule
    (third,) = tick(db, T0 + 120)
    assert len(third.job_ids) == 1


def test_overlap_allow_enqueues_anyway(db: Db) -> None:
    add(db, overlap=Overlap.ALLOW)
    tick(db, T0)
    (second,) = tick(db, T0 + 60)
    assert len(second.job_ids) == 1
    assert [o["outcome"] for o in occurrences(db)] == ["fired", "fired"]


def test_pause_and_resume(db: Db) -> None:
    add(db)
    (first,) = tick(db, T0)
    set_state(db, first.job_ids[0], "done")
    write(db, lambda conn: schedules.pause(conn, "s", "maintenance", T0 + 1))
    assert tick(db, T0 + 300) == []
    shown = write(db, lambda conn: schedules.listing(conn, T0 + 300))[0]
    assert shown["paused"] and shown["paused_reason"] == "maintenance"
    assert shown["next_fire_at"] is None
    write(db, lambda conn: schedules.resume(conn, "s", T0 + 310))
    assert next_fire(db) == T0 + 360  # from the next slot after the resume, anchored
    assert tick(db, T0 + 330) == []
    (fired,) = tick(db, T0 + 360)
    assert len(fired.job_ids) == 1
    events = [r[0] for r in rows(db, "SELECT event FROM job_events WHERE job_id IS NULL")]
    assert events == ["schedule_added", "schedule_paused", "schedule_resumed"]


def test_removal_while_an_occurrence_runs_keeps_the_job_and_fires_no_more(db: Db) -> None:
    add(db)
    (first,) = tick(db, T0)
    set_state(db, first.job_ids[0], "running")
    write(db, lambda conn: schedules.remove(conn, "s", T0 + 5))
    assert tick(db, T0 + 600) == []
    assert rows(db, "SELECT state FROM jobs")[0][0] == "running"
    assert rows(db, "SELECT count(*) FROM schedule_occurrences")[0][0] == 0
    assert rows(db, "SELECT count(*) FROM schedules")[0][0] == 0


def berlin(*args: int, fold: int = 0) -> float:
    return datetime(*args, tzinfo=ZoneInfo("Europe/Berlin"), fold=fold).timestamp()  # type: ignore[misc]


def fire_times(db: Db, start: float, end: float) -> list[str]:
    """Run the duty at every slot from start to end (each found on time)."""
    found: list[float] = []
    now = next_fire(db)
    while now <= end:
        for fired in tick(db, now):
            found += [
                r[0]
                for r in rows(
                    db,
                    "SELECT slot_at FROM schedule_occurrences WHERE job_id = ?",
                    (fired.job_ids[0],),
                )
            ]
        for (job_id,) in rows(db, "SELECT id FROM jobs WHERE state = 'queued'"):
            set_state(db, job_id, "done")
        now = next_fire(db)
    zone = ZoneInfo("Europe/Berlin")
    return [datetime.fromtimestamp(t, zone).isoformat() for t in found if t >= start]


def test_a_local_time_skipped_by_spring_forward_fires_once_after_the_gap(db: Db) -> None:
    """2027-03-28: Berlin's clocks go from 02:00 to 03:00; 02:30 never happens."""
    add(db, cron="30 2 * * *", zone="Europe/Berlin", now=berlin(2027, 3, 26, 12, 0))
    assert fire_times(db, 0, berlin(2027, 3, 30, 12, 0)) == [
        "2027-03-27T02:30:00+01:00",
        "2027-03-28T03:00:00+02:00",
        "2027-03-29T02:30:00+02:00",
        "2027-03-30T02:30:00+02:00",
    ]


def test_a_local_time_repeated_by_fall_back_fires_once(db: Db) -> None:
    """2027-10-31: Berlin's clocks go from 03:00 back to 02:00; 02:00-02:59
    happens twice and each of its slots fires once, the first time."""
    add(db, cron="*/30 2 * * *", zone="Europe/Berlin", now=berlin(2027, 10, 30, 12, 0))
    assert fire_times(db, 0, berlin(2027, 11, 1, 12, 0)) == [
        "2027-10-31T02:00:00+02:00",
        "2027-10-31T02:30:00+02:00",
        "2027-11-01T02:00:00+01:00",
        "2027-11-01T02:30:00+01:00",
    ]


ZONES = [
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "Australia/Lord_Howe",
    "Asia/Kolkata",
    "America/Santiago",
    "Pacific/Chatham",
]
FIELD = {
    "minute": st.sampled_from(["*", "0", "15", "*/7", "5,35", "50-59/3"]),
    "hour": st.sampled_from(["*", "0", "1", "2", "3", "*/5", "1-3", "22"]),
    "dom": st.sampled_from(["*", "1", "15", "28-31", "*/10", "L"]),
    "month": st.sampled_from(["*", "1", "3", "10,11", "*/4"]),
    "dow": st.sampled_from(["*", "0", "1-5", "6", "SUN", "1#2"]),
}


@pytest.mark.sqlite_only("pure time computation: no queue involved")
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    fields=st.fixed_dictionaries(FIELD),
    zone=st.sampled_from(ZONES),
    start=st.floats(1.7e9, 1.9e9),
)
def test_fire_times_are_cronsim_s_in_the_zone(
    fields: dict[str, str], zone: str, start: float
) -> None:
    """The slots are the library's matches in the named zone, less the second
    instance of a wall time the clocks repeated."""
    from cronsim import CronSim

    expr = " ".join(fields[k] for k in ("minute", "hour", "dom", "month", "dow"))
    ours = Recurrence(expr, None, zone, start).upcoming(start, 8)
    tz = ZoneInfo(zone)
    theirs: list[float] = []
    for moment in CronSim(expr, datetime.fromtimestamp(start, tz)):
        if moment.fold == 1 and moment.replace(fold=0).utcoffset() != moment.utcoffset():
            continue
        theirs.append(moment.timestamp())
        if len(theirs) == 8:
            break
    assert ours == theirs
    assert sorted(set(ours)) == ours and ours[0] > start


@pytest.mark.parametrize(
    ("column", "value"),
    [("job", '{"argv": 3}'), ("job", "not json"), ("cron", "99 * * * *"), ("timezone", "No/Where")],
)
def test_a_damaged_schedule_is_paused_with_the_reason_not_fired(
    db: Db, column: str, value: str
) -> None:
    """A row changed by hand must not stop every worker at each poll."""
    add(db)
    if column == "cron":
        execute(db, "UPDATE schedules SET cron = ?, every_s = NULL", (value,))
    else:
        execute(db, f"UPDATE schedules SET {column} = ?", (value,))
    assert tick(db, T0 + 1) == []
    assert tick(db, T0 + 2) == []
    (row,) = rows(db, "SELECT paused_at, paused_reason FROM schedules")
    assert row["paused_at"] == T0 + 1 and row["paused_reason"].startswith("damaged: ")
    assert rows(db, "SELECT count(*) FROM jobs")[0][0] == 0


def test_prune_walks_past_occurrences_batch_after_batch(
    db: Db, monkeypatch: pytest.MonkeyPatch
) -> None:
    from spoolctl.cli.steer import run_prune
    from spoolctl.services import prune as pruning

    add(db)
    schedule_id = rows(db, "SELECT id FROM schedules")[0][0]
    for i in range(7):
        execute(
            db,
            "INSERT INTO schedule_occurrences (schedule_id, slot_at, at, outcome)"
            " VALUES (?, ?, 1, 'skipped')",
            (schedule_id, T0 + 60 * i),
        )
    execute(db, "UPDATE schedules SET last_slot_at = ?", (T0 + 360,))
    monkeypatch.setattr(pruning, "BATCH_SIZE", 2)
    report = pruning.PruneReport()
    queue = open_write(str(db))
    try:
        run_prune(queue, ("done",), 100.0, report, dry_run=False)
    finally:
        queue.engine.dispose()
    assert report.deleted_occurrences == 6
    assert [o["slot_at"] for o in occurrences(db)] == [T0 + 360]
