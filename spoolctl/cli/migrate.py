"""`migrate`: see and change a queue file's schema revision (docs/migrations.md).

Needs no alembic.ini and works from any directory: the revision scripts ship
inside the package and alembic's Config is built in code. `--db` may name a
PostgreSQL URL; output names it with its password masked (`db_path` keeps
its name: it is the JSON contract).
"""

from __future__ import annotations

from typing import Any

import click

from spoolctl.cli.database import driver_of
from spoolctl.cli.options import db_option, json_option, verb
from spoolctl.cli.reply import Reply, emit
from spoolctl.db.backends.base import Driver
from spoolctl.db.revision import (
    DELETE_STORED_OUTPUT_FLAG,
    DROP_RESOURCES_FLAG,
    DROP_SCHEDULES_FLAG,
    HEAD_REVISION,
    KNOWN_REVISIONS,
    schema_status,
)
from spoolctl.errors import InvalidInput, SafetyBlock

MODES = ("status", "history", "sql")
REVISION_FLAGS = ("to", "downgrade")
DROPS = ("delete_stored_output", "drop_schedules", "drop_resources")
"""The flags that let a downgrade delete what the older revision cannot hold."""
DROP_FLAGS = {
    "delete_stored_output": DELETE_STORED_OUTPUT_FLAG,
    "drop_schedules": DROP_SCHEDULES_FLAG,
    "drop_resources": DROP_RESOURCES_FLAG,
}


@verb(
    "migrate",
    exclusive=(
        *((a, b) for i, a in enumerate(MODES) for b in MODES[i + 1 :]),
        *(
            (a, b)
            for a in ("status", "history")
            for b in (*REVISION_FLAGS, "yes", "no_backup", *DROPS)
        ),
        ("to", "downgrade"),
        *(("to", drop) for drop in DROPS),
        ("sql", "yes"),
        ("sql", "no_backup"),
    ),
    mutates=True,
    idempotent=True,
    examples=(
        "spoolctl migrate --status",
        "spoolctl migrate",
        "spoolctl migrate --sql",
        "spoolctl migrate --downgrade 0001_initial --yes",
    ),
)
@click.option(
    "--status", is_flag=True, help="Show the file's revision, the head and what is pending."
)
@click.option("--history", is_flag=True, help="List the revisions this spoolctl ships.")
@click.option("--sql", is_flag=True, help="Print the SQL the change would run; change nothing.")
@click.option(
    "--to",
    "to",
    type=click.Choice(["head", *KNOWN_REVISIONS]),
    default=None,
    help="Upgrade to this revision instead of the head.",
)
@click.option(
    "--downgrade",
    type=click.Choice(KNOWN_REVISIONS),
    default=None,
    help="Downgrade to this revision (needs --yes).",
)
@click.option("--yes", is_flag=True, help="Confirm a downgrade.")
@click.option(
    DELETE_STORED_OUTPUT_FLAG,
    "delete_stored_output",
    is_flag=True,
    help="Let a --downgrade below 0004_output_chunks delete the output stored in the "
    "database (PostgreSQL); without it such a downgrade is refused while any is stored.",
)
@click.option(
    DROP_SCHEDULES_FLAG,
    "drop_schedules",
    is_flag=True,
    help="Let a --downgrade below 0006_schedules delete the schedules (the jobs they made "
    "stay); without it such a downgrade is refused while any exists.",
)
@click.option(
    DROP_RESOURCES_FLAG,
    "drop_resources",
    is_flag=True,
    help="Let a --downgrade below 0010_resources release the device holds and drop the "
    "requests (a weight, GPUs) of unfinished jobs, which then run as plain jobs; without "
    "it such a downgrade is refused while any is held or asked for.",
)
@click.option(
    "--no-backup", is_flag=True, help="Skip the VACUUM INTO backup beside the file (SQLite)."
)
@db_option
@json_option
def migrate(
    status: bool,
    history: bool,
    sql: bool,
    to: str | None,
    downgrade: str | None,
    yes: bool,
    delete_stored_output: bool,
    drop_schedules: bool,
    drop_resources: bool,
    no_backup: bool,
    db: str | None,
    as_json: bool,
) -> int:
    """Upgrade the queue's schema: to this spoolctl's head revision.

    Before changing an existing SQLite file it writes a consistent backup
    beside it (`<db>.bak-<old revision>-<UTC time>`); on PostgreSQL the change
    is one transaction under an advisory lock, with no backup (pg_dump
    first). A database of the original
    spoolctl (schema_version 1-6) is adopted in place; a row no spoolctl
    state can hold (an unknown state, a negative count) becomes a dead job
    whose last_error says why (counted in quarantined_rows). Workers of another
    version stop at their next transaction with SCHEMA_OUTDATED or
    SCHEMA_TOO_NEW.

    A downgrade below 0004_output_chunks deletes the output stored in the
    database (on PostgreSQL, the only copy other machines read): it is
    refused (exit 2, SAFETY_BLOCK, naming how much) while any is stored,
    unless given --delete-stored-output. Output files are kept. A downgrade
    below 0006_schedules is refused the same way while any schedule exists,
    unless given --drop-schedules, and one below 0010_resources while a
    device is held or an unfinished job asks for a weight or GPUs, unless
    given --drop-resources.
    """
    drops = {
        "delete_stored_output": delete_stored_output,
        "drop_schedules": drop_schedules,
        "drop_resources": drop_resources,
    }
    for name, given in drops.items():
        if given and downgrade is None:
            flag = DROP_FLAGS[name]
            raise InvalidInput(
                f"{flag} only applies to a downgrade: "
                f"spoolctl migrate --downgrade REV --yes {flag}",
                flag=flag,
            )
    where = driver_of(db)
    if status:
        return emit(status_reply(where), as_json)
    if history:
        return emit(history_reply(where), as_json)
    target = downgrade or (HEAD_REVISION if to in (None, "head") else to)
    if sql:
        return emit(sql_reply(where, target, downgrade is not None, delete_stored_output), as_json)
    if downgrade is not None and not yes:
        raise SafetyBlock(
            f"downgrading {where.display} to {downgrade} changes its schema under every worker; "
            "confirm with --yes",
            target=downgrade,
        )
    return emit(change_reply(where, target, downgrade is not None, not no_backup, drops), as_json)


