"""Operator verbs that never change the queue: doctor, config-show, config-validate."""

from __future__ import annotations

import platform
import sqlite3
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click
import sqlalchemy

from spoolctl import __version__
from spoolctl.cli.options import BoundedText, db_option, json_option, verb
from spoolctl.cli.render import style, table
from spoolctl.cli.reply import CONTRACT_VERSION, Reply, emit
from spoolctl.config import (
    CONFIG_KEYS,
    CONFIG_VERSION,
    PRECEDENCE,
    ConfigFile,
    Timing,
    auto_migrate,
    busy_timeout_s,
    read_config,
)
from spoolctl.db import revision
from spoolctl.db.backends.base import Check, Driver
from spoolctl.db.legacy import LEGACY_VERSIONS
from spoolctl.db.location import DbLocation, config_location, locate_db, resolve_db
from spoolctl.db.queue import open_for_read
from spoolctl.db.where import RULES, current_folder, project_config
from spoolctl.errors import EXIT_OK, EXIT_TOOL, InvalidInput, SpoolError
from spoolctl.services import placement_reads, placement_views, query
from spoolctl.services.job_defaults import config_defaults

SOURCE_NAMES = {
    "flag": "flag",
    "env": "environment",
    "config": "project_config",
    "default": "default",
}
"""Our source names -> 0.4.11's (`db_source` keeps its words; `source` ours)."""
SCHEMA_VERSION = max(LEGACY_VERSIONS) + len(
    revision.revisions_between(None, revision.HEAD_REVISION)
)
"""An integer schema version continuing 0.4.11's line: its six `meta`
versions, then one per alembic revision up to head."""


@verb("doctor", examples=("spoolctl doctor", "spoolctl doctor --json"))
@db_option
@json_option
def doctor(db: str | None, as_json: bool) -> int:
    """Read-only readiness checks; exit 0 when ready, 3 when not.

    Never creates or changes anything, and answers ok:true either way: read
    data.ready.
    """
    checks, location = run_checks(db)
    failed = [c for c in checks if c.status == "fail"]
    summary = {
        "passed": sum(c.status == "pass" for c in checks),
        "warnings": sum(c.status == "warn" for c in checks),
        "failed": len(failed),
        "skipped": sum(c.status == "skip" for c in checks),
    }
    data = {
        "ready": not failed,
        "summary": summary,
        "config": doctor_config(location),
        "checks": [asdict(c) for c in checks],
        "versions": versions(),
    }
    exit_code = EXIT_OK if not failed else EXIT_TOOL
    return emit(Reply(data, text=lambda: doctor_text(data), exit_code=exit_code), as_json)


def doctor_config(location: DbLocation | None) -> dict[str, Any]:
    """Which config file and database path the checks judged (nulls when the
    path could not be resolved)."""
    config = project_config() if location is None else location.config
    return {
        "config_path": str(config.path),
        "config_exists": config.exists,
        "config_valid": config.valid,
        "db_path": None if location is None else location.display,
        "db_source": None if location is None else SOURCE_NAMES[location.source],
        "source": None if location is None else location.source,
    }


def run_checks(db: str | None) -> tuple[list[Check], DbLocation | None]:
    config = project_config()
    checks = [config_check(config), env_check()]
    try:
        location: DbLocation | None = locate_db(db)
    except SpoolError as exc:
        location = None
        checks.append(Check("db_path_resolved", "fail", exc.message, blocked_by="config_valid"))
    if location is None:
        names = (
            "spool_directory_writable",
            "disk_space",
            "database_exists",
            "sqlite_open_readwrite",
            "schema_version",
            "integrity",
            "orphans_unconfirmed",
            "unplaceable",
        )
        checks += [
            Check(n, "skip", "no database path", blocked_by="db_path_resolved") for n in names
        ]
    else:
        checks.append(
            Check("db_path_resolved", "pass", f"{location.display} (from {location.source})")
        )
        checks += location.driver.health_checks()
        checks.append(orphans_check(location.driver, checks))
        checks.append(unplaceable_check(location.driver, checks))
    checks.append(containment_check())
    checks.append(contract_check())
    return checks, location


