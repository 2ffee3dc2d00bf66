"""`capabilities`: the machine-readable contract (verbs and their flags,
states, codes, limits, environment, scheduling), built from the click tree,
the data schemas and the constants each fact is defined by."""

from __future__ import annotations

import shlex
from typing import Any

import click

from spoolctl import __version__, validate
from spoolctl.cli.contract import verb_commands
from spoolctl.cli.contract_flags import flag_entry, flag_of, param_info
from spoolctl.cli.contract_policy import (
    CODE_NOTES,
    CONTRACT_POLICY,
    DB_SCOPE,
    EXECUTION,
    EXIT_NOTES,
    EXPECT_INPUT,
    FEATURES,
    FLAG_NOTES,
    OUTPUT_MODES,
    PROBE_HINTS,
    PROBE_VOCABULARIES,
    RETIRED_CODES,
    TEXT_MODE,
    TOTALITY,
    VERB_NOTES,
)
from spoolctl.cli.options import SpoolCommand, json_option, verb
from spoolctl.cli.reply import CONTRACT_VERSION, Reply, emit
from spoolctl.cli.schemas import DATA_SCHEMAS
from spoolctl.config import (
    CONFIG_KEYS,
    CONFIG_RELPATH,
    CONFIG_VERSION,
    DEFAULT_DB_RELPATH,
    DEFAULT_HANG_THRESHOLD_S,
    DEFAULT_HEARTBEAT_INTERVAL_S,
    ENV_VARS,
    MIN_REAP_THRESHOLD_S,
    PRECEDENCE,
)
from spoolctl.errors import (
    DB_UNUSABLE_REASONS,
    ERROR_CLASSES,
    EXIT_CODES,
    WARNING_CODES,
    StorageFault,
)
from spoolctl.runner import gpus
from spoolctl.services import backoff, fire_times, firing
from spoolctl.services.job_spec import (
    DEFAULT_LANE,
    DEFAULT_MAX_REQUEUES,
    DEFAULT_MAX_RETRIES,
    DEFAULT_TIMEOUT_S,
)
from spoolctl.states import AttemptState, EventKind, FailureReason, JobState

EXTRA_EXIT_CODES: dict[str, tuple[int, ...]] = {
    "add": (4, 5),
    "work": (4,),
    "wait": (4, 6),
    "retry": (2, 4, 5),
    "cancel": (2, 4, 5),
    "remove": (4, 5),
    "update": (4, 5),
    "prune": (2, 4),
    "migrate": (2, 4),
    "events": (4,),
    "output": (4,),
    "feedback": (4,),
    "status": (4,),
    "list": (4,),
    "show": (4,),
    "workers": (4,),
    "copy-to": (4, 5),
    "web": (2, 4),
}


def data_keys(name: str) -> str:
    """The keys of a verb's data, as one line: `{a, b} or {c}`."""
    schema = DATA_SCHEMAS.get(name, {})
    shapes = schema.get("anyOf", [schema])
    return " or ".join("{" + ", ".join(sorted(s.get("properties", {}))) + "}" for s in shapes)


def verb_info(name: str, command: SpoolCommand) -> dict[str, Any]:
    params = [param_info(p) for p in command.params]
    flags = [
        {**flag_entry(p), **FLAG_NOTES.get((name, p.name or ""), {})}
        for p in command.params
        if isinstance(p, click.Option)
    ]
    args = [flag_entry(p) for p in command.params if isinstance(p, click.Argument)]
    summary = (command.help or "").split("\n")[0]
    ref = f"spoolctl schema --json --verb {name}"
    exclusive = [[flag_of(command, a), flag_of(command, b)] for a, b in command.exclusive]
    info = {
        "name": name,
        "summary": summary,
        "description": summary,
        "options": [p for p in params if p["kind"] == "option"],
        "positionals": args,
        "args": args,
        "flags": sorted(flags, key=lambda f: f["name"].lstrip("-")),
        "exclusive": exclusive,
        "mutually_exclusive": exclusive,
        "traits": command.traits,
        **command.traits,
        "examples": [shlex.split(e) for e in command.examples],
        "exit_codes": sorted({0, 1, 3, *EXTRA_EXIT_CODES.get(name, ())}),
        "json": {"flag": "--json", "mode": "envelope", "schema_ref": ref},
        "schema_ref": ref,
        "data_schema": data_keys(name),
        "output_schema": DATA_SCHEMAS.get(name, {}),
        "output_modes": ["envelope", "text"],
        "stdin": "none",
        "text": TEXT_MODE,
        "probe_hints": PROBE_HINTS,
    }
    info.update(VERB_NOTES.get(name, {}))
    return info


