"""The lean path: the command lines answered without importing click or
SQLAlchemy, each exactly as its click verb answers it (a third or less of
its CPU; docs/performance.md): `add` of one command (`cli/lean_add.py`),
and the read-only `status`, `list` and `show` (`cli/lean_read.py`), on an
SQLite queue. Each loads only what its verb needs; anything it cannot
answer exactly goes the full way (None) before anything is visible.
tests/unit/test_lean.py runs both paths on the same inputs and compares
the rows, the events and the envelopes."""

from __future__ import annotations

READ_VERBS = frozenset({"status", "list", "show"})
"""The read-only verbs `cli/lean_read.py` answers."""


def answer(args: list[str]) -> int | None:
    """The exit code, once the lean path has answered; None: go the full way."""
    if not args:
        return None
    if args[0] == "add":
        from spoolctl.cli.lean_add import answer as answer_add

        return answer_add(args)
    if args[0] in READ_VERBS:
        from spoolctl.cli.lean_read import answer as answer_read

        return answer_read(args[0], args[1:])
    return None
