"""`schedule add|list|show|pause|resume|remove|run`: recurring jobs, fired by
whichever `spoolctl work` runs (no daemon; see services/firing.py)."""

from __future__ import annotations

import time
from typing import Any

import click

from spoolctl import validate
from spoolctl.cli.database import (
    no_schedule,
    nowhere,
    open_existing_write,
    open_read,
    open_write,
    warn_no_queue,
)
from spoolctl.cli.job_flags import job_flags, spec_values
from spoolctl.cli.jobs import command_argv
from spoolctl.cli.lanes import REASON_MAX
from spoolctl.cli.look import line_width, table
from spoolctl.cli.options import (
    BoundedText,
    Duration,
    QueueName,
    Rule,
    db_option,
    json_option,
    verb,
)
from spoolctl.cli.read_text import NAME_MIN
from spoolctl.cli.render import wide_option
from spoolctl.cli.reply import Reply, emit
from spoolctl.db.queue import Queue
from spoolctl.errors import InvalidInput, MissingRequired, NotFound
from spoolctl.services import fire_times, schedules
from spoolctl.services.job_spec import SCHEDULED, JobSpec
from spoolctl.states import CatchUp, Overlap
from spoolctl.text import shown

STARTING = Rule(
    "time",
    lambda raw: validate.timestamp(raw, now=-validate.MAX_DURATION_S),
    {"grammar": "epoch seconds or ISO-8601 (naive is local time); may be in the past"},
)
ZONE = Rule(
    "zone",
    lambda raw: fire_times.zone(raw).key,
    {"grammar": "an IANA time zone name, e.g. Europe/Berlin"},
)


def when(t: float | None, zone: str) -> str:
    return "-" if t is None else fire_times.iso(t, zone)


def line_of(s: dict[str, Any]) -> str:
    last = s["last"]
    last_text = (
        "-"
        if last is None
        else f"{when(last['slot_at'], s['timezone'])} "
        f"job {last['job_id'] if last['job_id'] is not None else '-'} ({last['state'] or '-'})"
    )
    nxt = "paused" if s["paused"] else ", ".join(when(t, s["timezone"]) for t in s["upcoming"])
    return f"{shown(s['name'])}  {s['expression']}  {s['timezone']}  next: {nxt}  last: {last_text}"


@verb(
    "schedule add",
    exclusive=(("cron", "every"), ("cron", "starting")),
    mutates=True,
    idempotent="with --replace",
    examples=(
        "spoolctl schedule add nightly --cron '0 3 * * *' --timezone Europe/Berlin -- ./backup.sh",
        "spoolctl schedule add ping --every 5m -c 'curl -fsS https://example.org/health'",
    ),
)
@click.argument("name", type=QueueName())
@click.argument("argv", nargs=-1, type=click.UNPROCESSED)
@click.option("-c", "--command", "command", default=None, help="A shell string, run as sh -c.")
@click.option(
    "--cron",
    default=None,
    help="A five-field cron expression (minute resolution), or @hourly, @daily, @weekly, "
    "@monthly, @yearly.",
)
@click.option("--every", type=Duration(), default=None, help="An interval (>= 1s).")
@click.option(
    "--timezone",
    "timezone",
    type=ZONE,
    default=None,
    help="IANA zone the cron expression is read in (default: this machine's).",
)
@click.option(
    "--overlap",
    type=click.Choice([o.value for o in Overlap]),
    default="skip",
    show_default=True,
    help="skip: no new job while the previous one is queued, waiting or running.",
)
@click.option(
    "--catch-up",
    "catch_up",
    type=click.Choice([c.value for c in CatchUp]),
    default="latest",
    show_default=True,
    help="After time without a worker: the latest missed fire time, none, or all (at most 100).",
)
@click.option(
    "--starting",
    type=STARTING,
    default=None,
    help="With --every: the first fire time (default: now); fire times never drift.",
)
@click.option("--replace", is_flag=True, help="Change the schedule of that name if it exists.")
@job_flags(SCHEDULED)
@db_option
@json_option
def schedule_add(
    name: str,
    argv: tuple[str, ...],
    command: str | None,
    cron: str | None,
    every: float | None,
    timezone: str | None,
    overlap: str,
    catch_up: str,
    starting: float | None,
    replace: bool,
    tags: tuple[tuple[str, str], ...],
    env: tuple[tuple[str, str], ...],
    db: str | None,
    as_json: bool,
    **options: Any,
) -> int:
    """Add a recurring job: every fire time of the cron expression or interval
    becomes one job, fired by any running `spoolctl work` (exactly one per
    fire time, however many workers run). Jobs carry SPOOLCTL_SCHEDULE,
    SPOOLCTL_SCHEDULED_FOR and the tag schedule=NAME.
    """
    if cron is None and every is None:
        raise MissingRequired("give --cron 'EXPR' or --every DURATION")
    if every is not None and every < fire_times.MIN_EVERY_S:
        raise InvalidInput(f"--every must be at least {fire_times.MIN_EVERY_S:g}s", every=every)
    zone = timezone or fire_times.local_zone_name()
    expr = None if cron is None else fire_times.check_cron(cron)
    job = JobSpec(
        argv=command_argv(argv, command),
        tags=validate.tag_map(dict(tags)),
        env=validate.env_map(dict(env)),
        **spec_values(options),
    ).check()
    queue = open_write(db, synchronous="FULL")
    local, now = time.time(), queue.now()
    skew = now - local  # the server's clock decides on PostgreSQL; a machine's may be off
    anchor = now if starting is None else starting + (skew if abs(skew) >= 1 else 0.0)
    spec = schedules.ScheduleSpec(
        name,
        fire_times.Recurrence(expr, every, zone, anchor),
        job,
        Overlap(overlap),
        CatchUp(catch_up),
    )
    data = queue.write(lambda conn: schedules.add(conn, spec, now, replace=replace))
    return emit(Reply(data, text=f"Schedule {line_of(data)}"), as_json)