def global_flags() -> dict[str, Any]:
    common = {
        "type": "boolean",
        "required": False,
        "default": False,
        "minimum": None,
        "maximum": None,
        "unbounded": False,
        "value_required": False,
        "repeatable": False,
        "choices": None,
        "malformed_expectations": {},
        "output_modes": ["text"],
    }
    return {
        "flags": [
            {"name": f, "flag": f, "aliases": [f], **common} for f in ("--help", "--version")
        ],
        "db_scope": DB_SCOPE,
    }


def containment_data() -> dict[str, Any]:
    """Which containment a worker started here now would get, and why (judged
    without making a cgroup: access checks only)."""
    from spoolctl.runner import containment

    return containment.report().as_dict()


def capabilities_data() -> dict[str, Any]:
    verbs = verb_commands()
    return {
        "tool_name": "spoolctl",
        "tool_version": __version__,
        "contract_version": CONTRACT_VERSION,
        "contract_policy": CONTRACT_POLICY,
        "verbs": {n: verb_info(n, c) for n, c in verbs.items()},
        "global_flags": global_flags(),
        "job_states": [s.value for s in JobState],
        "attempt_states": [s.value for s in AttemptState],
        "failure_reasons": [s.value for s in FailureReason],
        "events": [s.value for s in EventKind],
        "exit_codes": {
            str(k): {"meaning": v, **EXIT_NOTES.get(k, {})} for k, v in EXIT_CODES.items()
        },
        "error_codes": [c.code for c in ERROR_CLASSES],
        "warning_codes": [{"code": k, "message": v} for k, v in WARNING_CODES.items()],
        "code_registry": code_registry(),
        "env": {name: var["description"] for name, var in ENV_VARS.items()},
        "env_vars": env_vars(verbs),
        "limits": published_limits(),
        "scheduling": scheduling(),
        "execution": EXECUTION,
        "containment": containment_data(),
        "gpus": gpus.discovery(),
        "features": FEATURES,
        "output_modes": OUTPUT_MODES,
        "probe_vocabularies": PROBE_VOCABULARIES,
        "totality": TOTALITY,
        "robot_docs_uri": "spoolctl robot-docs guide",
        "schemas_uri": "spoolctl schema --json",
        "config": {
            "supported": True,
            "file": str(CONFIG_RELPATH),
            "path": str(CONFIG_RELPATH),
            "format": "json",
            "version": CONFIG_VERSION,
            "schema_version": CONFIG_VERSION,
            "keys": list(CONFIG_KEYS),
            "precedence": list(PRECEDENCE),
            "default_db": str(DEFAULT_DB_RELPATH),
        },
    }


def code_registry() -> dict[str, dict[str, Any]]:
    """Every error and warning code: where it appears, what it means, an example."""
    registry: dict[str, dict[str, Any]] = {}
    for cls in ERROR_CLASSES:
        summary, retryable, example = code_notes(cls.code)
        registry[cls.code] = {
            "appears_in": ["errors"],
            "summary": summary,
            "exit_code": cls.exit_code,
            "retryable": retryable,
            "example": example,
        }
        if cls is StorageFault:
            registry[cls.code]["reasons"] = dict(DB_UNUSABLE_REASONS)
    for code in WARNING_CODES:
        summary, retryable, example = code_notes(code)
        registry[code] = {
            "appears_in": ["warnings"],
            "summary": summary,
            "retryable": retryable,
            "example": example,
        }
    for code, (summary, retryable, example) in RETIRED_CODES.items():
        registry[code] = {
            "appears_in": [],
            "summary": summary,
            "retryable": retryable,
            "example": example,
        }
    return dict(sorted(registry.items()))


def code_notes(code: str) -> tuple[str, bool | None, str]:
    """A code's summary, retryability and example (contract_problems reports
    a code that has none yet, rather than capabilities failing)."""
    fallback = WARNING_CODES.get(code, code.replace("_", " ").lower())
    return CODE_NOTES.get(code, (fallback, None, ""))


