"""The lean path (placeholder while it is built)."""

from __future__ import annotations


def answer(args: list[str]) -> int | None:
    return None
