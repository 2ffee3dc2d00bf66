"""JSON Schemas of each verb's `data`: the hand-written half of the contract.

Flags, types, defaults and bounds come from the click commands themselves (see
`contract_flags.py`); what a verb answers cannot be read from click, so it is
written down here once, next to the envelope's schema. A test runs every verb
with --json and validates its output against these. The schemas use a small
subset of JSON Schema (type, properties, required, items, enum, anyOf,
additionalProperties) and no $ref, so any validator can read them.
"""

from __future__ import annotations

from typing import Any

from spoolctl.errors import ERROR_CODES, WARNING_CODES
from spoolctl.services import job_spec
from spoolctl.states import (
    AttemptState,
    CatchUp,
    ControlAction,
    EventKind,
    FailureReason,
    JobState,
    OccurrenceOutcome,
    Overlap,
)

DIALECT = "https://json-schema.org/draft/2020-12/schema"
Schema = dict[str, Any]

INT: Schema = {"type": "integer"}
NUM: Schema = {"type": "number"}
STR: Schema = {"type": "string"}
BOOL: Schema = {"type": "boolean"}
ANY: Schema = {}


def opt(schema: Schema) -> Schema:
    """The same schema, or null."""
    kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
    nullable = {**schema, "type": [*kinds, "null"]}
    if "enum" in schema:
        nullable["enum"] = [*schema["enum"], None]
    return nullable


def obj(required: dict[str, Schema], optional: dict[str, Schema] | None = None) -> Schema:
    """An object with these keys (more may be added by later versions)."""
    return {
        "type": "object",
        "properties": {**required, **(optional or {})},
        "required": sorted(required),
    }


def arr(items: Schema) -> Schema:
    return {"type": "array", "items": items}


def str_map(values: Schema) -> Schema:
    return {"type": "object", "additionalProperties": values}


def one_of(*values: str) -> Schema:
    return {"type": "string", "enum": [str(v) for v in values]}


JOB_STATE = one_of(*JobState)
COUNTS = obj({s.value: INT for s in JobState})
STR_LIST = arr(STR)
ARGV = opt(arr(STR))


def attributes(written: dict[str, Schema], *, listed: bool = False) -> dict[str, Schema]:
    """The declared job attributes (`services/job_spec.py`) not written out
    by hand in `written` (those are 0.4.11's), each its column's JSON type or
    null (a column added later is null in the rows before it): `show` has
    every column, `list` the attributes declared listed."""
    return {
        f.key: opt({"type": f.json})
        for f in job_spec.STORED
        if f.key not in written and (f.listed or not listed)
    }


LIST_JOB_0411 = {
    "id": INT,
    "argv": ARGV,
    "state": STR,
    "attempts": INT,
    "crashes": INT,
    "max_retries": INT,
    "timeout_seconds": INT,
    "created_at": NUM,
    "started_at": opt(NUM),
    "finished_at": opt(NUM),
    "next_run_at": NUM,
    "priority": INT,
    "queue": STR,
    "cwd": opt(STR),
    "last_exit_code": opt(INT),
    "last_error": opt(STR),
    "idempotency_key": opt(STR),
    "tags": opt(str_map(STR)),
    "note": opt(STR),
    "env_keys": STR_LIST,
}
LIST_JOB = obj(
    LIST_JOB_0411,
    {
        "damaged": STR_LIST,
        "after_jobs": arr(INT),
        "attempts_total": INT,
        **attributes(LIST_JOB_0411, listed=True),
        "suspended_at": opt(NUM),
        "suspended": BOOL,
    },
)
"""`suspended` is true for a running job whose processes are suspended (its
state stays `running`); `suspended_at` is since when, null unless it is."""
SHOW_JOB_0411 = {
    **{k: v for k, v in LIST_JOB_0411.items() if k != "env_keys"},
    "max_crashes": opt(INT),
    "env": opt(str_map(STR)),
    "locked_by": opt(STR),
    "locked_pid": opt(INT),
    "locked_at": opt(NUM),
    "heartbeat_at": opt(NUM),
    "last_failure_reason": opt(STR),
}
SHOW_JOB = obj(
    SHOW_JOB_0411,
    {
        "damaged": STR_LIST,
        "requeues": opt(INT),
        **attributes(SHOW_JOB_0411),
        "suspended_at": opt(NUM),
        "suspended": BOOL,
    },
)

