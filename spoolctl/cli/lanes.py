"""`pause` and `resume`: stop and restart claiming from a lane without
stopping any worker."""

from __future__ import annotations

from typing import Any

import click

from spoolctl.cli.database import open_write
from spoolctl.cli.options import BoundedText, QueueName, db_option, json_option, verb
from spoolctl.cli.reply import Reply, emit
from spoolctl.errors import InvalidInput, MissingRequired
from spoolctl.services import lanes
from spoolctl.text import shown

REASON_MAX = 1000


def lanes_named(lane: str | None, every: bool, verb_name: str) -> list[str] | None:
    """The lanes a pause/resume names: one (its QUEUE argument), or None for --all."""
    if lane is not None and every:
        raise InvalidInput(f"give a QUEUE or --all to {verb_name}, not both")
    if lane is None and not every:
        raise MissingRequired(f"name the lane to {verb_name} (QUEUE) or use --all")
    return None if every else [lane] if lane is not None else None


def change_reply(
    change: lanes.LaneChange,
    lane: str | None,
    paused: list[dict[str, Any]],
    known: list[str] | None = None,
) -> Reply:
    """`known`: the lanes the queue knew before the change (a job, a live
    worker or a pause named them); a named lane outside them is reported in
    `unknown_queues` and said so in the text (a typo pauses or resumes nothing
    that exists)."""
    unknown = [] if known is None else [n for n in change.named if n not in known]
    data: dict[str, Any] = {
        "queue": lane,
        "queues": change.named,
        "paused": change.paused,
        "changed": bool(change.changed),
        "changed_queues": change.changed,
        "paused_lanes": paused,
    }
    if known is not None:
        data["unknown_queues"] = unknown
    verb_word = "paused" if change.paused else "resumed"
    if not change.named:
        text = f"no lane to {verb_word[:-1]}"
    else:
        lines = []
        for name in change.named:
            if name in change.changed:
                line = f"lane '{shown(name)}' {verb_word}"
            elif change.paused:
                line = f"lane '{shown(name)}' was already paused"
            else:
                line = f"lane '{shown(name)}' is not paused: nothing to resume"
            if name in unknown:
                line += " (no job or worker has used this lane)"
            lines.append(line)
        text = "\n".join(lines)
    return Reply(data, text=text)


@verb(
    "pause",
    mutates=True,
    idempotent=True,
    examples=(
        "spoolctl pause default --reason 'deploy in progress'",
        "spoolctl pause --all --json",
    ),
)
@click.argument("queue", type=QueueName(), required=False)
@click.option("--all", "every", is_flag=True, help="Pause every lane known to the queue now.")
@click.option(
    "--reason", type=BoundedText("reason", REASON_MAX), default=None, help="Why, for people."
)
@db_option
@json_option
def pause(queue: str | None, every: bool, reason: str | None, db: str | None, as_json: bool) -> int:
    """Stop workers claiming from a lane; running jobs finish, `add` still queues.

    Recorded in the queue with who paused it, when and why; pausing a paused
    lane changes nothing (reported, exit 0). Undo with `resume`. A lane may be
    paused before any job uses it; one that no job or live worker has named
    yet is listed in `unknown_queues` and the text says so.
    """
    named = lanes_named(queue, every, "pause")
    by = lanes.operator_identity()
    found = open_write(db)
    now = found.now()

    def change(conn: Any) -> Reply:
        known = lanes.known_lanes(conn)
        done = lanes.pause_lanes(conn, named, by=by, reason=reason, now=now)
        return change_reply(done, queue, lanes.paused_lanes(conn), known)

    return emit(found.write(change), as_json)


@verb(
    "resume",
    mutates=True,
    idempotent=True,
    examples=("spoolctl resume default", "spoolctl resume --all --json"),
)
@click.argument("queue", type=QueueName(), required=False)
@click.option("--all", "every", is_flag=True, help="Resume every paused lane.")
@db_option
@json_option
def resume(queue: str | None, every: bool, db: str | None, as_json: bool) -> int:
    """Unpause a lane: workers claim from it again (idle ones notice at once).

    Resuming a lane that is not paused changes nothing (reported, exit 0); a
    lane no job, live worker or pause has named (a typo, say) is listed in
    `unknown_queues` and the text says so.
    """
    named = lanes_named(queue, every, "resume")
    by = lanes.operator_identity()
    found = open_write(db)
    now = found.now()

    def change(conn: Any) -> Reply:
        known = lanes.known_lanes(conn)
        done = lanes.resume_lanes(conn, named, by=by, now=now)
        return change_reply(done, queue, lanes.paused_lanes(conn), known)

    return emit(found.write(change), as_json)
