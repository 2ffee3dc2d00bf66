"""Shell completion (bash, zsh, fish) through click's protocol: the shell
runs `spoolctl` with `_SPOOLCTL_COMPLETE=SHELL_source` once to get its
script, then with `_SPOOLCTL_COMPLETE=SHELL_complete` and `COMP_WORDS` /
`COMP_CWORD` at each TAB. The entry point (`cli/__init__.py`) sends both
to `cli/app.py`'s `complete` before the lean path; this module gives the
verbs' parameters their candidates.

A completion never prints an error or a traceback into the prompt: a line
that does not parse, a queue that cannot be read, anything that fails
yields no candidates (exit 0). Job ids, lanes and schedule names come from
the queue the line names (`--db` typed before the TAB, else the usual
rules), on SQLite only, read without creating a queue; a PostgreSQL server
is not asked at each TAB."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import click
from click.shell_completion import CompletionItem

COMPLETE_VAR = "_SPOOLCTL_COMPLETE"
"""Set by a shell asking for completion (the light entry point spells it too)."""

Candidates = Callable[[click.Context, click.Parameter, str], list[CompletionItem]]

ENDED = ("done", "dead", "failed", "canceled")
STATES_FOR: dict[str, tuple[str, ...] | None] = {
    "retry": (*ENDED, "running"),
    "cancel": ("queued", "waiting", "running"),
    "remove": ("queued", "waiting"),
    "update": ("queued", "waiting"),
    "wait": ("queued", "waiting", "running"),
}
"""The states whose jobs a verb's JOB_ID offers (others: every job)."""


def completing_bash() -> bool:
    """Whether the shell asking shows no descriptions (bash): then the verbs'
    modules are not loaded for their help lines."""
    return os.environ.get(COMPLETE_VAR, "").startswith("bash")


def attach(verb: str, command: click.Command) -> None:
    """Give the parameters of `verb` that name things in the queue their
    candidates (only in a completion request)."""
    for param in command.params:
        found = _candidates_for(verb, param)
        if found is not None and param._custom_shell_complete is None:
            param._custom_shell_complete = found


def _candidates_for(verb: str, param: click.Parameter) -> Candidates | None:
    if param.name == "db":
        return lambda ctx, p, incomplete: [CompletionItem(incomplete, type="file")]
    if param.name in ("job_id", "job_ids"):
        return _jobs(STATES_FOR.get(verb))
    if param.name in ("queue", "in_queue"):  # update --in-queue: a lane too
        return _from_queue(lambda conn, prefix: _lanes(conn, prefix))
    if param.name == "name" and verb.startswith("schedule "):
        return _from_queue(lambda conn, prefix: _schedules(conn, prefix))
    return None


def _jobs(states: tuple[str, ...] | None) -> Candidates:
    def read(conn: Any, prefix: str) -> list[CompletionItem]:
        from spoolctl.db import codec
        from spoolctl.services.completion import job_candidates
        from spoolctl.text import shown

        if prefix and not prefix.isdigit():
            return []
        items = []
        for job_id, state, raw in job_candidates(conn, prefix, states):
            try:
                command = " ".join(codec.load_argv(raw))
            except codec.DamagedValue:
                command = "?"
            items.append(CompletionItem(str(job_id), help=shown(f"{state}: {command}")[:60]))
        return items

    return _from_queue(read)


def _lanes(conn: Any, prefix: str) -> list[CompletionItem]:
    from spoolctl.services.completion import lane_candidates

    return [CompletionItem(lane) for lane in lane_candidates(conn, prefix)]


def _schedules(conn: Any, prefix: str) -> list[CompletionItem]:
    from spoolctl.services.completion import schedule_candidates

    return [CompletionItem(name) for name in schedule_candidates(conn, prefix)]


def _from_queue(read: Callable[[Any, str], list[CompletionItem]]) -> Candidates:
    """Candidates read from the line's queue: none where it is not an SQLite
    file that exists, or cannot be read."""

    def candidates(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
        from spoolctl.cli.database import open_read
        from spoolctl.db.where import named_db

        db = ctx.params.get("db")
        if named_db(db).plain_file is None:
            return []
        queue = open_read(db)
        if queue is None:
            return []
        try:
            return queue.read(lambda conn: read(conn, incomplete))
        finally:
            queue.dispose()

    return candidates
