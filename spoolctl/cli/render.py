"""The envelope and text output, and the single map from exceptions to error
codes and exit codes. Every verb's output passes through `emit` or
`emit_error`."""

from __future__ import annotations

import os
import re
import sys
import time
from datetime import datetime
from typing import Any

import click

from spoolctl.errors import (
    InvalidInput,
    MissingRequired,
    SpoolError,
    UnknownCommand,
    UnknownFlag,
)

NUMBER = re.compile(r"^-[0-9.]")  # a negative number where click looked for a flag


def from_click(exc: click.ClickException) -> SpoolError:
    """Translate click's parse errors into the contract's codes."""
    message = exc.format_message()
    if isinstance(exc, click.NoSuchOption) and NUMBER.match(exc.option_name):
        return InvalidInput(f"{message} (a negative number is out of range here)")
    if isinstance(exc, click.NoSuchOption):
        detail: dict[str, Any] = {"flag": exc.option_name}
        if exc.possibilities:
            detail["did_you_mean"] = sorted(exc.possibilities)[0]
        return UnknownFlag(message, **detail)
    if isinstance(exc, click.MissingParameter):
        return MissingRequired(message)
    if isinstance(exc, SpoolUsage):
        return exc.error
    return InvalidInput(message)


class SpoolUsage(click.UsageError):
    """Carries one of our errors through click's parsing machinery."""

    def __init__(self, error: SpoolError) -> None:
        super().__init__(error.message)
        self.error = error


def unknown_command(name: str, choices: list[str]) -> UnknownCommand:
    import difflib

    close = difflib.get_close_matches(name, choices, n=1)
    detail: dict[str, Any] = {"command": name}
    hint = ""
    if close:
        detail["did_you_mean"] = close[0]
        hint = f" (did you mean {close[0]!r}?)"
    return UnknownCommand(f"no such command {name!r}{hint}", **detail)


def use_color() -> bool:
    return sys.stdout.isatty() and "NO_COLOR" not in os.environ


def style(text: str, **kwargs: Any) -> str:
    return click.style(text, **kwargs) if use_color() else text


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


class ProgressLine:
    """One self-overwriting status line on stderr, only for a person at a
    terminal: never on a pipe, never with --json."""

    def __init__(self, as_json: bool) -> None:
        self.active = not as_json and sys.stderr.isatty()
        self._width = 0

    def update(self, text: str) -> None:
        if not self.active:
            return
        sys.stderr.write("\r" + text.ljust(self._width))
        sys.stderr.flush()
        self._width = len(text)

    def done(self) -> None:
        if self.active and self._width:
            sys.stderr.write("\r" + " " * self._width + "\r")
            sys.stderr.flush()
            self._width = 0