def containment_check() -> Check:
    """Which containment a worker here would use, and why: passes either way
    (process groups are the fallback, nothing fails without cgroups)."""
    from spoolctl.runner import containment

    status = containment.report()
    return Check("containment", "pass", status.line())


def orphans_check(driver: Driver, checks: list[Check]) -> Check:
    """Running jobs held back because their dead worker's process may still run."""
    if any(c.id in ("schema_version", "integrity") and c.status != "pass" for c in checks):
        return Check(
            "orphans_unconfirmed", "skip", "queue not readable", blocked_by="schema_version"
        )
    queue = open_for_read(driver)
    orphans = [] if queue is None else queue.read(query.unconfirmed_orphans)
    if not orphans:
        return Check("orphans_unconfirmed", "pass", "no running job waits on an unconfirmed orphan")
    named = "; ".join(
        f"job {o['job_id']} pid {'?' if o['pid'] is None else o['pid']}: {o['reason']}"
        for o in orphans
    )
    return Check(
        "orphans_unconfirmed",
        "warn",
        f"{len(orphans)} job(s) kept running, not requeued: {named}"[:500],
        "end the named process (or confirm it is gone); a worker then requeues the job",
    )


def unplaceable_check(driver: Driver, checks: list[Check]) -> Check:
    """Queued jobs that ask for more than any live worker of their lane has:
    a warning (a worker that can hold them may join), naming them and why."""
    if any(c.id in ("schema_version", "integrity") and c.status != "pass" for c in checks):
        return Check("unplaceable", "skip", "queue not readable", blocked_by="schema_version")
    queue = open_for_read(driver)
    found = placement_views.NONE_UNPLACEABLE
    if queue is not None:
        now, live = queue.now(), Timing.from_env().reap_threshold_s
        found = queue.read(lambda conn: placement_reads.unplaceable(conn, now, live))
    if not found.count:
        return Check("unplaceable", "pass", "every queued job fits a live worker of its lane")
    named = "; ".join(f"job {u.job_id}: {u.reason}" for u in found.jobs)
    return Check(
        "unplaceable",
        "warn",
        f"{found.count} queued job(s) no live worker can hold: {named}"[:500],
        "start a worker that has what they ask for, or lower their requests (spoolctl show ID)",
    )


def config_check(config: ConfigFile) -> Check:
    if not config.valid:
        return Check("config_valid", "fail", "; ".join(config.problems), f"fix {config.path}")
    found = f"{config.path} is valid" if config.exists else "no config file; defaults apply"
    return Check("config_valid", "pass", found)


def env_check() -> Check:
    try:
        Timing.from_env()
        busy_timeout_s()
        auto_migrate()
    except SpoolError as exc:
        return Check("env_valid", "fail", exc.message, "fix or unset the variable")
    return Check("env_valid", "pass", "environment knobs are valid")


def contract_check() -> Check:
    from spoolctl.cli.contract import contract_problems

    problems = contract_problems()
    if problems:
        return Check("contract_metadata", "fail", "; ".join(problems))
    return Check("contract_metadata", "pass", "every verb loads and publishes a schema")


def versions() -> dict[str, Any]:
    return {
        "tool_version": __version__,
        "contract_version": CONTRACT_VERSION,
        "schema_version": SCHEMA_VERSION,
        "schema_head": revision.HEAD_REVISION,
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "sqlalchemy": sqlalchemy.__version__,
    }


def doctor_text(data: dict[str, Any]) -> str:
    marks = {
        "pass": style("ok", fg="green"),
        "warn": style("warn", fg="yellow"),
        "fail": style("FAIL", fg="red"),
        "skip": "skip",
    }
    rows = [[marks[c["status"]], c["id"], c["message"]] for c in data["checks"]]
    lines = [table(["", "CHECK", "DETAIL"], rows)]
    lines += [
        f"  fix {c['id']}: {c['remediation']}"
        for c in data["checks"]
        if c["status"] == "fail" and c["remediation"]
    ]
    lines.append("ready" if data["ready"] else style("not ready", fg="red", bold=True))
    return "\n".join(lines)


