"""The data schemas of the `schedule` verbs (merged into schemas.DATA_SCHEMAS)."""

from __future__ import annotations

from spoolctl.cli.schemas import BOOL, INT, NUM, STR, Schema, arr, obj, one_of, opt
from spoolctl.states import CatchUp, OccurrenceOutcome, Overlap

LAST: Schema = {
    **obj({"slot_at": NUM, "job_id": opt(INT), "state": opt(STR)}),
    "type": ["object", "null"],
}
SCHEDULE = obj(
    {
        "name": STR,
        "cron": opt(STR),
        "every_s": opt(NUM),
        "expression": STR,
        "timezone": STR,
        "overlap": one_of(*Overlap),
        "catch_up": one_of(*CatchUp),
        "anchor_at": NUM,
        "created_at": NUM,
        "next_fire_at": opt(NUM),
        "upcoming": arr(NUM),
        "paused": BOOL,
        "paused_at": opt(NUM),
        "paused_reason": opt(STR),
        "last": LAST,
        "job": {"type": "object"},
    }
)
OCCURRENCE = obj(
    {
        "slot_at": NUM,
        "at": NUM,
        "outcome": one_of(*OccurrenceOutcome),
        "job_id": opt(INT),
        "state": opt(STR),
    }
)
CHANGE = {
    **SCHEDULE,
    "properties": {**SCHEDULE["properties"], "changed": BOOL},
    "required": sorted([*SCHEDULE["required"], "changed"]),
}

SCHEDULE_SCHEMAS: dict[str, Schema] = {
    "schedule add": SCHEDULE,
    "schedule list": obj({"count": INT, "schedules": arr(SCHEDULE)}),
    "schedule show": obj({"schedule": SCHEDULE, "occurrences": arr(OCCURRENCE)}),
    "schedule pause": CHANGE,
    "schedule resume": CHANGE,
    "schedule remove": obj({"name": STR, "removed": BOOL}),
    "schedule run": obj({"name": STR, "job_id": INT, "slot_at": NUM}),
}
