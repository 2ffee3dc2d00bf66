"""The table's rows for the long drains (workers.py `_long_drains`: 5,000
`true` jobs by default, ours and the reference interleaved A B B A beside the
spawn + files ceiling over as many jobs), under each file system's drain
section: jobs/s of both sides, ours/ref per pair, each side's fraction of the
ceiling, and ours' time per job split by the workers' own timings. Checked
against the drain targets, which are set on these drains (bench/README.md,
"What each number means")."""

from __future__ import annotations

from typing import Any

from cells import Row, cell, ratio, row, verdict

LONG_LABELS = ("1 worker", "2 workers")
CEILINGS = (
    ("spawn + files per job", "ceiling: spawn + files, 1 loop"),
    ("spawn + files, 2 loops", "ceiling: spawn + files, 2 loops"),
)
TARGETS: dict[tuple[str, str], tuple[float, float | None, str]] = {
    ("tmpfs", "1 worker"): (2.0, 0.6, "and"),
    ("tmpfs", "2 workers"): (2.0, None, ""),
    ("disk", "1 worker"): (1.5, 0.8, "or"),
    ("disk", "2 workers"): (2.0, 0.8, "or"),
}
"""The drain targets, per file system and setup: (ours/ref at least, fraction of the
ceiling at least, whether both are needed or either is enough). On the disk
either will do: where the disk's own loop is the bound, a ratio to the
reference says little."""


def rows(drain: dict[str, Any]) -> list[Row]:
    """The long drains' rows of one file system's drain result (none for a
    result from before they existed)."""
    long = drain.get("long")
    if long is None:
        return []
    jobs, arms = long["jobs"], long["arms"]
    out = [row(f"-- {jobs:,} jobs each, in blocks of their own")]
    out += [row(f"ceiling: {what}, {jobs:,} jobs: /s", cell(arms[arm])) for what, arm in CEILINGS]
    for label in LONG_LABELS:
        if f"ours {label}" not in arms:
            continue
        out.append(_drain_row(drain["filesystem"]["label"], long, label))
        split = long["per_job_ms"].get(label)
        if split is not None:
            out.append(row("  ours per job, ms: wall; worker = db + spawn + rest", _split(split)))
    rss = long.get("peak_rss_mb")
    if rss is not None:
        out.append(
            row(
                f"worker peak RSS while draining {jobs:,}: MB",
                f"{rss['ours']:.1f}",
                f"{rss['ref']:.1f}",
                target="< 60 MB",
                verdict=verdict(0 < rss["ours"] < 60),
            )
        )
    return out


def _drain_row(fs_label: str, long: dict[str, Any], label: str) -> Row:
    pair = long["ratios_ours_to_ref"].get(label, {})
    fractions = [long["fraction_of_ceiling"].get(f"{impl} {label}", {}) for impl in ("ours", "ref")]
    shown = " / ".join(f"{f['median']:.2f}" if f.get("n") else "-" for f in fractions)
    return row(
        f"work --drain {long['jobs']:,} true, {label}: jobs/s",
        cell(long["arms"][f"ours {label}"]),
        cell(long["arms"].get(f"ref {label}", {})),
        ratio(pair),
        ceiling=shown,
        **_target(fs_label, label, pair, fractions[0]),
    )


def _target(fs_label: str, label: str, pair: dict[str, Any], of: dict[str, Any]) -> dict[str, str]:
    """The target for this drain and whether the medians meet it."""
    want = TARGETS.get((fs_label, label))
    if want is None or not pair.get("n"):
        return {}
    times, share, joiner = want
    text = f">= {times}x ref" + (f" {joiner} >= {share} of ceiling" if share else "")
    fast = pair["median"] >= times
    if share is None:
        return {"target": text, "verdict": verdict(fast)}
    near = bool(of.get("n")) and of["median"] >= share
    return {"target": text, "verdict": verdict(fast and near if joiner == "and" else fast or near)}


def _split(split: dict[str, Any]) -> str:
    """Medians, ms per job: the drain's wall time; then the workers' time
    (wall x workers) as database + spawn + the rest (harness.per_job_ms)."""
    m = {key: split[key]["median"] for key in ("wall", "worker", "db", "spawn", "rest")}
    return (
        f"{m['wall']:.2f}; {m['worker']:.2f} = {m['db']:.2f} + {m['spawn']:.2f} + {m['rest']:.2f}"
    )
