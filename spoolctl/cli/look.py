"""How answers look to people: styles, times, ages and aligned tables that
fit the terminal. Light (no click, no shutil): the click verbs (through
`cli/render.py`) and the lean path (`cli/lean_read.py`) both draw with it,
so both write the same bytes. `style` writes what click.style writes for
the styles used here.

Widths are display widths: a style's escape codes take no room, a wide
(East Asian) character takes two columns, a combining mark none. A view
fits `line_width()` columns: `--wide` sets no limit; otherwise `COLUMNS`
where it is a positive whole number, else the terminal's width where
stdout is a terminal, else no limit (a pipe or a file: `| grep` finds the
whole command, `| less -S` scrolls sideways)."""

from __future__ import annotations

import os
import re
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


ANSI_STYLE = re.compile(r"\033\[[;?0-9]*[a-zA-Z]")
"""A style's escape code (what `styled` writes)."""
GAP = "  "
"""Between two columns of a table."""


def use_color() -> bool:
    """Colour where stdout is a terminal and NO_COLOR is unset or empty
    (no-color.org: any non-empty value turns it off)."""
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR")


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


def line_width(wide: bool = False) -> int | None:
    """The columns a view may fill (None: no limit), by the rule of this
    module's docstring."""
    if wide:
        return None
    given = os.environ.get("COLUMNS", "").strip()
    if given.isdigit() and int(given) > 0:
        return int(given)
    try:
        if sys.stdout.isatty():
            return os.get_terminal_size(sys.stdout.fileno()).columns or None
    except (OSError, ValueError, AttributeError):  # not a real stream (a test's capture)
        pass
    return None


def ellipsis() -> str:
    """What ends a cut cell: `…`, or `...` where stdout cannot encode it."""
    try:
        "…".encode(getattr(sys.stdout, "encoding", None) or "utf-8")
    except (UnicodeEncodeError, LookupError):
        return "..."
    return "…"


def char_width(ch: str) -> int:
    if ch.isascii():
        return 1
    import unicodedata  # a C module: cheap, and only for text that needs it

    if unicodedata.combining(ch):
        return 0
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def width_of(text: str) -> int:
    """The columns `text` takes on a terminal: styles take none."""
    if "\033" in text:
        text = ANSI_STYLE.sub("", text)
    if text.isascii():
        return len(text)
    return sum(map(char_width, text))


def clip(text: str, width: int, mark: str = "…") -> str:
    """`text` (unstyled) in at most `width` columns: cut, and ended with
    `mark`, where it is wider."""
    if width_of(text) <= width:
        return text
    room = max(width - width_of(mark), 0)
    kept, used = [], 0
    for ch in text:
        used += char_width(ch)
        if used > room:
            break
        kept.append(ch)
    return "".join(kept) + mark if width >= width_of(mark) else mark[:width]


def padded(text: str, width: int) -> str:
    """`text` and spaces up to `width` columns (styles take none)."""
    return text + " " * (width - width_of(text))


def fitted(widths: list[int], limit: int, flexible: dict[int, int]) -> list[int]:
    """Column widths whose line (with the gaps) fits `limit`: the flexible
    columns (index: the narrowest each may get) are narrowed, the widest
    first, never below their floor; the others keep their width (so a line
    is wider than `limit` only where those alone are)."""
    over = sum(widths) + len(GAP) * (len(widths) - 1) - limit
    floors = {i: min(widths[i], low) for i, low in flexible.items()}
    if over <= 0 or not floors:
        return widths

    def saved(level: int) -> int:
        return sum(widths[i] - max(low, min(widths[i], level)) for i, low in floors.items())

    low, high = 0, max(widths[i] for i in floors)  # saved(high) == 0
    while low < high:  # the highest level that saves enough (or 0)
        mid = (low + high + 1) // 2
        low, high = (mid, high) if saved(mid) >= over else (low, mid - 1)
    spare = max(saved(low) - over, 0)
    out = list(widths)
    for i in sorted(floors):
        out[i] = max(floors[i], min(widths[i], low))
        if spare and out[i] == low and low < widths[i] and low >= floors[i]:
            out[i] += 1  # what the level saved beyond `over`, given back
            spare -= 1
    return out


def table(
    headers: list[str],
    rows: list[list[str]],
    width: int | None = None,
    flexible: dict[int, int] | None = None,
    droppable: tuple[int, ...] = (),
) -> str:
    """Aligned columns for people, padded by display width. Where `width`
    is given and a line would be wider, the `flexible` columns (index: the
    narrowest each may get, never narrower than its heading; their cells are
    never styled) are narrowed, see
    `fitted`, and their cells cut with an ellipsis; where even that is too
    wide, the `droppable` columns are left out, in that order, until it fits."""
    widths = [width_of(h) for h in headers]
    for row in rows:
        widths = [max(w, width_of(c)) for w, c in zip(widths, row, strict=True)]
    cut = {i: max(low, width_of(headers[i])) for i, low in (flexible or {}).items()}
    shown = list(range(len(headers)))
    if width is not None:
        for gone in droppable:
            narrowest = sum(min(widths[i], cut.get(i, widths[i])) for i in shown)
            if narrowest + len(GAP) * (len(shown) - 1) <= width:
                break
            shown.remove(gone)
    if len(shown) < len(headers):
        headers = [headers[i] for i in shown]
        rows = [[row[i] for i in shown] for row in rows]
        widths = [widths[i] for i in shown]
        cut = {shown.index(i): low for i, low in cut.items() if i in shown}
    if width is not None and cut:
        widths = fitted(widths, width, cut)
    mark = ellipsis()

    def line(cells: list[str]) -> str:
        return GAP.join(
            padded(clip(c, w, mark) if i in cut else c, w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return "\n".join([style(line(headers), bold=True), *map(line, rows)])


def fit_line(text: str, width: int | None) -> str:
    """One line of plain text in `width` columns (None: as it is)."""
    return text if width is None else clip(text, width, ellipsis())


def wrapped(parts: list[str], width: int | None, first: str, then: str) -> list[str]:
    """`parts` after `first`, two spaces apart, broken into lines of at most
    `width` columns where it is given (a later line starts with `then`); a
    part is never split."""
    lines: list[str] = []
    line, fresh = first, True
    for part in parts:
        joined = line + ("" if fresh else GAP) + part
        if not fresh and width is not None and width_of(joined) > width:
            lines.append(line)
            joined = then + part
        line, fresh = joined, False
    return [*lines, line]