ATTEMPT = obj(
    {
        "attempt_no": INT,
        "state": one_of(*AttemptState),
        "worker_id": STR,
        "worker_pid": INT,
        "started_at": NUM,
        "finished_at": opt(NUM),
        "exit_code": opt(INT),
        "error": opt(STR),
        "failure_reason": opt(one_of(*FailureReason)),
        "stdout_path": STR,
        "stderr_path": STR,
    },
    {"signal": opt(INT), "cgroup": opt(STR), "peak_memory_bytes": opt(INT), "cpu_time_s": opt(NUM)},
)
"""exit_code is null for a timed-out attempt (as in 0.4.11); `signal` is the
signal that ended the job, when one did (15 for a timeout's SIGTERM).
`cgroup` is the attempt's cgroup directories, one a line (the first holds
the kill), where its worker contained it; `peak_memory_bytes` and
`cpu_time_s` what that cgroup measured."""

EVENT = obj(
    {
        "id": INT,
        "job_id": opt(INT),
        "at": NUM,
        "event": one_of(*EventKind),
        "worker_id": opt(STR),
        "detail": ANY,
    }
)
"""job_id is null only for a lane event (paused, resumed, waited_for_server): its detail
names the queue."""

SERVER_WAIT = obj({"waited_s": NUM, "failed_tries": INT, "error": STR})
"""How a worker's start waited for an unreachable database server (PostgreSQL)."""

WORKER = obj(
    {
        "id": STR,
        "hostname": STR,
        "pid": INT,
        "queue": STR,
        "slots": opt(INT),
        "state": STR,
        "started_at": NUM,
        "heartbeat_at": NUM,
        "heartbeat_age_s": NUM,
        "running_jobs": arr(INT),
    },
    {"lane_paused": BOOL, "waited_for_server": opt(SERVER_WAIT), "suspended_jobs": arr(INT)},
)
"""`suspended_jobs`: those of `running_jobs` that are suspended."""

STEERED = obj(
    {
        "job_id": INT,
        "attempt_id": INT,
        "request_id": INT,
        "action": one_of(*ControlAction),
        "delivered_at": opt(NUM),
    },
    {"signal": STR},
)
"""`signal`, `suspend`, `continue`: the request, and when its worker
delivered it (null with --no-wait); `signal` names the signal sent."""
PAUSED_LANE = obj({"queue": STR, "paused_at": NUM, "paused_by": STR, "reason": opt(STR)})
LANE_CHANGE = obj(
    {
        "queue": opt(STR),
        "queues": STR_LIST,
        "paused": BOOL,
        "changed": BOOL,
        "changed_queues": STR_LIST,
        "paused_lanes": arr(PAUSED_LANE),
    },
    {"unknown_queues": STR_LIST},
)
WAITS_FOR = arr(obj({"job_id": INT, "state": JOB_STATE}))

DEAD_JOB = obj(
    {
        "id": INT,
        "command": opt(STR),
        "argv": ARGV,
        "attempts": INT,
        "crashes": INT,
        "last_error": opt(STR),
        "finished_at": opt(NUM),
        "stdout_path": opt(STR),
        "stderr_path": opt(STR),
    }
)

STORED = {"source": {"enum": ["database", "file"]}, "stored_bytes": INT, "stored_truncated": BOOL}
"""PostgreSQL queues: where the bytes shown came from, and the stored copy's size."""
PREVIEW = obj(
    {"path": STR, "size_bytes": INT, "preview": STR, "preview_truncated": BOOL},
    {"missing": BOOL, **STORED},
)
TAIL = obj(
    {"path": opt(STR), "size_bytes": INT, "tail": STR, "truncated": BOOL, "missing": BOOL}, STORED
)


def streams_of(item: Schema) -> Schema:
    return {
        "type": "object",
        "properties": {"stdout": item, "stderr": item},
        "additionalProperties": False,
    }


