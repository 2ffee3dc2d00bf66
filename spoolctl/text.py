"""Text a job or a submitter controls, made safe to show to a person.

Commands, notes, tags, keys, lane names, pause reasons, worker ids, errors
and output are written by whoever submits a job or runs a worker. Printed
as they are, an escape sequence in them can retitle the terminal, write the
clipboard (OSC 52) or move the cursor, and a carriage return or backspace
can make `echo safe\\rrm -rf ~` look like `rm -rf ~`. Every human view (the
CLI's text and the web pages) passes such text through `shown`, which
guarantees that no character the terminal or browser would act on, or draw
as nothing, gets through: each is written as a visible escape instead.
`--json` and `--raw` are not shown text and are left alone.

Standard library only: both `cli/` and `web/` import it.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable

NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
BYTE_SURROGATES = range(0xDC80, 0xDD00)
"""Lone surrogates that stand for bytes which are not UTF-8 (PEP 383's
surrogateescape): U+DCxx is the byte 0xXX."""
LINE_PARTS = re.compile(r"([\n\t])")
SHELL_QUOTED = {"\\": "\\\\", "'": "\\'"}
"""What must be escaped inside a $'...' word besides the unprintable."""


def escape_char(ch: str) -> str:
    """One character as a visible escape: `\\n`, `\\r`, `\\t`; `\\xXX` for the
    other controls (C0, DEL, C1) and for a byte that is not UTF-8; `\\uXXXX`
    or `\\UXXXXXXXX` for any other character that prints as nothing."""
    if ch in NAMED:
        return NAMED[ch]
    code = ord(ch)
    if code in BYTE_SURROGATES:
        return f"\\x{code - 0xDC00:02x}"
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def escaped(text: str) -> str:
    return "".join(ch if ch.isprintable() else escape_char(ch) for ch in text)


def shown(value: object, *, keep_newlines: bool = False) -> str:
    """`value` (as text) with every character that is not printable (controls, escape
    sequences' ESC and CSI, line and paragraph separators, format characters
    such as bidi overrides, lone surrogates) written as a visible escape; with
    `keep_newlines` (output previews and tails), newline and tab stay as they
    are. Never raises, whatever the string holds; a value that is not a
    string (a damaged row's) is shown as `str()` makes it."""
    text = value if isinstance(value, str) else str(value)
    if text.isprintable():
        return text
    if not keep_newlines:
        return escaped(text)
    return "".join(
        part if part in ("\n", "\t") or part.isprintable() else escaped(part)
        for part in LINE_PARTS.split(text)
    )


def shown_word(word: str) -> str:
    """One argument as a POSIX shell reads it back: quoted as `shlex.quote`
    does or, when it holds an unprintable character, as a bash/zsh `$'...'`
    word that reads back as the same bytes: there `\\n`, `\\r`, `\\t` are
    themselves, `\\xXX` is always a byte (the other C0 controls, DEL, a byte
    that is not UTF-8) and any other character is `\\uXXXX` or `\\UXXXXXXXX`."""
    if word.isprintable():
        return shlex.quote(word)
    return "$'" + "".join(map(shell_escape, word)) + "'"


def shell_escape(ch: str) -> str:
    if ch in SHELL_QUOTED:
        return SHELL_QUOTED[ch]
    if ch.isprintable():
        return ch
    if 0x80 <= ord(ch) <= 0xFF:  # a character, not the byte \xXX would be
        return f"\\u{ord(ch):04x}"
    return escape_char(ch)


def shown_argv(argv: Iterable[str]) -> str:
    """A command line for people: each argument quoted for the shell (as
    `shlex.join`) and escaped as `shown_word` does, so what is shown is what
    will run, `\\r` and all."""
    return " ".join(shown_word(word) for word in argv)


SIZE_UNITS = (("P", 1 << 50), ("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10))


def size_text(size: object) -> str:
    """A byte count as `--memory` reads it back, in the largest binary unit
    it is a whole number of (512M, 2G, 1536M; bytes where none); a value that
    is not a count (a damaged row's) as `str()` writes it."""
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        return str(size)
    for unit, bytes_ in SIZE_UNITS:
        if size % bytes_ == 0:
            return f"{size // bytes_}{unit}"
    return str(size)
