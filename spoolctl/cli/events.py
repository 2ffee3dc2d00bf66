"""`events`: the ledger with a cursor, a long-poll, and an NDJSON follow."""

from __future__ import annotations

import json
import time
from functools import partial
from typing import Any

import click

from spoolctl.cli.database import open_read, warn_no_queue
from spoolctl.cli.options import (
    JOB_ID,
    BoundedInt,
    Duration,
    Seconds,
    db_option,
    json_option,
    verb,
)
from spoolctl.cli.outages import outage_notice
from spoolctl.cli.render import local_time
from spoolctl.cli.reply import Reply, emit, write_json
from spoolctl.db.outage import Reconnecting
from spoolctl.db.queue import Queue
from spoolctl.errors import InvalidInput, SpoolError
from spoolctl.runner.wakeup import StopRequested, counting_signals
from spoolctl.services.ledger import Page, ledger_end, read_events
from spoolctl.text import shown
from spoolctl.validate import MAX_WAIT_S

POLL_S = 0.1
DEFAULT_IDLE_TIMEOUT_S = 3600


@verb(
    "events",
    exclusive=(
        ("wait", "follow"),
        ("limit", "follow"),
        ("max_events", "wait"),
        ("idle_timeout", "wait"),
    ),
    examples=(
        "spoolctl events --since-id 120 --json",
        "spoolctl events --since-id 120 --wait --wait-timeout 30 --json",
        "spoolctl events --follow --json --max-events 10",
    ),
)
@click.option(
    "--since-id",
    "--since-cursor",
    "since_id",
    type=BoundedInt(0, None),
    default=None,
    help="Only events after this id (pass meta.pagination.cursor back); default 0,"
    " with --follow the current end of the ledger.",
)
@click.option("--job", "job_id", type=JOB_ID, default=None, help="Only events of this job.")
@click.option(
    "--limit",
    type=BoundedInt(0, 10_000),
    default=1000,
    show_default=True,
    help="Most events returned (0: all).",
)
@click.option("--wait", is_flag=True, help="Long-poll: block until an event arrives.")
@click.option(
    "--wait-timeout",
    type=Duration(MAX_WAIT_S),
    default="30",
    show_default=True,
    help="How long --wait blocks before answering with no events.",
)
@click.option("--follow", is_flag=True, help="Stream events as NDJSON frames (with --json).")
@click.option(
    "--max-events",
    type=BoundedInt(1, None),
    default=None,
    help="With --follow: stop after this many events.",
)
@click.option(
    "--idle-timeout",
    type=Duration(MAX_WAIT_S),
    default=str(DEFAULT_IDLE_TIMEOUT_S),
    show_default=True,
    help="With --follow: stop after this long idle.",
)
@click.option(
    "--poll-interval",
    type=Seconds(0, 3600),
    default=POLL_S,
    show_default=True,
    help="Seconds between looks at the ledger with --wait or --follow.",
)
@db_option
@json_option
def events(
    since_id: int | None,
    job_id: int | None,
    limit: int,
    wait: bool,
    wait_timeout: float,
    follow: bool,
    max_events: int | None,
    idle_timeout: float,
    poll_interval: float,
    db: str | None,
    as_json: bool,
) -> int:
    """The event ledger: oldest first, read with a cursor.

    --follow starts at the current end of the ledger, as `tail -f` does,
    unless --since-id is given (--since-id 0: every event). It rides out a
    server restart or a lost connection (PostgreSQL): it connects again and
    goes on from its cursor, as long as --idle-timeout allows; SIGINT or
    SIGTERM ends it at once with the control frame `interrupted`.
    """
    if max_events is not None and not follow:
        raise InvalidInput("--max-events only applies with --follow", flag="--max-events")
    ledger = Ledger(db)
    if follow:
        bounds = (max_events, idle_timeout, poll_interval)
        return follow_events(ledger, since_id, job_id, bounds, as_json)
    started = time.monotonic()
    page = ledger.fetch(since_id or 0, job_id, limit)
    meta: dict[str, Any] = {}
    if wait:
        page = long_poll(ledger, page, job_id, limit, (started + wait_timeout, poll_interval))
        reason = "records_available" if page.events else "timeout"
        meta["wait"] = {"reason": reason, "waited_ms": round((time.monotonic() - started) * 1000)}
    meta["pagination"] = {"cursor": page.cursor, "first_id": page.first_id}
    data = {"count": len(page.events), "events": page.events}
    reply = Reply(data, text=lambda: events_text(page), meta=meta)
    return emit(reply if ledger.queue is not None else warn_no_queue(reply, db), as_json)


class Ledger:
    """The queue's ledger; a queue created while we poll is picked up, never created."""

    def __init__(self, db: str | None) -> None:
        self.db = db
        self.queue: Queue | None = None

    def _opened(self) -> Queue | None:
        if self.queue is None:
            self.queue = open_read(self.db)
        return self.queue

    def fetch(self, since_id: int, job_id: int | None, limit: int) -> Page:
        queue = self._opened()
        if queue is None:
            return Page([], since_id)
        return queue.read_ledger(
            lambda conn: read_events(conn, since_id=since_id, job_id=job_id, limit=limit)
        )

    def end(self) -> int:
        """The cursor of the current end of the ledger (0: no queue yet)."""
        queue = self._opened()
        return 0 if queue is None else queue.read_ledger(ledger_end)


