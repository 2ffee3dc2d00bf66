"""The prose half of `capabilities`: what each code means, how each verb treats
safety and streams, and the probe vocabulary, in the vocabulary of 0.4.11's
contract (whose key paths are the floor: docs/design.md, The contract and
how it grows).

Facts that the code defines (flags, bounds, defaults, codes, states) are not
repeated here: `capabilities.py` reads them from the click tree, `validate`,
`errors` and `states`. What lives here is what no code can say about itself.
"""

from __future__ import annotations

from typing import Any

CONTRACT_POLICY = (
    "contract_version 2 is additive: new verbs, flags, keys and enum values may appear; no key "
    "of 0.4.11's JSON is removed or retyped, and the same input gives the same exit and error "
    "code, except the differences listed in docs/json-contract.md. Unsafe destructive actions "
    "are refused without confirmation, flags are never abbreviated, and malformed input always "
    "gets a structured error."
)

EXPECT_INPUT = {"code": "INVALID_INPUT", "exit_code": 1}
EXPECT_MISSING = {"code": "MISSING_REQUIRED", "exit_code": 1}

# code -> (summary, retryable, example)
CODE_NOTES: dict[str, tuple[str, bool | None, str]] = {
    "INVALID_INPUT": (
        "A supplied value has the wrong type, range, enum, or grammar.",
        False,
        "spoolctl output --json 1 --stream stdou",
    ),
    "MISSING_REQUIRED": (
        "A required verb, flag value, or positional argument is absent.",
        False,
        "spoolctl --json",
    ),
    "NOT_FOUND": (
        "The requested job or attempt does not exist.",
        False,
        "spoolctl show 999 --json",
    ),
    "UNKNOWN_COMMAND": (
        "The requested verb is not implemented by this CLI.",
        False,
        "spoolctl statu --json",
    ),
    "UNKNOWN_FLAG": (
        "A flag is not accepted by the selected verb.",
        False,
        "spoolctl status --jsno",
    ),
    "SAFETY_BLOCK": (
        "A destructive or interrupting action was refused without confirmation.",
        False,
        "spoolctl cancel 1 --json while job 1 is running",
    ),
    "INTERNAL": (
        "A bug in spoolctl, and nothing else: please report it.",
        None,
        "none: every known case has its own code",
    ),
    "SCHEMA_OUTDATED": (
        "The queue file is older than this spoolctl: run spoolctl migrate.",
        False,
        "spoolctl status --json on a 0.4.11 queue file",
    ),
    "SCHEMA_TOO_NEW": (
        "The queue file is newer than this spoolctl: upgrade spoolctl.",
        False,
        "spoolctl status --json after a newer spoolctl migrated the file",
    ),
    "LOCKED": (
        "The queue database stayed busy beyond the lock timeout.",
        True,
        "spoolctl add --json -- true during a long write lock",
    ),
    "TIMEOUT": (
        "A wait-style operation exceeded its time budget.",
        True,
        "spoolctl wait 1 --timeout 0.1 --json",
    ),
    "CONFLICT": (
        "The requested change conflicts with the job's current state.",
        False,
        "spoolctl retry 1 --json when job 1 is queued",
    ),
    "IDEMPOTENCY_CONFLICT": (
        "An active idempotency key was reused with a different command.",
        False,
        "spoolctl add --key daily -- false while daily runs true",
    ),
    "DB_UNUSABLE": (
        "The file or database is not a spoolctl queue, is damaged, unreadable, "
        "read-only where a write is needed, or the login is refused "
        "(detail.reason says which).",
        False,
        "spoolctl status --json --db notes.txt",
    ),
    "UNREACHABLE": (
        "The database server did not answer or dropped the connection.",
        True,
        "spoolctl status --json --db postgresql://localhost:1/q",
    ),
    "EXTRA_MISSING": (
        "An optional part is not installed: detail.install is the command that installs it.",
        False,
        "spoolctl web --json without the web extra",
    ),
    "IDEMPOTENCY_METADATA_DIFFERS": (
        "An idempotent add matched an active job whose tags, note "
        "or schedule differ; they were kept.",
        None,
        "spoolctl add --key daily --note changed -- true",
    ),
    "KILL_ASYNC": (
        "A running job was canceled; its process group is killed asynchronously.",
        None,
        "spoolctl cancel --running --yes 1 --json",
    ),
    "NO_ATTEMPTS_YET": (
        "The job exists but has not run, so there is no output yet.",
        None,
        "spoolctl output 1 --json before a worker runs job 1",
    ),
    "OUTPUT_PATH_REFUSED": (
        "A recorded output path lies outside the spool and was not read.",
        None,
        "spoolctl output 1 --json on a tampered queue file",
    ),
    "NO_QUEUE": (
        "A read verb found no queue where --db points (none was created): its "
        "answer is empty; check --db if another queue was meant.",
        None,
        "spoolctl status --json --db no/such/queue.db",
    ),
    "DEPENDENCY_FAILED": (
        "add --after-job named a job that already ended dead or canceled: "
        "the new job was created canceled.",
        None,
        "spoolctl add --after-job 1 --json -- true when job 1 is dead",
    ),
    "CONFIG_UNKNOWN_KEY": ("Unknown config file key: ignored.", None, "spoolctl status --json"),
    "HERE_ENV_SKIPPED": ("add --here skipped variables an env cannot hold.", None, "add --here"),
    "UNPLACEABLE": ("No live worker of its lane could hold the job: it waits.", None, "feedback"),
}

