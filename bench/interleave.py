"""Interleaved repetitions, so that whatever changes on the machine during the
run (a disk slowing under sustained writes, other users' load) lands on every
side alike instead of on whichever was measured last.

Each repetition (a "block") runs every arm once in order and then once in
reverse order: with two arms, ours ref ref ours (A B B A). The next block
starts from the other end (B A A B), and so on. Any drift that is linear over
a block then has the same mean for every arm. Ratios are computed per pair:
arm X and arm Y from the same half of the same block, which ran next to each
other (or close), and summarised by their median and spread.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fixtures import BenchError

Sample = dict[str, Any]
"""One measurement: "value" (the number compared) plus any detail to keep."""


@dataclass(frozen=True)
class Arm:
    """One thing measured repeatedly: e.g. ours draining with 1 worker."""

    name: str
    run: Callable[[], Sample]


@dataclass
class Records:
    samples: list[Sample] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)

    def values(self, arm: str, key: str = "value") -> list[float]:
        """The arm's values of key (samples without one, or with None, left out)."""
        return [s[key] for s in self.samples if s["arm"] == arm and s.get(key) is not None]

    def pairs(self, num: str, den: str, key: str = "value") -> list[tuple[float, float]]:
        """(num, den) values measured in the same half of the same block."""
        at = {
            (s["block"], s["half"], s["arm"]): s[key]
            for s in self.samples
            if s.get(key) is not None
        }
        return [
            (value, at[(block, half, den)])
            for (block, half, arm), value in at.items()
            if arm == num and (block, half, den) in at
        ]

    def ratios(self, num: str, den: str, key: str = "value") -> list[float]:
        return [a / b for a, b in self.pairs(num, den, key) if a > 0 and b > 0]

    def differences(self, num: str, den: str, key: str = "value") -> list[float]:
        return [a - b for a, b in self.pairs(num, den, key)]


def order(names: Sequence[str], block: int) -> list[tuple[int, str]]:
    """(half, arm) in the order one block runs them: A B | B A, then B A | A B."""
    first = list(names) if block % 2 == 0 else list(reversed(names))
    return [(0, n) for n in first] + [(1, n) for n in reversed(first)]


def run_blocks(arms: Sequence[Arm], blocks: int, label: str) -> Records:
    """Run every arm twice per block in palindromic order. An arm that fails
    is recorded with its error and left out of later blocks; the rest go on."""
    by_name = {a.name: a for a in arms}
    records = Records()
    for block in range(blocks):
        _progress(f"{label}: repetition {block + 1}/{blocks}")
        for half, name in order([a.name for a in arms], block):
            if name in records.errors:
                continue
            started = time.time()
            try:
                sample = by_name[name].run()
            except (BenchError, OSError) as exc:
                records.errors[name] = f"{type(exc).__name__}: {exc}"
                continue
            position = {"block": block, "half": half, "arm": name, "started_at": started}
            records.samples.append({**position, **sample})
    return records


def _progress(text: str) -> None:
    print(f"[bench]   {text}", file=sys.stderr, flush=True)


def spread(samples: Sequence[float]) -> dict[str, Any]:
    """Median, min, max and the quartiles (IQR) of the samples."""
    if not samples:
        return {"n": 0}
    ordered = sorted(samples)
    q1, q3 = (
        statistics.quantiles(ordered, n=4, method="inclusive")[::2]
        if len(ordered) > 1
        else (ordered[0], ordered[0])
    )
    return {
        "n": len(ordered),
        "median": statistics.median(ordered),
        "min": ordered[0],
        "max": ordered[-1],
        "q1": q1,
        "q3": q3,
    }
