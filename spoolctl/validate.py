"""Grammars and limits of every user-supplied value (docs/design.md, Input).

Pure functions raising InvalidInput; the click parameter types and the
`add --batch` reader both call these, so each rule is written once.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import time
from datetime import datetime
from typing import Any

from spoolctl.errors import InvalidInput, MissingRequired

MAX_DURATION_S = 31_536_000_000
MAX_WAIT_S = 86_400
"""The longest any wait of a verb may be told to last (wait, events, --follow)."""
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_TIMEOUT_S = INT64_MAX
LANE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
"""Published as is (JSON Schema's `$` is the end of the text); Python's `$`
also matches before a final newline, so every pattern here is applied with
fullmatch."""
LANE_MAX = 64
ENV_KEY_MAX, ENV_VALUE_MAX = 128, 4096
TAG_MAX_COUNT, TAG_KEY_MAX, TAG_VALUE_MAX = 16, 128, 1024
NOTE_MAX = 10_000
KEY_MAX = 256
CWD_MAX = 4096
WORKER_ID_MAX = 256
DURATION_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([smhd]?)\s*$")
COMPOUND_RE = re.compile(r"^\s*((?:[0-9]+[dhms])+)\s*$")
"""A duration in whole parts, largest unit first: 1h30m, 2d12h, 1m30s."""
COMPOUND_PART_RE = re.compile(r"([0-9]+)([dhms])")
UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
UNIT_ORDER = "dhms"
NO_TIMEOUT = 0
"""A job's timeout_seconds that means no timeout at all (`--timeout none` or 0):
the column stays a whole number, as contract 2 publishes it."""
CPUS_MIN = 0.01
"""The smallest CPU quota a cgroup is given (1 ms of every 100 ms)."""

LIMITS: dict[str, Any] = {
    "duration_seconds": {"min": 0, "max": MAX_DURATION_S},
    "priority": {"min": INT32_MIN, "max": INT32_MAX},
    "timeout_seconds": {"min": 0, "max": MAX_TIMEOUT_S},
    "max_retries": {"min": 0, "max": INT64_MAX},
    "max_crashes": {"min": 0, "max": INT64_MAX},
    "id": {"min": 1, "max": INT64_MAX},
    "queue": {"min_length": 1, "max_length": LANE_MAX, "pattern": LANE_RE.pattern},
    "env": {"key_max": ENV_KEY_MAX, "value_max": ENV_VALUE_MAX},
    "tags": {"max_count": TAG_MAX_COUNT, "key_max": TAG_KEY_MAX, "value_max": TAG_VALUE_MAX},
    "note": {"max_length": NOTE_MAX},
    "key": {"min_length": 1, "max_length": KEY_MAX, "charset": "printable; no control characters"},
    "cwd": {"min_length": 1, "max_length": CWD_MAX},
    "db": {"min_length": 1, "max_length": 4096},
    "worker_id": {"min_length": 1, "max_length": WORKER_ID_MAX},
    "list_limit": {"min": 0, "max": 1000},
    "events_limit": {"min": 0, "max": 10_000},
    "tail_bytes": {"min": 1, "max": 65_536},
    "wait_seconds": {"min": 0, "max": MAX_WAIT_S},
    "poll_interval_seconds": {"min_exclusive": 0, "max": 3600},
    "memory_bytes": {"min": 1 << 20, "max": 1 << 50},
    "cpus": {"min": CPUS_MIN, "max": 1024},
    "requeue_exits": {"min": 1, "max": 255},
    "max_requeues": {"min": 0, "max": INT64_MAX},
    "signal_before_timeout": {"form": "SIGNAL@DURATION", "refused": ["SIGKILL", "SIGSTOP"]},
}


SURROGATE_RE = re.compile("[\ud800-\udfff]")
"""Lone surrogates: how Python hands over bytes that are not UTF-8 (PEP 383)."""


def utf8_text(raw: str, what: str) -> str:
    """Text fields must be valid UTF-8 (no byte that is not, no lone surrogate)."""
    found = SURROGATE_RE.search(raw)
    if found is not None:
        char = ord(found.group())
        shown = f"byte 0x{char - 0xDC00:02x}" if 0xDC80 <= char <= 0xDCFF else f"U+{char:04X}"
        raise InvalidInput(
            f"{what} is not valid UTF-8 text ({shown} at character {found.start()})", field=what
        )
    return raw


def duration(raw: str, *, what: str = "duration", maximum: float = MAX_DURATION_S) -> float:
    """`<number>[s|m|h|d]`, bare seconds, or whole parts largest unit first
    (`1h30m`, `2d12h`, `1m30s`); finite, 0 .. maximum."""
    match = DURATION_RE.fullmatch(raw)
    value = float(match.group(1)) * UNIT_S[match.group(2)] if match else _compound(raw, what)
    if not math.isfinite(value) or value > maximum:
        raise InvalidInput(f"{what} must be between 0 and {maximum:g} seconds, got {raw!r}")
    return value


def _compound(raw: str, what: str) -> float:
    """`1h30m`: whole numbers, each with its unit, each unit once, largest first."""
    match = COMPOUND_RE.fullmatch(raw)
    parts = COMPOUND_PART_RE.findall(match.group(1)) if match else []
    order = [UNIT_ORDER.index(unit) for _, unit in parts]
    if not parts or order != sorted(set(order)):
        raise InvalidInput(
            f"{what} must look like 30, 30s, 5m, 2h, 1d or 1h30m, got {raw!r}", value=raw
        )
    return float(sum(int(number) * UNIT_S[unit] for number, unit in parts))


def timestamp(raw: str, *, now: float | None = None) -> float:
    """Epoch seconds or ISO-8601 (naive means local time); a past time means now."""
    current = time.time() if now is None else now
    try:
        value = float(ascii_number(raw, "time"))
    except ValueError:
        try:
            value = datetime.fromisoformat(raw.strip()).timestamp()
        except ValueError:
            raise InvalidInput(
                f"time must be epoch seconds or ISO-8601, got {raw!r}", value=raw
            ) from None
    if not math.isfinite(value) or abs(value) > MAX_DURATION_S:
        raise InvalidInput(f"time is out of range (|epoch| <= {MAX_DURATION_S}): {raw!r}")
    return max(value, current)


INTEGER_RE = re.compile(r"[+-]?[0-9]+")
"""A whole number in ASCII digits: int() also reads other scripts' digits
(Arabic-Indic ٣, fullwidth ３) and underscores."""


LINE_REF_RE = re.compile(r"@[0-9]+")
"""A batch line's reference to an earlier line: "@N", N in ASCII digits."""


def ascii_number(raw: str, what: str) -> str:
    """raw, if it is ASCII: float() reads other scripts' digits too."""
    if not raw.isascii():
        raise InvalidInput(f"{what} must be written in ASCII digits 0-9, got {raw!r}", value=raw)
    return raw


def int_in_range(value: Any, what: str, low: int | None = None, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        text = str(value).strip()
        parsed = None
        if INTEGER_RE.fullmatch(text):
            with contextlib.suppress(ValueError):  # more than 4,300 digits
                parsed = int(text, 10)
        if parsed is None:
            raise InvalidInput(f"{what} must be a whole number in digits 0-9, got {value!r}")
        value = parsed
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"{'' if low is None else low} .. {'' if high is None else high}".strip()
        raise InvalidInput(f"{what} must be in {bounds}, got {value}", value=value)
    return int(value)


def timeout_seconds(raw: str) -> int:
    """Whole seconds 1 .. 2**63-1, or a duration with its unit like 5m or
    1h30m (rounded up); `none` or 0: no timeout (stored as 0, NO_TIMEOUT)."""
    if raw.strip() == "none":
        return NO_TIMEOUT
    if not raw.strip()[-1:].isalpha():
        return int_in_range(raw, "timeout", 0, MAX_TIMEOUT_S)
    seconds = math.ceil(duration(raw, what="timeout"))
    return int_in_range(seconds, "timeout", 0, MAX_TIMEOUT_S)


def signal_number(raw: str) -> int:
    """A signal named as the shell user names it (`TERM`, `SIGTERM`, `term`)
    or by number (`15`): one this platform knows, never 0. (`signal` is
    imported here, not with the module: it builds its enums at import, a
    cost `add` of a job without a signal flag need not pay.)"""
    import signal as signals

    text = raw.strip()
    if text.isascii() and text.isdigit():
        try:
            return signals.Signals(int(text)).value
        except ValueError:
            pass
    else:
        name = text.upper()
        name = name if name.startswith("SIG") else "SIG" + name
        member = getattr(signals.Signals, name, None) if name.isascii() else None
        if isinstance(member, signals.Signals):
            return member.value
    raise InvalidInput(
        f"expected a signal name or number such as TERM, INT, HUP or 15, got {raw!r}",
        value=raw,
    )


UNHEEDED = frozenset({"SIGKILL", "SIGSTOP"})
"""Signals a job cannot catch: no warning to act on."""


def timeout_warning(raw: str) -> str:
    """`--signal-before-timeout SIGNAL@DURATION` (`USR1@2m`, `TERM@30s`,
    `USR1@1m30s`): a signal the job can catch (never KILL or STOP) and a
    duration above 0, rounded up to whole seconds; answered in the form the
    job keeps, `SIGUSR1@120` (`warning_parts` reads it)."""
    text, at, when = str(raw).rpartition("@")
    if not at or not text.strip() or not when.strip():
        raise InvalidInput(
            f"signal_before_timeout must look like USR1@2m (a signal, @, a duration), got {raw!r}",
            value=raw,
        )
    import signal as signals

    number = signals.Signals(signal_number(text))
    if number.name in UNHEEDED:
        raise InvalidInput(
            f"signal_before_timeout cannot be {number.name}: a job cannot catch it to act "
            "on the warning",
            value=raw,
        )
    seconds = math.ceil(duration(when, what="signal_before_timeout's duration"))
    if seconds <= 0:
        raise InvalidInput(
            f"signal_before_timeout's duration must be above 0, got {raw!r}", value=raw
        )
    return f"{number.name}@{seconds}"


def warning_parts(kept: str) -> tuple[str, int]:
    """A kept `timeout_warning` (`SIGUSR1@120`): the signal's name and the seconds."""
    name, _, seconds = kept.rpartition("@")
    return name, int(seconds)


SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)
SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
MEMORY_MIN, MEMORY_MAX = 1 << 20, 1 << 50


def memory_size(raw: str) -> int:
    """Bytes, or a size with a binary unit (512M, 1.5G, 64k; KiB/MB spellings
    too, all powers of 1024), rounded down to a whole byte: 1 MiB .. 1 PiB."""
    found = SIZE_RE.fullmatch(str(raw))
    if found is None:
        raise InvalidInput(f"memory must be a size like 512M or 2G, got {raw!r}", value=raw)
    size = int(float(found.group(1)) * SIZE_UNITS[found.group(2).lower()])
    if not MEMORY_MIN <= size <= MEMORY_MAX:
        raise InvalidInput(f"memory must be 1M .. 1P, got {raw!r}", value=raw)
    return size


def cpus(raw: str) -> float:
    """CPUs the job may use (a cgroup quota): a number > 0, at most 1024."""
    try:
        value = float(ascii_number(str(raw).strip(), "cpus"))
    except ValueError:
        raise InvalidInput(f"cpus must be a number like 0.5 or 2, got {raw!r}") from None
    if not (math.isfinite(value) and 0 < value <= 1024):
        raise InvalidInput(f"cpus must be > 0 and at most 1024, got {raw!r}", value=raw)
    if value < CPUS_MIN:
        raise InvalidInput(
            f"cpus must be at least {CPUS_MIN} (a cgroup's smallest CPU quota), got {raw!r}",
            value=raw,
        )
    return value


def lane_name(raw: str) -> str:
    """A lane's name (`--queue`; a schedule's name follows the same grammar),
    refused in the words of the contract, which calls it a queue."""
    utf8_text(raw, "queue")
    if not (1 <= len(raw) <= LANE_MAX) or not LANE_RE.fullmatch(raw):
        raise InvalidInput(
            f"queue must be 1-{LANE_MAX} characters of letters, digits, '.', '_', '-', "
            f"starting with a letter or digit; got {raw!r}",
            value=raw,
        )
    return raw


def key_value(raw: str, what: str) -> tuple[str, str]:
    if "=" not in raw:
        raise InvalidInput(
            f"{what} must be KEY=VALUE, got {raw!r}", value=raw, did_you_mean=f"{raw}=VALUE"
        )
    key, value = raw.split("=", 1)
    if not key:
        raise InvalidInput(
            f"{what} needs a KEY before '=', got {raw!r}", value=raw, did_you_mean=f"KEY{raw}"
        )
    return key, value


def env_map(pairs: dict[str, str]) -> dict[str, str]:
    for key, value in pairs.items():
        utf8_text(key, "env key")
        utf8_text(value, f"env value of {key}")
        if not 1 <= len(key) <= ENV_KEY_MAX:
            raise InvalidInput(f"env key must be 1-{ENV_KEY_MAX} characters, got {key!r:.40}")
        if len(value) > ENV_VALUE_MAX:
            raise InvalidInput(f"env value of {key} is longer than {ENV_VALUE_MAX} characters")
        if "\0" in key or "\0" in value:
            raise InvalidInput(f"env {key!r:.40} contains a NUL character")
    return pairs


def tag_map(pairs: dict[str, str]) -> dict[str, str]:
    if len(pairs) > TAG_MAX_COUNT:
        raise InvalidInput(f"at most {TAG_MAX_COUNT} tags, got {len(pairs)}")
    for key, value in pairs.items():
        utf8_text(key, "tag key")
        utf8_text(value, f"tag value of {key}")
        if not 1 <= len(key) <= TAG_KEY_MAX:
            raise InvalidInput(f"tag key must be 1-{TAG_KEY_MAX} characters, got {key!r:.40}")
        if len(value) > TAG_VALUE_MAX:
            raise InvalidInput(f"tag {key} value is longer than {TAG_VALUE_MAX} characters")
        if "\0" in key or "\0" in value:
            raise InvalidInput(f"tag {key!r:.40} contains a NUL character")
    return pairs


def note(raw: str) -> str:
    utf8_text(raw, "note")
    if len(raw) > NOTE_MAX:
        raise InvalidInput(f"note is longer than {NOTE_MAX} characters")
    if "\0" in raw:
        raise InvalidInput("note contains a NUL character")
    return raw


def idempotency_key(raw: str) -> str:
    utf8_text(raw, "key")
    if not 1 <= len(raw) <= KEY_MAX or not raw.isprintable():
        raise InvalidInput(
            f"key must be 1-{KEY_MAX} printable characters without control characters"
        )
    return raw


def bounded_text(raw: str, what: str, maximum: int) -> str:
    utf8_text(raw, what)
    if not 1 <= len(raw) <= maximum or "\0" in raw:
        raise InvalidInput(f"{what} must be 1-{maximum} characters without NUL")
    return raw


def cwd(raw: str) -> str:
    """Made absolute at submit time, without collapsing symlinks."""
    bounded_text(raw, "cwd", CWD_MAX)
    return os.path.abspath(raw)


def existing_dir(path: str) -> str:
    """A job's working directory as submitted: a folder that exists on this
    machine (`add` checks it where the queue is a file here, SQLite)."""
    if not os.path.isdir(path):
        why = "is not a folder" if os.path.exists(path) else "does not exist"
        raise InvalidInput(f"cwd {path!r} {why} on this machine", field="cwd", value=path)
    return path


def argv(value: Any) -> list[str]:
    """Any bytes the OS passes (non-UTF-8 ones as U+DC80..U+DCFF, PEP 383);
    never NUL, never another lone surrogate (no byte stands behind it)."""
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(a, str) for a in value)
        or value[0] == ""
    ):
        raise InvalidInput("argv must be a non-empty list of strings with a program first")
    if any("\0" in a for a in value):
        raise InvalidInput("argv contains a NUL character")
    for arg in value:
        _encodable(arg, "argv")
    return value


def _encodable(arg: str, what: str) -> None:
    try:
        os.fsencode(arg)
    except UnicodeEncodeError as exc:
        raise InvalidInput(
            f"{what} holds U+{ord(arg[exc.start]):04X}, a lone surrogate that stands for no byte"
        ) from None


def shell_string(raw: str) -> list[str]:
    if not raw.strip():
        raise MissingRequired("-c needs a non-empty shell string")
    if "\0" in raw:
        raise InvalidInput("-c string contains a NUL character")
    _encodable(raw, "-c string")
    return ["sh", "-c", raw]
