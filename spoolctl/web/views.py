"""What each page shows, read through the services layer: the web layer runs
no SQL of its own. Each function runs inside one read snapshot
(`QueueAccess.read`) and returns plain data for a template."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from spoolctl import validate
from spoolctl.config import Timing
from spoolctl.db.backends.base import OutputReader
from spoolctl.errors import InvalidInput
from spoolctl.services import (
    attempt_output,
    dependencies,
    job_spec,
    lanes,
    ledger,
    placement_web,
    query,
    readings,
)
from spoolctl.states import TERMINAL_JOB_STATES, AttemptState, JobState
from spoolctl.text import shown

if TYPE_CHECKING:
    from sqlalchemy import Connection

OVERVIEW_DEAD = 10
RUNNING_SHOWN = 500
"""Running jobs whose commands the overview names beside their workers."""
PAGE_SIZE = 50
PAGE_MAX = 200
EVENTS_PAGE = 100
EVENTS_LIVE_MAX = 500
OUTPUT_TAIL = 65_536
"""Bytes of each stream a job page shows at first (the end of the stream)."""
OUTPUT_CHUNK = 65_536
"""The most bytes of a stream one poll of a live page returns."""
STATES = tuple(s.value for s in JobState)
FILTER_STATES = (*STATES, readings.SUSPENDED)
"""What the job list's `state` filter takes: `suspended`, running ones suspended."""
COLOUR = re.compile(r"\x1b\[[0-9;:]*m")
"""SGR sequences (colours, bold): a page drops them, so coloured output reads as
its text; every other escape sequence is shown escaped."""
OPEN_ESCAPE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*)?\Z")
"""An escape sequence begun at the end of a read and not finished yet."""
ESCAPE_HOLD_MAX = 32
"""The longest unfinished sequence held back for the next read; a longer one
is no colour code and is shown escaped as it is."""


def empty_counts() -> dict[str, int]:
    return {state: 0 for state in STATES}


# -- overview -------------------------------------------------------------------


def overview(conn: Connection, now: float) -> dict[str, Any]:
    """`status` plus paused lanes, who serves each lane and the commands of
    running jobs."""
    data = query.status_summary(conn, now, dead_limit=OVERVIEW_DEAD)
    paused = lanes.paused_lanes(conn)
    by_lane: dict[str, dict[str, Any]] = data["queues"]
    for lane in paused:
        by_lane.setdefault(
            lane["queue"], {"counts": empty_counts(), "scheduled": 0, "suspended": 0}
        )
    by_name = {lane["queue"]: lane for lane in paused}
    threshold_s = Timing.from_env().reap_threshold_s
    serving = serving_workers(data["workers"], threshold_s)
    for name, entry in by_lane.items():
        entry["paused"] = by_name.get(name)
        entry["workers"] = serving.get(name, 0)
        entry["due"] = max(0, entry["counts"].get("queued", 0) - entry["scheduled"])
    running = query.list_jobs(
        conn, query.JobFilter(state=JobState.RUNNING.value, limit=RUNNING_SHOWN)
    )
    data["running"] = {job["id"]: job for job in running}
    data["lanes"] = sorted(by_lane.items())
    data["paused_lanes"] = paused
    data["now"] = now
    data.update(placement_web.overview(conn, data["workers"], now, threshold_s))
    return data


def serving_workers(workers: list[dict[str, Any]], silent_after: float) -> Counter[str]:
    """Live workers per lane: running, and heard from within the reap
    threshold (a worker killed without a word keeps its `running` row until a
    reaper comes; it serves nothing)."""
    return Counter(
        w["queue"]
        for w in workers
        if isinstance(w["heartbeat_age_s"], int | float) and w["heartbeat_age_s"] <= silent_after
    )


def empty_overview(now: float) -> dict[str, Any]:
    return {
        "counts": empty_counts(),
        "scheduled": 0,
        "suspended": 0,
        "queues": {},
        "lanes": [],
        "recent_dead": [],
        "workers": [],
        "orphans_unconfirmed": [],
        "paused_lanes": [],
        "running": {},
        "now": now,
        "gpus": None,
        "unplaceable": {"count": 0, "jobs": []},
    }


# -- job list ---------------------------------------------------------------------