ADD_ONE = obj(
    {
        "job_id": INT,
        "state": JOB_STATE,
        "deduplicated": BOOL,
        "next_run_at": NUM,
        "priority": INT,
        "queue": STR,
        "cwd": opt(STR),
        "env_keys": STR_LIST,
    },
    {
        "after_jobs": arr(INT),
        "after_jobs_any": arr(INT),
        "idempotency": obj(
            {
                "key": STR,
                "metadata_differs": BOOL,
                "metadata_differences": str_map(obj({"existing": ANY, "submitted": ANY})),
            }
        ),
    },
)
ADD_BATCH = obj({"count": INT, "job_ids": arr(INT)})

WORK_TIMINGS = obj({"db_s": NUM, "spawn_s": NUM, "wall_s": NUM, "jobs": INT})
"""`work --drain` and loop mode: seconds in the database, spawning, and in all,
over `jobs` attempts started (spoolctl/worker/report.py, WorkTimings)."""

DEVICE = obj({"uuid": STR, "index": INT, "model": STR, "memory_bytes": opt(INT)})
"""A GPU as a worker found it (`resources.Device`)."""
INVENTORY = obj({"slots": INT, "memory_bytes": opt(INT), "gpus": INT, "devices": arr(DEVICE)})
"""What a worker with GPUs (`--gpus`) or a memory budget (`--memory`) places jobs on."""
WORK = {
    "anyOf": [
        obj(
            {"claimed": BOOL},
            {
                "job_id": INT,
                "attempt_no": INT,
                "result": STR,
                "job_state": opt(STR),
                "inventory": INVENTORY,
            },
        ),
        obj(
            {"drained": BOOL, "executed": INT, "timings": WORK_TIMINGS},
            {"paused": BOOL, "inventory": INVENTORY},
        ),
        obj({"stopped": BOOL, "executed": INT, "timings": WORK_TIMINGS}, {"inventory": INVENTORY}),
    ]
}

CHECK = obj(
    {
        "id": STR,
        "status": one_of("pass", "warn", "fail", "skip"),
        "message": STR,
        "remediation": opt(STR),
        "blocked_by": opt(STR),
    }
)

ORPHAN = obj(
    {
        "job_id": INT,
        "attempt_id": INT,
        "pid": opt(INT),
        "reason": opt(STR),
        "dead_worker": opt(STR),
        "since": NUM,
    }
)
"""A running job whose dead worker's process could not be confirmed gone."""

SUMMARY = obj({k: INT for k in ("passed", "warnings", "failed", "skipped")})

MIGRATE = {
    "anyOf": [
        obj(
            {
                "from_revision": opt(STR),
                "to_revision": opt(STR),
                "applied": STR_LIST,
                "backup_path": opt(STR),
                "legacy_adopted": BOOL,
            },
            {"quarantined_rows": INT, "quarantined_job_ids": arr(INT)},
        ),
        obj(
            {
                "current": opt(STR),
                "head": STR,
                "pending": STR_LIST,
                "legacy_detected": BOOL,
                "exists": BOOL,
            }
        ),
        obj(
            {
                "head": STR,
                "current": opt(STR),
                "revisions": arr(
                    obj(
                        {
                            "revision": STR,
                            "down_revision": opt(STR),
                            "is_head": BOOL,
                            "is_current": BOOL,
                        }
                    )
                ),
            }
        ),
        obj({"sql": STR, "target": STR, "downgrade": BOOL}),
    ]
}

COPY_TO = obj(
    {
        "source": STR,
        "target": STR,
        "dry_run": BOOL,
        "revision": STR,
        "tables": str_map(INT),
        "rows_total": INT,
        "next_ids": str_map(INT),
        "output": obj(
            {
                "bytes_stored": INT,
                "chunks": INT,
                "cap_bytes": INT,
                "streams_stored": INT,
                "streams_truncated": INT,
                "streams_refused": INT,
                "streams_missing": INT,
                "attempts_missing_output": INT,
                "missing": arr(
                    obj(
                        {
                            "job_id": INT,
                            "attempt_no": INT,
                            "stream": one_of("stdout", "stderr"),
                            "path": STR,
                        }
                    )
                ),
            }
        ),
    }
)
"""copy-to: rows copied per table, the id each sequence gives next, and the
attempts' output stored from the source spool's files."""