@verb(
    "schedule list",
    for_people=("wide",),
    examples=("spoolctl schedule list", "spoolctl schedule list --json"),
)
@wide_option
@db_option
@json_option
def schedule_list(wide: bool, db: str | None, as_json: bool) -> int:
    """The schedules: expression, zone, next fire time (or paused), last job.

    The text fits the terminal as `list`'s does (--wide: uncut); every
    upcoming fire time and the last occurrence's are in `schedule show`
    and --json.
    """
    queue = open_read(db)
    if queue is None:
        return emit(warn_no_queue(Reply({"count": 0, "schedules": []}, text=""), db), as_json)
    now = queue.now()
    found = queue.read(lambda conn: schedules.listing(conn, now))
    text = listing_text(found, line_width(wide)) if found else "no schedules"
    return emit(Reply({"count": len(found), "schedules": found}, text=text), as_json)


def listing_text(found: list[dict[str, Any]], width: int | None) -> str:
    """`schedule list`'s table: one row a schedule, its times in its zone."""
    rows = []
    for s in found:
        upcoming = s["upcoming"]
        nxt = "paused" if s["paused"] else when(upcoming[0] if upcoming else None, s["timezone"])
        last = s["last"]
        rows.append(
            [
                shown(s["name"]),
                shown(s["expression"]),
                shown(s["timezone"]),
                nxt.replace("T", " ")[:19],
                "-"
                if last is None or last["job_id"] is None
                else f"job {last['job_id']} ({shown(last['state'] or '-')})",
            ]
        )
    flexible = {0: NAME_MIN, 1: NAME_MIN, 2: NAME_MIN, 4: NAME_MIN}
    return table(["NAME", "WHEN", "ZONE", "NEXT", "LAST"], rows, width, flexible, (2, 4))


@verb("schedule show", examples=("spoolctl schedule show nightly --json",))
@click.argument("name", type=QueueName())
@db_option
@json_option
def schedule_show(name: str, db: str | None, as_json: bool) -> int:
    """One schedule's definition and its recent occurrences."""
    queue = open_read(db)
    if queue is None:
        raise NotFound(f"no schedule named {name!r}: {nowhere(db)}", name=name)
    now = queue.now()

    def read(conn: Any) -> dict[str, Any]:
        row = schedules.require(conn, name)
        return {
            "schedule": schedules.describe(conn, row, now),
            "occurrences": schedules.occurrences(conn, row.id),
        }

    data = queue.read(read)
    zone = data["schedule"]["timezone"]
    lines = [line_of(data["schedule"])] + [
        f"  {when(o['slot_at'], zone)}  {o['outcome']}  job {o['job_id'] or '-'}  "
        f"{o['state'] or '-'}"
        for o in data["occurrences"]
    ]
    return emit(Reply(data, text="\n".join(lines)), as_json)


def existing_queue(db: str | None, name: str) -> Queue:
    """The queue for a change to one schedule; a missing queue is not created."""
    queue = open_existing_write(db)
    if queue is None:
        raise no_schedule(name, db)
    return queue


@verb("schedule pause", mutates=True, examples=("spoolctl schedule pause nightly --reason x",))
@click.argument("name", type=QueueName())
@click.option(
    "--reason", type=BoundedText("reason", REASON_MAX), default=None, help="Why, for people."
)
@db_option
@json_option
def schedule_pause(name: str, reason: str | None, db: str | None, as_json: bool) -> int:
    """Stop a schedule firing (its running jobs go on); undo with resume."""
    queue = existing_queue(db, name)
    now = queue.now()
    data = queue.write(lambda conn: schedules.pause(conn, name, reason, now))
    word = "paused" if data["changed"] else "was already paused"
    return emit(Reply(data, text=f"schedule {shown(name)} {word}"), as_json)


@verb("schedule resume", mutates=True, examples=("spoolctl schedule resume nightly",))
@click.argument("name", type=QueueName())
@db_option
@json_option
def schedule_resume(name: str, db: str | None, as_json: bool) -> int:
    """Let a paused schedule fire again, from its next fire time after now."""
    queue = existing_queue(db, name)
    now = queue.now()
    data = queue.write(lambda conn: schedules.resume(conn, name, now))
    word = "resumed" if data["changed"] else "was not paused"
    return emit(Reply(data, text=f"schedule {shown(name)} {word}"), as_json)


@verb(
    "schedule remove",
    mutates=True,
    destructive=True,
    examples=("spoolctl schedule remove nightly",),
)
@click.argument("name", type=QueueName())
@db_option
@json_option
def schedule_remove(name: str, db: str | None, as_json: bool) -> int:
    """Delete a schedule; the jobs it made stay (a running one finishes)."""
    queue = existing_queue(db, name)
    now = queue.now()
    data = queue.write(lambda conn: schedules.remove(conn, name, now))
    return emit(Reply(data, text=f"schedule {shown(name)} removed"), as_json)


@verb("schedule run", mutates=True, idempotent=False, examples=("spoolctl schedule run nightly",))
@click.argument("name", type=QueueName())
@db_option
@json_option
def schedule_run(name: str, db: str | None, as_json: bool) -> int:
    """Submit one occurrence of a schedule now (its fire times are unchanged)."""
    from spoolctl.services.firing import run_now

    queue = existing_queue(db, name)
    now = queue.now()
    data = queue.write(lambda conn: run_now(conn, name, now))
    return emit(Reply(data, text=f"Added job {data['job_id']} for schedule {shown(name)}"), as_json)
