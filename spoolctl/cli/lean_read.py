"""The lean path of the read-only verbs `status`, `list` and `show` on an
SQLite queue: answered without importing click or SQLAlchemy, by the same
reads (`services/readings.py`: named statements, one assembly), the same
text (`cli/read_text.py`) and the same envelope (`cli/reply.py`) as the
click verbs. Anything else (another flag or shape of the command line,
--watch, a tag filter, several states, a queue that is not a plain SQLite
file at this code's revision or does not exist yet, any error) is left to
the click verb, which answers it in the contract's words: nothing visible
has happened by then. tests/unit/test_lean.py runs both paths on the same
inputs and compares their answers byte for byte."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from spoolctl import validate
from spoolctl.cli.look import line_width
from spoolctl.cli.read_text import list_text, status_text
from spoolctl.cli.reply import Reply, emit, emit_error
from spoolctl.config import Timing, auto_migrate, busy_timeout_s, local_clock
from spoolctl.db.lean import LeanQueue, Unanswered
from spoolctl.db.where import named_db
from spoolctl.errors import InvalidInput, NotFound, SpoolError
from spoolctl.services import job_reads, readings
from spoolctl.services.readings import SUSPENDED
from spoolctl.states import JobState

T = TypeVar("T")

DB_TEXT_MAX: int = validate.LIMITS["db"]["max_length"]
"""The longest --db value (as the click verb's `db_option` reads it)."""
STATE_NAMES = [s.value for s in JobState]
Flags = dict[str, Any]


def read_line(
    args: list[str], switches: frozenset[str], valued: frozenset[str], positional: int = 0
) -> tuple[Flags, list[str]] | None:
    """The flags (a switch: True; a flag with a value: its text) and the
    positional words of a command line of the plain shape click reads the
    same way: each flag known and given once, a value inline (`--f=v`) or
    next (not starting with `-`), at most `positional` words; None for any
    other shape."""
    flags: Flags = {}
    words: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("-"):
            words.append(arg)
            i += 1
            continue
        flag, eq, inline = arg.partition("=")
        if flag in flags:
            return None
        if arg in switches:
            flags[arg] = True
            i += 1
        elif flag in valued and eq:
            flags[flag] = inline
            i += 1
        elif flag in valued and i + 1 < len(args) and not args[i + 1].startswith("-"):
            flags[flag] = args[i + 1]
            i += 2
        else:
            return None
    return (flags, words) if len(words) <= positional else None


def _read(db: str | None, fn: Callable[[LeanQueue, float], T]) -> T:
    """fn's answer (given the queue and its clock's reading) from the queue
    --db names, read as a read-only verb reads it; `Unanswered` where the
    lean path cannot read it (a URL, no queue yet, another revision: the
    full path says why)."""
    auto_migrate()  # the knobs every verb that opens a queue checks first
    named = named_db(None if db is None else validate.bounded_text(db, "path", DB_TEXT_MAX))
    path = named.plain_file()
    if path is None:
        raise Unanswered("not a plain SQLite file")
    queue = LeanQueue.open_read(path, busy_timeout_s())
    try:
        now = local_clock()()
        return queue.read(lambda run: fn(run, now))
    finally:
        queue.close()


Answer = tuple[Reply | SpoolError, bool]
"""A reply or an error, and whether it is asked for as JSON."""


def status(args: list[str]) -> Answer | None:
    found = read_line(args, frozenset({"--json", "--wide"}), frozenset({"--limit", "--db"}))
    if found is None:
        return None
    flags, _ = found
    limit = validate.int_in_range(flags.get("--limit", "10"), "value", 0, 1000)
    shown_at = time.time()
    live = Timing.from_env().reap_threshold_s
    data = _read(flags.get("--db"), lambda run, now: readings.status_data(run, now, limit, live))
    as_json = "--json" in flags
    text = None if as_json else status_text(data, shown_at, line_width("--wide" in flags))
    return Reply(data, text=text), as_json


def list_jobs(args: list[str]) -> Answer | None:
    found = read_line(
        args,
        frozenset({"--json", "--waiting", "--wide"}),
        frozenset({"--state", "--queue", "--priority-min", "--limit", "--db"}),
    )
    if found is None:
        return None
    flags, _ = found
    state = None if "--state" not in flags else one_state(flags["--state"])
    if state == "":
        return None  # several states: the click verb's statement
    if "--waiting" in flags:
        state = JobState.WAITING.value
    lane = None if "--queue" not in flags else validate.lane_name(flags["--queue"])
    low, high = validate.INT32_MIN, validate.INT32_MAX
    given = flags.get("--priority-min")
    priority_min = None if given is None else validate.int_in_range(given, "value", low, high)
    limit = validate.int_in_range(flags.get("--limit", "100"), "value", 0, 1000)
    jobs, pagination = _read(
        flags.get("--db"),
        lambda run, _now: job_reads.list_data(run, state, lane, priority_min, limit),
    )
    data = {"count": len(jobs), "jobs": jobs}
    as_json = "--json" in flags
    text = None if as_json else list_text(jobs, line_width("--wide" in flags))
    return Reply(data, text=text, meta={"pagination": pagination}), as_json


def one_state(text: str) -> str:
    """The state --state names (as the click verb's StateList reads it); ""
    where it names several, or `suspended` (no named statement finds those:
    the click verb's). A value it refuses raises its InvalidInput."""
    states = tuple(dict.fromkeys(s.strip() for s in text.split(",")))
    if not text.strip() or any(s not in (*STATE_NAMES, SUSPENDED) for s in states):
        raise InvalidInput(f"--state: not one of {STATE_NAMES}")
    return states[0] if len(states) == 1 and states[0] != SUSPENDED else ""


def show(args: list[str]) -> Answer | None:
    found = read_line(args, frozenset({"--json"}), frozenset({"--db"}), positional=1)
    if found is None or len(found[1]) != 1 or "--json" not in found[0]:
        return None  # the text of `show` is the click verb's
    flags, (word,) = found
    job_id = validate.int_in_range(word, "value", 1, validate.INT64_MAX)
    live = Timing.from_env().reap_threshold_s
    detail = _read(flags.get("--db"), lambda run, now: job_reads.show_data(run, job_id, now, live))
    if detail is None:
        return NotFound(f"no job {job_id}", job_id=job_id), True
    return Reply(detail), True


ANSWERS: dict[str, Callable[[list[str]], Answer | None]] = {
    "status": status,
    "list": list_jobs,
    "show": show,
}


def answer(verb: str, args: list[str]) -> int | None:
    """The exit code once the lean path answered `verb ARGS`; None: go the
    full way, nothing visible having happened."""
    try:
        found = ANSWERS[verb](args)
    except Exception:  # the click verb answers, in the contract's words
        return None
    if found is None:
        return None
    said, as_json = found
    try:
        if isinstance(said, SpoolError):
            return emit_error(said, as_json, verb)
        return emit(said, as_json)
    except BrokenPipeError:
        return 0
