"""The table's columns and how a cell is written, shared by report.py and
report_long.py: cells read "median [min..max]" over the samples of one side,
ratios "median x [min..max]" over interleaved pairs."""

from __future__ import annotations

from typing import Any

Row = dict[str, str]
COLUMNS = {
    "metric": "metric",
    "ours": "ours",
    "ref": "ref 0.4.11",
    "ratio": "ours/ref (pairs)",
    "ceiling": "of ceiling",
    "target": "target",
    "verdict": "",
}


def row(metric: str, ours: str = "", ref: str = "", ratio: str = "", **more: str) -> Row:
    out = dict.fromkeys(COLUMNS, "")
    out.update(metric=metric, ours=ours, ref=ref, ratio=ratio, **more)
    return out


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def cell(spread: dict[str, Any], scale: float = 1.0, fmt: str = ".0f") -> str:
    if not spread or not spread.get("n"):
        return "-"
    med, lo, hi = (spread[k] * scale for k in ("median", "min", "max"))
    return f"{med:{fmt}} [{lo:{fmt}}..{hi:{fmt}}]"


def ratio(spread: dict[str, Any]) -> str:
    if not spread or not spread.get("n"):
        return ""
    return f"{spread['median']:.2f}x [{spread['min']:.2f}..{spread['max']:.2f}]"
