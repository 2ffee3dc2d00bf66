"""A schedule's fire times: the instants its occurrences are due, as epoch
seconds.

Cron expressions are evaluated by cronsim (imported here, lazily, only when a
schedule is validated or due: `spoolctl add` and an idle worker never load
it) in the schedule's named IANA zone (zoneinfo). cronsim handles daylight
saving as Debian's cron does: a local time the change skips fires once, at
the first instant after the gap. A local time the change repeats matches
twice in cronsim for some expressions (`*/20 3 * * *`); here it fires once,
at its first occurrence: the second instance of a repeated wall time
(`fold == 1`) is never a fire time.

`--every` fire times are `anchor + k * every` for whole k: anchored at the
start, never drifting with run times, and blind to daylight saving (an
interval is elapsed time, not wall time). (The database keeps the older
word in its column names: `slot_at`, `last_slot_at`.)
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from spoolctl.errors import InvalidInput

if TYPE_CHECKING:
    from zoneinfo import ZoneInfo

MIN_EVERY_S = 1.0
"""The shortest `--every` interval."""
CRON_FIELDS = 5
"""minute hour day-of-month month day-of-week: one minute is the finest."""
SCAN_LIMIT = 100_000
"""Matches read before giving up on finding a fire time (an expression that
matches only on 31 February never does)."""


@dataclass(frozen=True)
class Recurrence:
    cron: str | None
    every_s: float | None
    timezone: str
    anchor_at: float

    def next_after(self, t: float) -> float:
        """The first fire time strictly after `t`."""
        if self.every_s is not None:
            if t < self.anchor_at:
                return self.anchor_at
            k = math.floor((t - self.anchor_at) / self.every_s) + 1
            at = self.anchor_at + k * self.every_s
            return at if at > t else self.anchor_at + (k + 1) * self.every_s
        for at in _cron_fire_times(self._cron(), zone(self.timezone), t, reverse=False):
            return at
        raise InvalidInput(f"cron expression {self.cron!r} never matches", cron=self.cron)

    def latest_up_to(self, t: float, since: float, limit: int) -> list[float]:
        """The fire times in [since, t], oldest first: at most the `limit` latest."""
        if self.every_s is not None:
            if t < self.anchor_at:
                return []
            top = math.floor((t - self.anchor_at) / self.every_s)
            found = []
            for k in range(top, max(top - limit, -1), -1):
                at = self.anchor_at + k * self.every_s
                if at < since:
                    break
                if at <= t:
                    found.append(at)
            return sorted(found)
        found = []
        for at in _cron_fire_times(self._cron(), zone(self.timezone), t + 60, reverse=True):
            if at < since or len(found) >= limit:
                break
            if at <= t:
                found.append(at)
        return sorted(found)

    def upcoming(self, t: float, count: int) -> list[float]:
        """The next `count` fire times after `t`."""
        found: list[float] = []
        while len(found) < count:
            t = self.next_after(t)
            found.append(t)
        return found

    def _cron(self) -> str:
        assert self.cron is not None
        return self.cron


NICKNAMES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
"""cron's nicknames, as Debian's cron reads them (in the schedule's zone);
kept as written in the schedule, read as these five fields."""


def cron_fields(expr: str) -> str:
    """The five fields an expression means (a nickname's, in any case)."""
    return NICKNAMES.get(expr.lower(), expr)


def _cron_fire_times(expr: str, tz: ZoneInfo, t: float, *, reverse: bool) -> Iterator[float]:
    from cronsim import CronSim, CronSimError

    start = datetime.fromtimestamp(t, tz)
    try:
        matches = CronSim(cron_fields(expr), start, reverse=reverse)
    except CronSimError as exc:
        raise InvalidInput(f"bad cron expression {expr!r}: {exc}", cron=expr) from None
    for n, moment in enumerate(matches):
        if n >= SCAN_LIMIT:
            return
        if moment.fold == 1 and _repeated(moment):
            continue
        yield moment.timestamp()


def _repeated(moment: datetime) -> bool:
    """Whether this wall time also occurred earlier (the clocks went back)."""
    first = moment.replace(fold=0)
    return first.utcoffset() != moment.utcoffset()


def zone(name: str) -> ZoneInfo:
    """The IANA zone `name`; INVALID_INPUT if this machine does not know it."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidInput(
            f"unknown time zone {name!r}: give an IANA name such as Europe/Berlin or UTC "
            "(the system's zone database, or the tzdata package, must know it)",
            timezone=name,
        ) from None


def check_cron(expr: str) -> str:
    """A cron expression cronsim accepts, of five fields, or one of cron's
    nicknames (`@daily`, `@hourly`, `@weekly`, `@monthly`, `@yearly`,
    `@annually`, `@midnight`), kept as written, in lower case."""
    from cronsim import CronSim, CronSimError

    expr = " ".join(expr.split())
    if expr.lower() in NICKNAMES:
        expr = expr.lower()
    elif expr.startswith("@"):
        raise InvalidInput(
            f"unknown cron nickname {expr!r}: give one of {', '.join(NICKNAMES)} "
            "(a schedule fires at times; @reboot has none), or five fields",
            cron=expr,
        )
    fields = expr.split(" ")
    if not expr.startswith("@") and len(fields) != CRON_FIELDS:
        raise InvalidInput(
            f"a cron expression has {CRON_FIELDS} fields (minute hour day month weekday; one "
            f"minute is the finest), got {len(fields)}: {expr!r}; for seconds use --every",
            cron=expr,
        )
    try:
        CronSim(cron_fields(expr), datetime.now().astimezone())
    except CronSimError as exc:
        raise InvalidInput(f"bad cron expression {expr!r}: {exc}", cron=expr) from None
    return expr


def local_zone_name() -> str:
    """The IANA name of this machine's zone (TZ, /etc/timezone, /etc/localtime),
    or UTC when it has none."""
    import contextlib
    import os
    from pathlib import Path

    candidates = [os.environ.get("TZ", "").lstrip(":")]
    with contextlib.suppress(OSError):
        candidates.append(Path("/etc/timezone").read_text().strip())
    try:
        target = str(Path("/etc/localtime").resolve())
        if "zoneinfo/" in target:
            candidates.append(target.split("zoneinfo/", 1)[1])
    except OSError:
        pass
    for name in candidates:
        if name and "/" not in name[:1]:
            try:
                zone(name)
            except InvalidInput:
                continue
            return name
    return "UTC"


def iso(t: float, timezone: str) -> str:
    """`t` as ISO-8601 in the schedule's zone (with its offset)."""
    return datetime.fromtimestamp(t, zone(timezone)).isoformat()