# Codes 0.4.11 published that this version never emits (appears_in is empty).
RETIRED_CODES: dict[str, tuple[str, bool | None, str]] = {
    "TAG_FILTER_SCAN_CAPPED": (
        "Never emitted since 0.5: list --tag filters in SQL over every "
        "job, so no later match is omitted.",
        None,
        "spoolctl list --tag owner=agent --limit 0 --json",
    ),
}

EXIT_NOTES: dict[int, dict[str, Any]] = {
    0: {"retryable": None},
    1: {"retryable": False},
    2: {"retryable": False},
    3: {
        "retryable": None,
        "note": "doctor answers ok:true with data.ready:false and exit 3 "
        "when not ready; every other exit 3 is ok:false with errors",
    },
    4: {"retryable": True},
    5: {"retryable": False},
    6: {
        "retryable": False,
        "note": "wait only: the envelope stays ok:true; data says which jobs did not succeed",
    },
}

TEXT_MODE = {
    "mode": "text",
    "contract": "human-readable stdout on success; diagnostics on stderr for errors",
}
PROBE_HINTS = {
    "categories": [
        "unknown_flag",
        "missing_value",
        "bad_type",
        "missing_positional",
        "mutually_exclusive",
        "env_var",
        "output_mode_success",
    ],
    "timeout_seconds": 5,
    "json_failure_verdict": {
        "ok": False,
        "stdout": "parseable envelope",
        "stderr": "empty",
        "traceback_allowed": False,
    },
}

FOLLOW_FRAMES = {
    "enter_with": ["--follow", "--json"],
    "record_schema": "#/streams/events_follow",
    "frame_discriminator": "data frames carry integer id; control frames carry object "
    "control and never carry id",
    "control_frames": ["end", "error"],
    "control_shape": {"control": {"type": "end|error", "reason": "max_events|idle_timeout|…"}},
    "cursor": {"field": "id", "flag": "--since-id", "aliases": ["--since-cursor"]},
    "delivery": "best-effort-tail-over-replayable-ledger",
    "defaults": {
        "follow_start": "high-water mark unless --since-id/--since-cursor is supplied",
        "one_shot_start": "beginning unless --since-id/--since-cursor is supplied",
    },
    "termination": {
        "signals": ["SIGINT", "SIGTERM", "EPIPE"],
        "max_events": "a final end control frame with reason max_events",
        "idle_timeout": "a final end control frame with reason idle_timeout",
        "interrupted": "SIGINT/SIGTERM: a final end control frame with reason interrupted",
        "unreachable": "a server that does not answer is waited for while the "
        "idle timeout runs, then a final error control frame",
    },
    "ordering": "end appears exactly once and last on a bounded ending",
}

# Per-verb annotations that are not parameters: keys of 0.4.11's verb objects.
VERB_NOTES: dict[str, dict[str, Any]] = {
    "events": {
        "output_modes": ["envelope", "frames", "text"],
        "frames": FOLLOW_FRAMES,
        "frames_mode": FOLLOW_FRAMES,
        "raw": {"deprecated": True, "replaced_by": "frames"},
        "raw_legacy": {
            "delivery_class": "best-effort-tail over replayable-from-cursor ledger",
            "mode": "ndjson",
            "record": "contract v2 uses frames with control frames",
            "stream": "events_follow_data",
            "when": "not available in contract 2",
        },
        "since_cursor_alias": "--since-cursor",
        "probe_hints": {
            **PROBE_HINTS,
            "frames_success": [
                "seed the ledger, then events --follow --json --since-id 0 --max-events 1",
                "events --follow --json --idle-timeout 0.1 on an empty ledger",
            ],
        },
    },
    "output": {
        "output_modes": ["envelope", "raw", "text"],
        "raw": {
            "enter_with": ["--raw"],
            "incompatible_with": ["--json"],
            "requires": {"--stream": ["stdout", "stderr", "both"]},
            "delivery_class": "raw captured bytes",
            "failure_stdout": "no diagnostic text or JSON",
        },
    },
    "cancel": {
        "interrupts_process": "only with --running",
        "safety": {
            "confirmation_flag": "--yes",
            "requires": ["--running", "--yes"],
            "refusal_code": "SAFETY_BLOCK",
            "refusal_exit_code": 2,
            "queued_cancel": {"destructive": False, "interrupts_process": False},
        },
    },
    "prune": {
        "safety": {
            "confirmation_flag": "--yes",
            "dry_run_flag": "--dry-run",
            "refusal_code": "SAFETY_BLOCK",
            "refusal_exit_code": 2,
            "invalid_combinations": [{"flags": ["--yes", "--dry-run"], "code": "INVALID_INPUT"}],
        },
    },
    "retry": {
        "safety": {
            "force_flag": "--force",
            "force_required_for": "running_job",
            "refusal_code": "SAFETY_BLOCK",
            "refusal_exit_code": 2,
            "also_requires_yes": False,
        },
    },
    "add": {"stdin": "NDJSON jobs with --batch -"},
}