def env_vars(verbs: dict[str, SpoolCommand]) -> dict[str, dict[str, Any]]:
    """Each environment variable with its type, default, bounds and readers."""
    queue_verbs = sorted(n for n, c in verbs.items() if any(p.name == "db" for p in c.params))
    published = {}
    for name, var in ENV_VARS.items():
        numeric = var["type"] == "seconds"
        published[name] = {
            **var,
            "type": "float" if numeric else var["type"],
            "required": False,
            "default": var.get("default"),
            "minimum": var.get("min", var.get("min_exclusive")),
            "maximum": var.get("max"),
            "unbounded": False,
            "shadowed_by": "--db" if name == "SPOOLCTL_DB" else None,
            "consumed_by": consumers(name, var, queue_verbs),
            "malformed_expectations": {
                "bad_path" if name == "SPOOLCTL_DB" else "bad_type": EXPECT_INPUT
            },
        }
        if numeric:
            published[name]["grammar"] = (
                "finite float > 0" if "min_exclusive" in var else ("finite float >= 0")
            )
    return published


def consumers(name: str, var: dict[str, Any], queue_verbs: list[str]) -> list[str]:
    """Which verbs read an environment variable: `work`, unless ENV_VARS says
    every verb that opens a queue does, or names the verbs (`read_by`)."""
    if name in ("SPOOLCTL_DB", "SPOOLCTL_BUSY_TIMEOUT", "SPOOLCTL_AUTO_MIGRATE"):
        return queue_verbs
    if var.get("every_queue_verb"):
        return queue_verbs
    return list(var.get("read_by", ["work"]))


def limit_entry(word: str, low: float | None, high: float | None, **more: Any) -> dict[str, Any]:
    return {"type": word, "minimum": low, "maximum": high, "unbounded": high is None, **more}


def published_limits() -> dict[str, dict[str, Any]]:
    """Ours (min/max, as validate.LIMITS says) and 0.4.11's names (type/minimum/
    maximum/unbounded), all read from the same constants."""
    v = validate
    ours = {
        name: {
            **entry,
            **limit_entry(
                "",
                entry.get("min", entry.get("min_length", entry.get("min_exclusive"))),
                entry.get("max", entry.get("max_length")),
            ),
        }
        for name, entry in v.LIMITS.items()
    }
    for name, word in (
        ("duration_seconds", "duration"),
        ("priority", "integer"),
        ("timeout_seconds", "integer"),
        ("wait_seconds", "float"),
        ("poll_interval_seconds", "float"),
    ):
        ours[name]["type"] = word
    for name in ("wait_seconds", "poll_interval_seconds"):
        ours[name]["grammar"] = (
            "finite float > 0" if "min_exclusive" in v.LIMITS[name] else ("finite float >= 0")
        )
    named = {
        "attempt_number": limit_entry("integer", 1, v.INT64_MAX),
        "cwd_length": limit_entry("path", 1, v.CWD_MAX),
        "env_key_length": limit_entry("string", 1, v.ENV_KEY_MAX),
        "env_value_length": limit_entry("string", 0, v.ENV_VALUE_MAX),
        "feedback_tail_bytes": limit_entry("integer", 1, 65_536, default=2048),
        "id": {**v.LIMITS["id"], **limit_entry("integer", 1, v.INT64_MAX)},
        "idempotency_key_length": limit_entry(
            "string", 1, v.KEY_MAX, charset="printable; no control characters"
        ),
        "limit": limit_entry("integer", 0, 1000),
        "event_limit": limit_entry("integer", 0, 10_000),
        "status_limit": limit_entry("integer", 0, 1000),
        "note_length": limit_entry("string", 0, v.NOTE_MAX),
        "queue_name": limit_entry("queue", 1, v.LANE_MAX, charset=v.LANE_RE.pattern),
        "tag_count": limit_entry("integer", 0, v.TAG_MAX_COUNT),
        "tag_key_length": limit_entry("string", 1, v.TAG_KEY_MAX, charset="any but NUL"),
        "tag_value_length": limit_entry("string", 0, v.TAG_VALUE_MAX),
        "timestamp_epoch_seconds": limit_entry(
            "timestamp",
            -v.MAX_DURATION_S,
            v.MAX_DURATION_S,
            grammar="epoch seconds or ISO-8601; a past time means now",
        ),
        "worker_slots": limit_entry("integer", 1, v.INT64_MAX),
        "worker_id_length": limit_entry("string", 1, v.WORKER_ID_MAX, charset="any but NUL"),
    }
    return {**ours, **named}


