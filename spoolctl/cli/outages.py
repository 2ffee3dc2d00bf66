"""What `work` and the followers say while they wait for the database server,
and what `workers` says of a worker that waited."""

from __future__ import annotations

import sys
from typing import Any

import click

from spoolctl.db.outage import Outage, OutageListener
from spoolctl.text import shown


def outage_notice() -> OutageListener | None:
    """On a terminal (stderr is a tty), one line when the wait for an
    unreachable server begins and one when a try gets through; nothing on a
    pipe, where the exit code and the JSON tell a script what happened."""
    if not sys.stderr.isatty():
        return None

    def tell(outage: Outage) -> None:
        if outage.ended is None:
            click.echo(
                "spoolctl: waiting for the database server (Ctrl-C to stop): "
                + shown(outage.error),
                err=True,
            )
            return
        click.echo(
            f"spoolctl: connected to the database server after {outage.waited_s(0.0):.1f}s"
            f" and {outage.failures} failed tries",
            err=True,
        )

    return tell


def waits_text(workers: list[dict[str, Any]]) -> list[str]:
    """`workers`: a line under the table for each worker whose start waited
    for the server (its `waited_for_server`)."""
    lines = []
    for worker in workers:
        wait = worker.get("waited_for_server")
        if wait:
            lines.append(
                f"worker {shown(str(worker['id']))} waited {wait['waited_s']}s for the"
                f" database server before it started ({wait['failed_tries']} failed tries)"
            )
    return ["", *lines] if lines else []