WEB_FACTS = {
    "url": STR,
    "host": STR,
    "port": INT,
    "queue": STR,
    "allow_actions": BOOL,
    "token_required": BOOL,
}
"""web: where the dashboard listened; `stopped_by` names the signal that ended it."""

DATA_SCHEMAS: dict[str, Schema] = {
    "add": {"anyOf": [ADD_ONE, ADD_BATCH]},
    "work": WORK,
    "wait": obj(
        {
            "all_succeeded": BOOL,
            "jobs": str_map(
                obj(
                    {
                        "state": JOB_STATE,
                        "attempts": INT,
                        "last_exit_code": opt(INT),
                        "last_error": opt(STR),
                    }
                )
            ),
        }
    ),
    "status": obj(
        {
            "counts": COUNTS,
            "scheduled": INT,
            "queues": str_map(
                obj({"counts": COUNTS, "scheduled": INT}, {"paused": BOOL, "suspended": INT})
            ),
            "recent_dead": arr(DEAD_JOB),
            "workers": arr(WORKER),
            "orphans_unconfirmed": arr(ORPHAN),
        },
        {
            "paused_lanes": arr(PAUSED_LANE),
            "schedules": obj(
                {
                    "count": INT,
                    "next": {**obj({"name": STR, "at": NUM}), "type": ["object", "null"]},
                }
            ),
            "waiting_for_limits": arr(INT),
            "suspended": INT,
        },
    ),
    "list": obj({"count": INT, "jobs": arr(LIST_JOB)}),
    "show": obj(
        {"job": SHOW_JOB, "attempts": arr(ATTEMPT), "events": arr(EVENT)},
        {"after_jobs": WAITS_FOR, "dependents": arr(INT)},
    ),
    "output": obj(
        {
            "job_id": INT,
            "attempt_no": opt(INT),
            "attempt_state": opt(STR),
            "attempts_total": INT,
            "streams": streams_of(PREVIEW),
        },
        {"attempts": arr(ANY)},
    ),
    "feedback": obj(
        {
            "job_id": INT,
            "state": JOB_STATE,
            "terminal": BOOL,
            "succeeded": opt(BOOL),
            "exit_code": opt(INT),
            "failure_reason": opt(STR),
            "last_error": opt(STR),
            "attempts": INT,
            "attempts_total": INT,
            "latest_attempt_no": opt(INT),
            "duration_seconds": opt(NUM),
            "remediation": opt(STR),
            "streams": streams_of(TAIL),
        },
        {"after_jobs": WAITS_FOR},
    ),
    "retry": obj(
        {"job_id": INT, "state": JOB_STATE}, {"previous_state": STR, "restored": arr(INT)}
    ),
    "cancel": obj({"job_id": INT, "state": JOB_STATE, "was_running": BOOL}),
    "signal": STEERED,
    "suspend": STEERED,
    "continue": STEERED,
    "remove": obj({"removed": arr(INT), "count": INT, "dependents_canceled": arr(INT)}),
    "update": obj(
        {
            "jobs": arr(
                obj({"job_id": INT, "changes": str_map({**arr(ANY), "minItems": 2, "maxItems": 2})})
            ),
            "changed": INT,
        }
    ),
    "prune": obj(
        {
            "matched": INT,
            "deleted_jobs": INT,
            "deleted_attempts": INT,
            "deleted_events": INT,
            "freed_bytes": INT,
            "dry_run": BOOL,
        },
        {
            "skipped_paths": STR_LIST,
            "deleted_output_chunks": INT,
            "deleted_output_bytes": INT,
            "deleted_occurrences": INT,
        },
    ),
    "events": obj({"count": INT, "events": arr(EVENT)}),
    "workers": obj(
        {"count": INT, "workers": arr(WORKER), "orphans_unconfirmed": arr(ORPHAN)},
        {"paused_lanes": arr(PAUSED_LANE)},
    ),
    "pause": LANE_CHANGE,
    "resume": LANE_CHANGE,
    "web": obj({**WEB_FACTS, "stopped_by": opt(STR)}),
    "metrics": obj({"output": opt(STR), "bytes": INT, "content_type": STR, "exposition": opt(STR)}),
    "migrate": MIGRATE,
    "copy-to": COPY_TO,
    "doctor": obj(
        {
            "ready": BOOL,
            "summary": SUMMARY,
            "config": opt({"type": "object"}),
            "checks": arr(CHECK),
            "versions": {"type": "object"},
        }
    ),
    "config-show": obj(
        {
            "config_path": STR,
            "config_exists": BOOL,
            "config_valid": BOOL,
            "values": obj({"db_path": opt(STR)}),
            "sources": obj({"db_path": STR}),
            "precedence": STR_LIST,
            "ignored_keys": STR_LIST,
        }
    ),
    "config-validate": obj(
        {
            "config_path": STR,
            "exists": BOOL,
            "valid": BOOL,
            "format": STR,
            "schema_version": ANY,
            "recognized_keys": STR_LIST,
            "unknown_keys": STR_LIST,
        }
    ),
    "brief": obj({"text": STR, "approx_tokens": INT, "budget_tokens": INT}),
    "robot-docs": obj(
        {
            "text": STR,
            "approx_tokens": INT,
            "sections": arr(obj({"title": STR, "bullets": STR_LIST})),
        }
    ),
    "capabilities": obj(
        {
            k: ANY
            for k in (
                "tool_name",
                "tool_version",
                "contract_version",
                "verbs",
                "job_states",
                "attempt_states",
                "failure_reasons",
                "events",
                "exit_codes",
                "error_codes",
                "env",
                "limits",
                "scheduling",
                "config",
            )
        },
        {
            "gpus": obj(
                {"available": BOOL, "library": STR, "module": STR, "extra": STR},
                {"flag": STR, "limited_by": STR, "test_knob": STR},
            )
        },
    ),
    "schema": obj(
        {
            "dialect": STR,
            "envelope_schema": {"type": "object"},
            "verbs": str_map({"type": "object"}),
            "streams": str_map({"type": "object"}),
        }
    ),
}

