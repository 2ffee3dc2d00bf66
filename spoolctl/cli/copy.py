"""`copy-to`: move a queue up from its SQLite file to an empty PostgreSQL
database, history and output included (docs/moving-to-postgresql.md)."""

from __future__ import annotations

from typing import Any

import click

from spoolctl.cli.options import BoundedText, db_option, json_option, verb
from spoolctl.cli.reply import Reply, emit
from spoolctl.db.backends import locate
from spoolctl.db.backends.base import Driver
from spoolctl.db.location import resolve_db
from spoolctl.db.url import looks_like_url, masked
from spoolctl.db.where import current_folder
from spoolctl.errors import InvalidInput


def target_of(url: str) -> Driver:
    """The database a URL names, if it can hold a fleet's queue (PostgreSQL);
    anything else is INVALID_INPUT, and nothing is created for it."""
    target = locate(url, current_folder(), "copy-to URL") if looks_like_url(url) else None
    if target is None or not target.shared:
        raise InvalidInput(
            "copy-to copies into a PostgreSQL database: give its URL, "
            "postgresql://user@host/dbname (the SQLite queue is named by --db)",
            target=masked(url),
        )
    return target


@verb(
    "copy-to",
    mutates=True,
    idempotent=False,
    examples=(
        "spoolctl copy-to postgresql://spool@db.example/spool --dry-run",
        "spoolctl copy-to postgresql://spool@db.example/spool --db .spoolctl/queue.db --json",
    ),
)
@click.argument("url", type=BoundedText("url", 4096))
@click.option(
    "--dry-run",
    is_flag=True,
    help="Rehearse the whole copy in one transaction, then roll it back: nothing is written.",
)
@db_option
@json_option
def copy_to(url: str, dry_run: bool, db: str | None, as_json: bool) -> int:
    """Copy to PostgreSQL: every job, attempt, event, worker and output, ids kept.

    --db names the SQLite queue (at the current revision: `spoolctl migrate`
    it first); URL an empty PostgreSQL database. One transaction creates the
    schema and copies every row; on any failure (or with --dry-run) the
    database is left empty. Refused with CONFLICT while a job is running in
    the source (stop its workers first) or when the target holds anything.
    """
    from spoolctl.db.backends.postgresql.output import cap_bytes
    from spoolctl.services.copy import copy_to_postgres

    target = target_of(url)
    location = resolve_db(db)
    if location.driver.shared:
        raise InvalidInput(
            f"copy-to copies an SQLite queue, but --db names {location.display}; "
            "give the SQLite file with --db",
            db=location.display,
        )
    report = copy_to_postgres(location.driver, target, dry_run=dry_run, cap=cap_bytes())
    data = {
        "source": report.source,
        "target": report.target,
        "dry_run": report.dry_run,
        "revision": report.revision,
        "tables": report.tables,
        "rows_total": sum(report.tables.values()),
        "next_ids": report.next_ids,
        "output": report.output.as_data(),
    }
    return emit(Reply(data, text=lambda: summary_text(data)), as_json)


def summary_text(data: dict[str, Any]) -> str:
    output = data["output"]
    head = "Dry run (rolled back, nothing written): would copy" if data["dry_run"] else "Copied"
    lines = [
        f"{head} {data['source']} to {data['target']} (schema {data['revision']})",
        "rows: " + ", ".join(f"{name} {n}" for name, n in data["tables"].items()),
        f"output: {output['bytes_stored']} bytes in {output['chunks']} chunks "
        f"from {output['streams_stored']} files",
    ]
    if output["streams_truncated"]:
        lines.append(
            f"{output['streams_truncated']} stream(s) longer than {output['cap_bytes']} bytes "
            "(SPOOLCTL_PG_OUTPUT_CAP) were stored cut, flagged truncated"
        )
    if output["attempts_missing_output"]:
        lines.append(
            f"{output['attempts_missing_output']} attempt(s) had no output file to copy "
            f"({output['streams_missing']} stream(s)); --json lists them"
        )
    if output["streams_refused"]:
        lines.append(
            f"{output['streams_refused']} output path(s) outside the spool folder were not read"
        )
    if not data["dry_run"]:
        lines.append(
            "next: point --db (or SPOOLCTL_DB) at the PostgreSQL URL; the file stays as it was"
        )
    return "\n".join(lines)
