"""click's parse errors in the contract's words, and the progress line; how
answers look (styles, times, tables) is `cli/look.py`'s, re-exported here."""

from __future__ import annotations

import re
import sys
from typing import Any

import click

from spoolctl.cli.look import age, line_width, local_time, style, table, use_color
from spoolctl.errors import (
    InvalidInput,
    MissingRequired,
    SpoolError,
    UnknownCommand,
    UnknownFlag,
)

__all__ = [
    "ProgressLine",
    "SpoolUsage",
    "age",
    "from_click",
    "line_width",
    "local_time",
    "style",
    "table",
    "unknown_command",
    "use_color",
    "wide_option",
]

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


wide_option = click.option(
    "--wide",
    is_flag=True,
    help="Every cell uncut. Default: fit the width of COLUMNS, else of the terminal"
    " (cells of free text cut with …); no limit where stdout is not a terminal.",
)
"""The views' --wide (`cli/look.py`'s `line_width` reads it)."""


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