# The schedule verbs' data.

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

DATA_SCHEMAS.update(SCHEDULE_SCHEMAS)

ERROR = obj(
    {
        "code": one_of(*ERROR_CODES),
        "message": STR,
        "exit_code": INT,
        "detail": {"type": "object"},
        "remediation": STR,
    },
    {"did_you_mean": opt(STR)},
)
WARNING = obj({"code": one_of(*WARNING_CODES), "message": STR})

ENVELOPE: Schema = {
    **obj(
        {
            "ok": BOOL,
            "tool_version": STR,
            "data": ANY,
            "meta": obj(
                {
                    "request_id": STR,
                    "ts_iso": STR,
                    "elapsed_ms": NUM,
                    "contract_version": {"const": "2"},
                    "data_hash": STR,
                },
                {
                    "pagination": obj({"cursor": INT, "first_id": opt(INT)}),
                    "wait": obj(
                        {"reason": one_of("records_available", "timeout"), "waited_ms": INT}
                    ),
                },
            ),
            "warnings": arr(WARNING),
            "commands": {"type": "array", "maxItems": 0},
            "errors": arr(ERROR),
        }
    ),
    "additionalProperties": False,
}

CONTROL = obj({"control": obj({"type": one_of("end", "error"), "reason": STR})})
STREAMS: dict[str, Schema] = {
    "events_follow": {"anyOf": [EVENT, CONTROL]},
    "events_follow_data": EVENT,  # the data frames alone (0.4.11's name for them)
    "output_follow": {
        "anyOf": [obj({"stream": one_of("stdout", "stderr"), "offset": INT, "text": STR}), CONTROL]
    },
    "web_listening": obj({"listening": obj({**WEB_FACTS, "login_url": opt(STR)})}),
}
