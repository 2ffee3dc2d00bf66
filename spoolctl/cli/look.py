"""How answers look to people: styles, times, ages and aligned tables.
Light (no click): the click verbs (through `cli/render.py`) and the lean
path (`cli/lean_read.py`) both draw with it, so both write the same bytes.
`style` writes what click.style writes for the styles used here."""

from __future__ import annotations

import os
import sys
import time
from datetime import datetime

COLORS = {
    "black": 30,
    "red": 31,
    "green": 32,
    "yellow": 33,
    "blue": 34,
    "magenta": 35,
    "cyan": 36,
    "white": 37,
    "reset": 39,
}
"""The foreground colours by name, as click numbers them."""
RESET = "\033[0m"


def use_color() -> bool:
    return sys.stdout.isatty() and "NO_COLOR" not in os.environ


def styled(text: str, fg: str | None = None, bold: bool | None = None) -> str:
    """text in a colour and weight, then a reset (click.style's bytes)."""
    bits = []
    if fg is not None:
        bits.append(f"\033[{COLORS[fg]}m")
    if bold is not None:
        bits.append(f"\033[{1 if bold else 22}m")
    return "".join([*bits, text, RESET])


def style(text: str, fg: str | None = None, bold: bool | None = None) -> str:
    """Styled only where stdout is a terminal and NO_COLOR is unset."""
    return styled(text, fg=fg, bold=bold) if use_color() else text


def local_time(ts: float | None) -> str:
    if not isinstance(ts, int | float):
        return "-" if ts is None else "?"  # a damaged row: reported elsewhere
    try:
        return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError):
        return "?"  # beyond the calendar: a damaged row


def age(ts: float | None, now: float | None = None) -> str:
    if not isinstance(ts, int | float):
        return "-" if ts is None else "?"  # a damaged row: reported elsewhere
    seconds = (time.time() if now is None else now) - ts
    suffix = "ago" if seconds >= 0 else "from now"
    seconds = abs(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit} {suffix}"
    return f"{seconds:.0f}s {suffix}"


def table(headers: list[str], rows: list[list[str]]) -> str:
    """Aligned columns for people."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines[0] = style(lines[0], bold=True)
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)
