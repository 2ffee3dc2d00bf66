"""Templates and the filters they use. Jinja2 escapes every value (autoescape
is on for every template); the only markup built here is this module's own,
around escaped values, so nothing a job controls reaches a page unescaped.
Before that, every string a template prints passes through
`spoolctl.text.shown` (the environment's `finalize`): a control character or
an invisible one shows as its escape (`\\x1b`, `\\r`), never as a box or as
nothing, and a lone surrogate (a byte that is not UTF-8) as `\\xXX` instead
of failing the response's encoding."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup, escape

from spoolctl import __version__
from spoolctl.services.outcome import exit_label
from spoolctl.services.readings import SUSPENDED, shown_state
from spoolctl.states import EventKind, JobState
from spoolctl.text import shown, shown_argv, size_text
from spoolctl.web.common import SIGNALS

STATE_CLASSES = {state.value: f"state-{state.value}" for state in JobState}
STATE_CLASSES[SUSPENDED] = f"state-{SUSPENDED}"
"""Each state's badge; `suspended` is a running job's that is suspended."""
ATTEMPT_CLASSES = {
    "running": "state-running",
    "succeeded": "state-done",
    "failed": "state-dead",
    "timed_out": "state-dead",
    "abandoned": "state-canceled",
    "canceled": "state-canceled",
}


SHOWN_STATES = [state.value for state in JobState if state is not JobState.FAILED]
"""The states the overview counts (`failed` is never written)."""
EVENT_CLASSES = {kind.value: f"event-{kind.value}" for kind in EventKind}


def event_class(event: Any) -> str:
    """A CSS class for an event kind; one the code does not know gets `event-other`."""
    return EVENT_CLASSES.get(event, "event-other") if isinstance(event, str) else "event-other"


def timestamp(value: Any) -> Markup:
    """A <time> the page's script shows in local time with its age; UTC
    without the script."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return Markup('<span class="muted">—</span>')
    try:
        moment = datetime.fromtimestamp(value, UTC)
    except (OverflowError, OSError, ValueError):
        return Markup('<span class="muted">?</span>')
    iso = moment.isoformat(timespec="seconds").replace("+00:00", "Z")
    shown = moment.strftime("%Y-%m-%d %H:%M:%S UTC")
    return Markup('<time class="ts" datetime="{}" data-ts="{}">{}</time>').format(
        iso, repr(float(value)), shown
    )


def seconds(value: Any) -> str:
    """A duration in seconds, for people: 0.4 s, 12 s, 3 min, 2 h."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return "?"
    if value < 10:
        return f"{value:.1f} s"
    if value < 120:
        return f"{value:.0f} s"
    if value < 7200:
        return f"{value / 60:.0f} min"
    return f"{value / 3600:.1f} h"


def share(value: Any) -> str:
    """Devices or a part of one, as few digits as it takes: 2, 0.5, 0.3333."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return "?"
    return f"{round(float(value), 4):g}"


def command(argv: Any) -> str:
    """The command as the shell reads it back, escaped (`shown_argv`)."""
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        return "(damaged)"
    return shown_argv(argv)


def compact_json(value: Any) -> str:
    if value is None:
        return ""
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def state_badge(state: Any, classes: dict[str, str] = STATE_CLASSES) -> Markup:
    """A state as a coloured badge; a value the code does not know is shown
    as text with a neutral colour."""
    css = classes.get(state, "state-unknown") if isinstance(state, str) else "state-unknown"
    return Markup('<span class="badge {}">{}</span>').format(css, escape(shown(state)))


def attempt_badge(state: Any) -> Markup:
    return state_badge(state, ATTEMPT_CLASSES)


def attempt_exit(attempt: Any) -> str:
    """The Exit cell: the exit code, else the signal that stopped the job (a
    timed-out attempt has no exit code), else nothing."""
    return exit_label(attempt.get("exit_code"), attempt.get("signal")) or ""


def output(text: Any) -> Markup:
    """A stream's text (views.output_text made it) with its newlines and tabs:
    escaped here, so the environment's one-line `shown` leaves it alone."""
    return escape(shown(text, keep_newlines=True))


def printed(value: Any) -> Any:
    """What a template prints: strings shown escaped; markup this module built
    (already escaped) and other values as they are."""
    if isinstance(value, str) and not isinstance(value, Markup):
        return shown(value)
    return value


def make_environment() -> Environment:
    env = Environment(
        loader=PackageLoader("spoolctl.web", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=printed,
    )
    env.filters.update(
        ts=timestamp,
        secs=seconds,
        command=command,
        json=compact_json,
        badge=state_badge,
        attempt_badge=attempt_badge,
        event_class=event_class,
        exit_label=attempt_exit,
        output=output,
        size=size_text,
        share=share,
        shown_state=shown_state,
    )
    env.globals.update(
        version=__version__,
        states=list(STATE_CLASSES),
        shown_states=SHOWN_STATES,
        signals=SIGNALS,
    )
    return env