def status_reply(where: Driver) -> Reply:
    found = schema_status(where)
    data: dict[str, Any] = {
        "db_path": where.display,
        "exists": found is not None,
        "current": None if found is None else found.current,
        "head": HEAD_REVISION,
        "pending": list(KNOWN_REVISIONS) if found is None else found.pending,
        "legacy_detected": found is not None and found.is_legacy,
        "legacy_schema_version": None if found is None else found.legacy_version,
    }
    data["up_to_date"] = found is not None and found.is_head
    return Reply(data, text=lambda: status_text(data))


def status_text(data: dict[str, Any]) -> str:
    if not data["exists"]:
        current = "no database yet (the first mutating verb or `migrate` creates it at head)"
    elif data["legacy_detected"]:
        current = f"original spoolctl, schema_version {data['legacy_schema_version']}"
    else:
        current = data["current"] or "none"
    pending = ", ".join(data["pending"]) or "nothing"
    return "\n".join(
        (
            f"database: {data['db_path']}",
            f"current:  {current}",
            f"head:     {data['head']}",
            f"pending:  {pending}",
        )
    )


def history_reply(where: Driver) -> Reply:
    from spoolctl.db.revision import history

    found = schema_status(where)
    current = None if found is None else found.current
    revisions = [
        {
            "revision": info.revision,
            "down_revision": info.down_revision,
            "doc": info.doc,
            "is_head": info.revision == HEAD_REVISION,
            "is_current": info.revision == current,
        }
        for info in history()
    ]
    data = {"head": HEAD_REVISION, "current": current, "revisions": revisions}
    return Reply(data, text=lambda: history_text(revisions))


def history_text(revisions: list[dict[str, Any]]) -> str:
    lines = []
    for rev in revisions:
        marks = [m for m, on in (("head", rev["is_head"]), ("current", rev["is_current"])) if on]
        suffix = f" ({', '.join(marks)})" if marks else ""
        lines.append(
            f"{rev['down_revision'] or '<base>'} -> {rev['revision']}{suffix}: {rev['doc']}"
        )
    return "\n".join(lines)


def sql_reply(
    where: Driver, target: str, downgrade: bool, delete_stored_output: bool = False
) -> Reply:
    from spoolctl.db.migration import migration_sql

    text = migration_sql(
        where, target, downgrade=downgrade, delete_stored_output=delete_stored_output
    )
    data = {"db_path": where.display, "target": target, "downgrade": downgrade, "sql": text}
    return Reply(data, text=text.rstrip("\n"))


def change_reply(
    where: Driver,
    target: str,
    downgrade: bool,
    backup: bool,
    drops: dict[str, bool] | None = None,
) -> Reply:
    """drops: the downgrade's flags by name (`DROPS`), each False when left out."""
    from spoolctl.db.migration import migrate_file

    result = migrate_file(where, target, downgrade=downgrade, backup=backup, **(drops or {}))
    data = {
        "db_path": where.display,
        "from_revision": result.from_revision,
        "to_revision": result.to_revision,
        "applied": result.applied,
        "direction": "downgrade" if downgrade else "upgrade",
        "backup_path": None if result.backup_path is None else str(result.backup_path),
        "legacy_adopted": result.legacy_adopted,
        "legacy_schema_version": result.legacy_schema_version,
        "relocated_output_paths": result.relocated_paths,
        "quarantined_rows": len(result.quarantined_job_ids) + result.quarantined_attempts,
        "quarantined_job_ids": result.quarantined_job_ids,
    }
    no_backup = where.backup_note
    return Reply(data, text=lambda: change_text(data, no_backup))


def change_text(data: dict[str, Any], no_backup: str = "none") -> str:
    if not data["applied"]:
        return f"{data['db_path']} is already at {data['to_revision']}: nothing to do"
    if data["legacy_adopted"]:
        head = (
            f"Adopted {data['db_path']} (original spoolctl, schema_version "
            f"{data['legacy_schema_version']}) at {data['to_revision']}; "
            f"relocated {data['relocated_output_paths']} output path(s); "
            f"quarantined {data['quarantined_rows']} odd row(s)"
            + quarantine_text(data["quarantined_job_ids"])
        )
    else:
        verb_done = "Downgraded" if data["direction"] == "downgrade" else "Upgraded"
        head = (
            f"{verb_done} {data['db_path']} from {data['from_revision'] or 'nothing'} "
            f"to {data['to_revision']} ({', '.join(data['applied'])})"
        )
    backup = data["backup_path"] or no_backup
    return f"{head}\nbackup: {backup}"


def quarantine_text(job_ids: list[int]) -> str:
    """Which jobs were adopted dead because a value of theirs made no sense."""
    if not job_ids:
        return ""
    listed = ", ".join(str(i) for i in job_ids)
    return f" (now dead jobs {listed}: 'spoolctl show ID' says why in last_error)"