# Positionals under the names 0.4.11 published for them.
ARG_NAMES = {"job_id": "id", "job_ids": "ids", "topic": "robot_docs_command"}

# (verb, parameter) -> what a flag's entry says beyond its type.
FLAG_NOTES: dict[tuple[str, str], dict[str, Any]] = {
    ("feedback", "stream"): {
        "affects": "text rendering only; the JSON payload always carries both streams"
    },
    ("doctor", "db"): {
        "opens_database": "read-only readiness probes; never creates or migrates",
        "unopenable_path": "readiness outcome: ok:true, data.ready:false, exit 3",
    },
    ("config-show", "db"): {
        "opens_database": False,
        "unopenable_path": "reported as the resolved path, never opened",
    },
}

FEATURES = [
    "json_envelope",
    "schema_export",
    "did_you_mean",
    "event_ledger",
    "raw_output",
    "robot_docs",
    "idempotency_keys",
    "destructive_gates",
    "probeable_surface",
    "batch_submit",
    "lanes",
    "schedules",
    "after_job_any",
]
OUTPUT_MODES = ["envelope", "frames", "raw", "text"]

TOTALITY = {
    "envelope": {
        "selector": "--json",
        "failure_stdout": "one parseable JSON envelope",
        "failure_stderr": "empty",
        "traceback_allowed": False,
    },
    "frames": {
        "implemented": True,
        "failure_stdout": "valid NDJSON frames ending with a control frame",
        "traceback_allowed": False,
    },
    "raw": {
        "failure_stdout": "empty or raw payload only; diagnostics stay on stderr",
        "traceback_allowed": False,
    },
    "text": {
        "selector": "default",
        "failure_stdout": "not a machine surface",
        "failure_stderr": "spoolctl: CODE: message, then a hint",
        "traceback_allowed": False,
    },
}

PROBE_VOCABULARIES = {
    "boolean": {
        "invalid": [],
        "notes": "flags are presence-only; missing-value probes do not apply",
    },
    "duration": {"invalid": ["-1", "1D", "1e400", ""], "valid": "1s"},
    "integer": {
        "invalid": ["1_000", "0x10", "", "1.0"],
        "out_of_range_high": "9223372036854775808",
        "out_of_range_low": "-9223372036854775809",
        "valid": "1",
    },
    "float": {"invalid": ["nan", "-nan", "inf", "-inf", "", "abc"], "valid": "0.1"},
    "key_value": {"invalid": ["missing-equals", "=value"], "valid": "k=v"},
    "path": {"invalid": ["", "bad\u0000path"], "valid": "."},
    "queue": {"invalid": ["", " bad", "bad name", "-bad"], "valid": "default"},
    "string": {"invalid": [""], "valid": "x"},
    "timestamp": {"invalid": ["not-a-time", "nan", "inf", "1e9999"], "valid": "1700000000"},
}

EXECUTION = {
    "cwd": {
        "flag": "--cwd DIR",
        "default": None,
        "resolution": "made absolute at submit time; symlinks are not collapsed",
        "runtime_failure": "a missing directory at run time is a spawn_failed attempt, "
        "governed by --max-retries",
    },
    "env_overrides": {
        "flag": "--env K=V",
        "repeatable": True,
        "semantics": "layered over the worker's environment at run time",
        "values_stored_plaintext": True,
        "values_in_add_or_list": False,
        "values_in_show": True,
        "grammar": "split on the first '='; key 1-128 chars; value <= 4096; no "
        "NUL; later duplicates win",
    },
    "retry_model": {
        "attempts": "unsuccessful executions so far: job-owned failures plus crashes",
        "job_owned_failures": "non-zero exit, timeout or spawn failure",
        "worker_crashes": "reaps of a confirmed-dead worker; counted in crashes",
        "max_retries": "bounds job-owned failures only",
        "max_crashes": {
            "default": None,
            "meaning": "worker crashes tolerated before dead; null is unbounded",
            "zero": "the first crash dead-letters",
            "one": "the first crash requeues, the second dead-letters",
        },
        "backoff": "failures and crash redeliveries both wait backoff_seconds(attempts)",
        "wait_drain": "with unbounded crashes a job that always crashes keeps wait and "
        "work --drain open until it is canceled",
    },
}

DB_SCOPE = "--db is verb-local on the verbs that touch the queue, not global"