@dataclass(frozen=True)
class Filters:
    """The filters of `list`, from a page's query string, and the page's cursor."""

    states: tuple[str, ...] = ()
    lane: str | None = None
    """The `queue` parameter: one lane's jobs."""
    tags: tuple[tuple[str, str | None], ...] = ()
    priority_min: int | None = None
    before: int | None = None
    limit: int = PAGE_SIZE

    def job_filter(self) -> query.JobFilter:
        return query.JobFilter(
            self.states or None, self.lane, self.tags, self.priority_min, self.limit, self.before
        )

    def params(self, **changes: Any) -> list[tuple[str, str]]:
        """The query string's pairs, with some changed (None drops one)."""
        values: dict[str, Any] = {
            "state": ",".join(self.states) or None,
            "queue": self.lane,
            "priority_min": self.priority_min,
            "before": self.before,
            "limit": None if self.limit == PAGE_SIZE else self.limit,
        }
        values.update(changes)
        pairs = [(k, str(v)) for k, v in values.items() if v is not None and k != "tag"]
        pairs += [("tag", key if value is None else f"{key}={value}") for key, value in self.tags]
        return pairs

    def link(self, **changes: Any) -> str:
        pairs = self.params(**changes)
        return "/jobs" + ("?" + urlencode(pairs) if pairs else "")

    @property
    def tag_text(self) -> str:
        return " ".join(k if v is None else f"{k}={v}" for k, v in self.tags)


def _one(params: Mapping[str, Sequence[str]], name: str) -> str | None:
    """A single-valued parameter; blank counts as absent."""
    values = [v for v in params.get(name, ()) if v.strip()]
    if len(values) > 1:
        raise InvalidInput(f"give {name} once", name=name)
    return values[0].strip() if values else None


def parse_states(raw: str | None) -> tuple[str, ...]:
    if raw is None:
        return ()
    states = tuple(dict.fromkeys(s.strip() for s in raw.split(",") if s.strip()))
    unknown = [s for s in states if s not in FILTER_STATES]
    if unknown:
        raise InvalidInput(f"unknown state {unknown[0]!r}; states: {', '.join(FILTER_STATES)}")
    return states


def parse_tags(values: Sequence[str]) -> tuple[tuple[str, str | None], ...]:
    tags: list[tuple[str, str | None]] = []
    for value in (v for raw in values for v in raw.split()):
        if "=" in value:
            tags.append(validate.key_value(value, "tag"))
        else:
            tags.append((value, None))
    if len(tags) > validate.TAG_MAX_COUNT:
        raise InvalidInput(f"at most {validate.TAG_MAX_COUNT} tag filters")
    return tuple(tags)


def priority_in_range(raw: str) -> int:
    return validate.int_in_range(raw, "priority_min", validate.INT32_MIN, validate.INT32_MAX)


def parse_filters(params: Mapping[str, Sequence[str]]) -> Filters:
    """The job list's filters from a query string; INVALID_INPUT names a bad one."""
    lane = _one(params, "queue")
    priority = _one(params, "priority_min")
    before = _one(params, "before")
    limit = _one(params, "limit")
    return Filters(
        states=parse_states(_one(params, "state")),
        lane=None if lane is None else validate.lane_name(lane),
        tags=parse_tags(params.get("tag", ())),
        priority_min=None if priority is None else priority_in_range(priority),
        before=None if before is None else validate.int_in_range(before, "before", 1),
        limit=PAGE_SIZE if limit is None else validate.int_in_range(limit, "limit", 1, PAGE_MAX),
    )


def job_list(conn: Connection, filters: Filters) -> dict[str, Any]:
    """One page of jobs, newest first, each with the jobs it waits for and its
    number of attempts (`attempts` counts failures)."""
    jobs, pagination = query.list_page(conn, filters.job_filter())
    ids = [job["id"] for job in jobs]
    waits = dependencies.waits_for(conn, ids)
    counts = query.attempt_counts(conn, ids)
    for job in jobs:
        job["after_jobs"] = waits.get(job["id"], [])
        job["attempts_total"] = counts.get(job["id"], 0)
    return {"jobs": jobs, "pagination": pagination}


# -- one job ----------------------------------------------------------------------


def job_page(
    conn: Connection,
    job_id: int,
    attempt_no: int | None,
    output_root: Path,
    reader: OutputReader,
    now: float,
) -> dict[str, Any] | None:
    """`show`'s data, the jobs it waits for and that wait for it, its request
    and its attempts' devices, and the end of the chosen attempt's output
    (None: no such job)."""
    detail = query.job_detail(conn, job_id)
    if detail is None:
        return None
    threshold_s = Timing.from_env().reap_threshold_s
    detail["placement"] = placement_web.job_placement(
        conn, detail["job"], detail["attempts"], now, threshold_s
    )
    detail["after_jobs"] = dependencies.waits_for(conn, [job_id]).get(job_id, [])
    detail["dependents"] = dependencies.dependents_of(conn, job_id)
    detail["terminal"] = detail["job"]["state"] in TERMINAL_JOB_STATES
    detail["labelled"] = job_spec.labelled(detail["job"])
    ref = attempt_output.confine(attempt_output.find_attempt(conn, job_id, attempt_no), output_root)
    detail["output"] = {
        "attempt_no": ref.attempt_no,
        "attempt_state": ref.state,
        "pinned": attempt_no is not None,
        "streams": {}
        if ref.attempt_no is None
        else {name: stream_tail(conn, ref, name, reader) for name in attempt_output.STREAMS},
    }
    return detail


