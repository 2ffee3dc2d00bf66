"""JSON columns in and out. A damaged value is reported, never followed."""

from __future__ import annotations

import json
import re
from typing import Any

_SURROGATE = re.compile("[\ud800-\udfff]")


class DamagedValue(ValueError):
    """A stored JSON value is not what the schema promises."""


def dumps(value: Any) -> str:
    return json_text(json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=True))


def json_text(text: str) -> str:
    """JSON text that any UTF-8 store or stream accepts: a lone surrogate (an
    argv byte that is not UTF-8, PEP 383) is written as its `\\udcXX` escape,
    which reads back as the same string."""
    return _SURROGATE.sub(lambda found: f"\\u{ord(found.group()):04x}", text)


def load_argv(raw: str | None) -> list[str]:
    try:
        value = json.loads(raw) if raw is not None else None
    except ValueError:
        raise DamagedValue(f"argv is not JSON: {raw!r:.80}") from None
    if not isinstance(value, list) or not value or not all(isinstance(a, str) for a in value):
        raise DamagedValue(f"argv is not a non-empty list of strings: {raw!r:.80}")
    return value


def load_timeout(raw: object) -> int:
    """A stored timeout must be a whole number of seconds >= 0 (0: no timeout)."""
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        raise DamagedValue(f"timeout_seconds is not a whole number >= 0: {raw!r:.40}")
    return raw


def load_cwd(raw: object) -> str | None:
    if raw is not None and (not isinstance(raw, str) or not raw or "\0" in raw):
        raise DamagedValue(f"cwd is not a path: {raw!r:.40}")
    return raw


def load_str_map(raw: str | None) -> dict[str, str]:
    if raw is None or raw == "":
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        raise DamagedValue(f"not JSON: {raw!r:.80}") from None
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise DamagedValue(f"not an object of strings: {raw!r:.80}")
    return value


def load_codes(raw: str | None) -> list[int] | None:
    """A JSON list of exit codes (`requeue_exits`); None where the column is null."""
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        raise DamagedValue(f"not JSON: {raw!r:.80}") from None
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        raise DamagedValue(f"not a list of whole numbers: {raw!r:.80}")
    return value


def load_detail(raw: str | None) -> Any:
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return {"raw": raw}