def long_poll(
    ledger: Ledger, page: Page, job_id: int | None, limit: int, until: tuple[float, float]
) -> Page:
    """Look again every `poll` seconds until an event comes or `deadline` passes."""
    deadline, poll = until
    while not page.events and time.monotonic() < deadline:
        time.sleep(min(poll, max(0.0, deadline - time.monotonic())))
        page = ledger.fetch(page.cursor, job_id, limit)
    return page


def follow_events(
    ledger: Ledger,
    since_id: int | None,
    job_id: int | None,
    bounds: tuple[int | None, float, float],
    as_json: bool,
) -> int:
    """Print events as they come, then one control frame saying why it ended.
    bounds: (max events, idle timeout, poll interval). since_id None: from
    the end of the ledger at the first read."""
    with counting_signals() as signals:
        follower = EventFollower(ledger, job_id, since_id, Reconnecting(signals, outage_notice()))
        try:
            return follower.run(bounds, as_json)
        except StopRequested:
            return control("end", "interrupted", as_json, follower.cursor)
        except SpoolError as exc:
            control("error", exc.code, as_json, follower.cursor, message=exc.message)
            return exc.exit_code


class EventFollower:
    """The follow loop and its cursor. An unreachable server is waited for
    (`db/outage.py`) while the idle timeout runs; reads resume after the cursor,
    so nothing is skipped or printed twice across a reconnection."""

    def __init__(
        self, ledger: Ledger, job_id: int | None, since_id: int | None, server: Reconnecting
    ) -> None:
        self.ledger = ledger
        self.job_id = job_id
        self.cursor = since_id
        """None until the end of the ledger is read (no --since-id)."""
        self.server = server

    def run(self, bounds: tuple[int | None, float, float], as_json: bool) -> int:
        max_events, idle_timeout, poll = bounds
        seen = 0
        idle_deadline = time.monotonic() + idle_timeout
        while True:
            budget = 0 if max_events is None else max_events - seen
            page = self.server.call(partial(self._read, budget), give_up_at=idle_deadline)
            for event in page.events:
                print_event(event, as_json)
            seen, self.cursor = seen + len(page.events), page.cursor
            if max_events is not None and seen >= max_events:
                return control("end", "max_events", as_json, self.cursor)
            if page.events:
                idle_deadline = time.monotonic() + idle_timeout
            elif time.monotonic() >= idle_deadline:
                return control("end", "idle_timeout", as_json, self.cursor)
            self.server.pause(poll)

    def _read(self, budget: int) -> Page:
        """The next page after the cursor; a stop signal cuts it short (it
        prints nothing, so nothing is left half-written)."""
        with self.server.signals.interruptible():
            if self.cursor is None:
                self.cursor = self.ledger.end()
            return self.ledger.fetch(self.cursor, self.job_id, budget)


def print_event(event: dict[str, Any], as_json: bool) -> None:
    if as_json:
        write_json(event)
    else:
        click.echo(event_line(event))


def control(kind: str, reason: str, as_json: bool, cursor: int | None, message: str = "") -> int:
    """The last frame; `cursor` is null only when the ledger was never read
    (no --since-id, and the server never answered)."""
    frame: dict[str, Any] = {"type": kind, "reason": reason, "cursor": cursor}
    if message:
        frame["message"] = message
    if as_json:
        write_json({"control": frame})
    else:
        click.echo(f"spoolctl: events {kind}: {reason} {message}".rstrip(), err=True)
    return 0


def event_line(event: dict[str, Any]) -> str:
    """One event for people: id, time, its job (or lane), kind, worker and
    its detail as compact JSON, every value shown escaped."""
    worker = f"  {shown(event['worker_id'])}" if event["worker_id"] else ""
    when = local_time(event["at"])
    detail = detail_text(event["detail"])
    kind = shown(event["event"])
    gone = event["detail"].get("job_id") if isinstance(event["detail"], dict) else None
    if event["job_id"] is None and isinstance(gone, int):  # a removed job: its row is gone
        head = f"{event['id']:>6}  {when}  job {gone:<6} {kind}{worker}"
    elif event["job_id"] is None:  # a lane event: paused, resumed
        lane = event["detail"].get("queue") if isinstance(event["detail"], dict) else None
        head = f"{event['id']:>6}  {when}  lane {shown(lane or '?'):<5} {kind}{worker}"
    else:
        head = f"{event['id']:>6}  {when}  job {event['job_id']:<6} {kind}{worker}"
    return f"{head}  {detail}" if detail else head


def detail_text(detail: Any) -> str:
    """An event's detail on one line: compact JSON, escaped (JSON leaves C1
    controls, U+2028 and lone surrogates raw); empty when it has none."""
    if detail is None or detail == {}:
        return ""
    return shown(json.dumps(detail, ensure_ascii=False, separators=(",", ":"), default=str))


def events_text(page: Page) -> str:
    lines = [event_line(e) for e in page.events] or ["no events"]
    lines.append(f"cursor: {page.cursor}")
    return "\n".join(lines)