def stream_tail(
    conn: Connection, ref: attempt_output.AttemptOutput, name: str, reader: OutputReader
) -> dict[str, Any]:
    """The last OUTPUT_TAIL bytes of a stream, as text, and where they end."""
    data, start, missing = reader.span(conn, ref, name, -OUTPUT_TAIL, OUTPUT_TAIL)
    head = skip_partial_head(data) if start else 0
    text, used = output_text(data[head:], final=ref.state != AttemptState.RUNNING)
    return {
        "text": text,
        "start": start + head,
        "offset": start + head + used,
        "missing": missing,
        "refused": name in ref.refused,
    }


def output_chunk(
    conn: Connection,
    job_id: int,
    attempt_no: int | None,
    name: str,
    offset: int,
    output_root: Path,
    reader: OutputReader,
) -> dict[str, Any]:
    """New bytes of a stream from `offset`, for a page following it live.

    The attempt's state is read before its bytes: once it is seen ended, the
    bytes read after hold everything it wrote (on PostgreSQL, the outcome's
    transaction stored the rest)."""
    ref = attempt_output.confine(attempt_output.find_attempt(conn, job_id, attempt_no), output_root)
    job = query.get_job_row(conn, job_id)
    job_state = None if job is None else str(job.state)
    reply: dict[str, Any] = {
        "attempt_no": ref.attempt_no,
        "attempt_state": ref.state,
        "running": ref.state == AttemptState.RUNNING,
        "job_terminal": job_state in TERMINAL_JOB_STATES,
        "text": "",
        "offset": offset,
        "more": False,
    }
    if ref.attempt_no is None:
        return reply
    data = reader.read(conn, ref, name, offset, OUTPUT_CHUNK)
    text, used = output_text(data, final=not reply["running"] and len(data) < OUTPUT_CHUNK)
    reply.update(text=text, offset=offset + used, more=len(data) == OUTPUT_CHUNK)
    return reply


def skip_partial_head(data: bytes) -> int:
    """Bytes to drop at the start of a span cut inside a UTF-8 character."""
    skip = 0
    while skip < min(3, len(data)) and data[skip] & 0xC0 == 0x80:
        skip += 1
    return skip


def output_text(data: bytes, *, final: bool) -> tuple[str, int]:
    """What a page shows of `data`, and the bytes it used: colour codes
    dropped; other controls and bytes that are not UTF-8 shown escaped
    (`spoolctl.text.shown`), newline and tab kept. A UTF-8 character or an
    escape sequence cut at the end is held back for the next read unless the
    stream is final, so a split colour code is dropped whole."""
    text, used = decode_complete(data, final=final)
    if not final:
        cut = OPEN_ESCAPE.search(text)
        if cut and len(text) - cut.start() <= ESCAPE_HOLD_MAX:
            used -= len(text) - cut.start()  # ASCII: one byte per character
            text = text[: cut.start()]
    return shown(COLOUR.sub("", text), keep_newlines=True), used


def decode_complete(data: bytes, *, final: bool) -> tuple[str, int]:
    """Text of `data` and the bytes it used: a UTF-8 character cut at the end
    is held back for the next read unless the stream is final. Bytes that are
    not UTF-8 decode to lone surrogates (surrogateescape), for `shown`."""
    used = len(data)
    if not final:
        for back in range(1, min(4, len(data)) + 1):
            byte = data[-back]
            if byte & 0xC0 == 0x80:
                continue
            if byte >= 0xC0 and back < _utf8_length(byte):
                used = len(data) - back
            break
    return data[:used].decode("utf-8", errors="surrogateescape"), used


def _utf8_length(lead: int) -> int:
    return 4 if lead >= 0xF0 else 3 if lead >= 0xE0 else 2


# -- the event ledger ---------------------------------------------------------------


def events_page(conn: Connection, before: int | None, job_id: int | None) -> dict[str, Any]:
    """The newest events (older than `before`), newest first, and the cursors
    for the next older page and for following new ones."""
    found = ledger.recent_events(conn, limit=EVENTS_PAGE + 1, before_id=before, job_id=job_id)
    events = found[:EVENTS_PAGE]
    return {
        "events": events,
        "older": events[-1]["id"] if len(found) > EVENTS_PAGE else None,
        "cursor": events[0]["id"] if events else 0,
    }


def events_after(conn: Connection, cursor: int, job_id: int | None) -> dict[str, Any]:
    """Events after the cursor (the `events --follow` read), newest first."""
    page = ledger.read_events(conn, since_id=cursor, job_id=job_id, limit=EVENTS_LIVE_MAX)
    return {"events": list(reversed(page.events)), "cursor": page.cursor}