def scheduling() -> dict[str, Any]:
    return {
        "claim_order": ["priority DESC", "next_run_at", "id"],
        "backoff": {
            "formula": "min(cap, base * 2**(attempts-1)) seconds",
            "base_s": backoff.BACKOFF_BASE_S,
            "cap_s": backoff.BACKOFF_CAP_S,
            "first_delays_s": [backoff.backoff_seconds(n) for n in range(1, 8)],
        },
        "defaults": {
            "timeout_s": DEFAULT_TIMEOUT_S,
            "max_retries": DEFAULT_MAX_RETRIES,
            "max_crashes": None,
            "priority": 0,
            "queue": DEFAULT_LANE,
            "max_requeues": DEFAULT_MAX_REQUEUES,
        },
        "retry_budgets": {
            "max_retries": "job-owned failures (non-zero exit, timeout, spawn failure) "
            "beyond this go dead",
            "max_crashes": "worker crashes beyond this go dead; null is unbounded",
            "max_requeues": "exits with a --requeue-exit code requeue at once without "
            "spending max_retries, this many times; beyond it they are failures",
            "manual_retry": "retry ID requeues dead/failed/canceled with a fresh budget "
            "(requeues too); "
            "running needs --force; done needs --again (a new attempt of the same job)",
        },
        "heartbeat_interval_s": DEFAULT_HEARTBEAT_INTERVAL_S,
        "reap_threshold": f"max(4 * heartbeat_interval, {MIN_REAP_THRESHOLD_S:g}) seconds",
        "hang_threshold_s": DEFAULT_HANG_THRESHOLD_S,
        "duration_grammar": "<number>[s|m|h|d] or bare seconds; lowercase units only",
        "at_timestamp": "epoch seconds or ISO-8601; naive means local time; past means now",
        "finite_numeric_inputs": ["--after", "--at", "--timeout", "--poll-interval"],
        "priority": {
            "default": 0,
            "min": validate.INT32_MIN,
            "max": validate.INT32_MAX,
            "ordering": "higher priority first, then next_run_at, then id",
        },
        "queue": {
            "default": DEFAULT_LANE,
            "grammar": f"1-{validate.LANE_MAX} chars matching {validate.LANE_RE.pattern}",
            "single_lane_worker": True,
        },
        "slots": {
            "claimed_false": "work --once --json {claimed:false}: nothing runnable now, "
            "a full slot ceiling included",
            "default_ceiling": None,
            "fleet_global": True,
            "opt_in": True,
            "scope": "served lane",
        },
        "schedules": {
            "fired_by": "every running work process, at most once per poll "
            "interval; exactly one job per (schedule, slot) by a unique index",
            "cron_fields": fire_times.CRON_FIELDS,
            "min_every_s": fire_times.MIN_EVERY_S,
            "catch_up_all_max": firing.CATCH_UP_ALL_MAX,
            "catch_up_none_on_time_s": firing.ON_TIME_S,
            "library": "cronsim",
            "env": [firing.SCHEDULE_ENV, firing.SCHEDULED_FOR_ENV],
            "tag": f"{firing.SCHEDULE_TAG}=NAME",
        },
        "scheduled": {
            "counts_included_in": "counts.queued",
            "includes": ["user-delayed rows", "retry and reap backoff rows"],
            "predicate": "state='queued' AND next_run_at > now",
        },
        "drain": {
            "holds_for": [
                "running jobs of the served lane",
                "due queued jobs of the served lane",
                "retry backoff pending in the served lane",
            ],
            "scope": "served lane",
            "skips": "user-delayed jobs that never ran",
            "paused_lane": "returns at once: drained false, paused true",
        },
        "lanes": {
            "pause": "spoolctl pause QUEUE|--all [--reason TEXT]",
            "resume": "spoolctl resume QUEUE|--all",
            "while_paused": "no worker claims from the lane; running jobs finish; add still queues",
            "idempotent": True,
            "shown_in": [
                "status.paused_lanes",
                "status.queues.<queue>.paused",
                "workers.paused_lanes",
                "workers.workers[].lane_paused",
                "events paused/resumed (job_id null, detail.queue)",
            ],
        },
        "dependencies": {
            "flag": "add --after-job ID (repeatable; existing jobs only)",
            "batch": 'after_jobs: [ID or "@LINE" (an earlier line)]',
            "state": "waiting until every named job is done, then queued",
            "on_parent_failure": "dead or canceled parent: canceled with failure "
            "reason dependency_failed and event dependency_failed, transitively",
            "retry": "retry ID --with-dependents restores them",
            "claim_cost": "none: waiting jobs are outside the claim index range",
        },
    }


@verb("capabilities", examples=("spoolctl capabilities --json",))
@json_option
def capabilities(as_json: bool) -> int:
    """The machine-readable contract: verbs, flags, states, codes, limits, env."""
    data = capabilities_data()
    text = "\n".join(f"{v['name']:<16} {v['summary']}" for v in data["verbs"].values())
    return emit(Reply(data, text=text + "\n(use --json for the full contract)"), as_json)