@verb("config-show", examples=("spoolctl config-show", "spoolctl config-show --json"))
@db_option
@json_option
def config_show(db: str | None, as_json: bool) -> int:
    """Where the database is and why; opens nothing.

    Which rule chose it: --db, else SPOOLCTL_DB, else db_path in the config
    file, else the nearest .spoolctl folder in the current folder or above
    it (never across a mount point), else a new one in the current folder
    (data.chosen_by: rule, folder, says).
    """
    config = project_config()
    refuse_invalid(config)
    location = resolve_db(db)
    db_path, source = location.display, location.source
    chosen = chosen_by(location)
    data = {
        "config_path": str(config.path),
        "config_exists": config.exists,
        "config_valid": config.valid,
        "values": {"db_path": db_path},
        "sources": {"db_path": source},
        "precedence": list(PRECEDENCE),
        "ignored_keys": config.unknown_keys,
        "problems": list(config.problems),
        "chosen_by": chosen,
    }
    text = (
        f"db_path  {db_path}\nsource   {source}\nchosen   {chosen['says']}\n"
        f"config   {config.path}" + ("" if config.exists else " (absent)")
    )
    return emit(Reply(data, text=text), as_json)


def chosen_by(location: DbLocation) -> dict[str, Any]:
    """Which rule chose the queue (`db/where.py`'s RULES), the folder it
    found or made it in (null for --db and SPOOLCTL_DB), and in words."""
    rule = location.rule
    folder: Path | None = None
    says = RULES[rule]
    if rule == "config":
        folder = location.config.path.parent.parent
        says = f"db_path in {location.config.path}"
    elif rule in ("found_here", "found_above") and location.project is not None:
        folder = location.project
        says = f"found {'in the current folder' if rule == 'found_here' else 'above in'} {folder}"
    elif rule == "new_here":
        folder = current_folder()
        says = f"new in the current folder {folder} (no .spoolctl folder here or above)"
    return {"rule": rule, "folder": None if folder is None else str(folder), "says": says}


@verb(
    "config-validate",
    examples=(
        "spoolctl config-validate",
        "spoolctl config-validate ./.spoolctl/config.json --json",
    ),
)
@click.argument("path", required=False, type=BoundedText("path", 4096))
@json_option
def config_validate(path: str | None, as_json: bool) -> int:
    """Check a config file (default: the one every verb reads: .spoolctl/config.json
    in the nearest folder, the current one or one above, that has a
    .spoolctl folder).

    A file that cannot be read, is not valid JSON, breaks a rule or holds an
    unknown key is INVALID_INPUT (exit 1, ok:false), and so is a db_path that
    every other verb would refuse (the same check: a URL that is not one, a
    folder, a NUL). No file at all is valid: the defaults apply (exists: false).
    """
    target = Path(path) if path is not None else project_config().path
    config = read_config(target)
    refuse_invalid(config)
    config_location(config)
    config_defaults(config)  # the `defaults` table, read as `add` reads it
    if config.unknown_keys:
        raise InvalidInput(
            f"{target}: unknown config key(s): {', '.join(config.unknown_keys)}; "
            f"supported keys are {', '.join(CONFIG_KEYS)}",
            config_path=str(target),
            unknown_keys=config.unknown_keys,
        )
    data = {
        "config_path": str(target),
        "exists": config.exists,
        "valid": True,
        "format": "json",
        "schema_version": CONFIG_VERSION,
        "recognized_keys": sorted(k for k in CONFIG_KEYS if k != "version"),
        "unknown_keys": [],
        "problems": [],
    }
    text = f"{target}: " + ("valid" if config.exists else "no such file; the defaults apply")
    return emit(Reply(data, text=text), as_json)


def refuse_invalid(config: ConfigFile) -> None:
    if config.exists and not config.valid:
        raise InvalidInput(
            f"config file {config.path} is invalid: {'; '.join(config.problems)}",
            config_path=str(config.path),
            problems=list(config.problems),
        )
