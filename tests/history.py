"""A history checker for chaos runs, in the manner of Jepsen and Elle: the
jobs themselves keep an external, append-only record of every execution, and
a checker that never asks the queue judges it.

The record. Every job is `bash -c JOB history-job FOLDER KEY NAP`: KEY is
unique to one submitted job and reaches it on its command line. The job
appends one line per step to FOLDER/record (`>>`: O_APPEND, one write(2)
each, so the file's order is the order in which the lines were written):

    start KEY ATTEMPT TOKEN PID NS     (it began)
    end   KEY ATTEMPT TOKEN PID NS     (it ran to its end)
    overlap KEY ATTEMPT TOKEN PID NS   (another copy of KEY held the lock)

ATTEMPT and TOKEN are SPOOLCTL_ATTEMPT and SPOOLCTL_ATTEMPT_TOKEN from the
job's environment (spoolctl/runner/supervise.py), PID the shell's, NS the
wall clock in nanoseconds (bash's EPOCHREALTIME; a time namespace does not
shift it, but nothing here depends on it).

A copy killed mid-run (its worker SIGKILLed, fenced, or fencing itself)
writes no `end`, so "two copies at once" is not read from the stamps: for
its whole run a job holds an exclusive `flock` on FOLDER/locks/KEY, taken
with LOCK_NB, and writes `overlap` when it cannot take it. The lock is
inherited by every process of the copy and dropped by the kernel when the
last of them is gone, which is exactly when a crashed copy is "gone" (what
the reaper must confirm before the job runs again: docs/guarantees.md).
The record's order gives a second, weaker witness: a start of KEY written
between another copy's start and its end.

The checker reads only the record and `Submissions`, what the test learnt
from `add`'s JSON replies; at the very end a test may ask `list --json` which
jobs are dead, and a dead job counts as accounted for only with a recorded
start or a reason the docs give for a job that never started.
"""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

RECORD = "record"
LOCKS = "locks"
KINDS = ("start", "end", "overlap")
ENV_REPORT = "SPOOLCTL_HISTORY_REPORT"
"""A file the figures of every run are appended to (one JSON object a line)."""

JOB = r"""
folder="$1"; key="$2"; nap="$3"
exec 9>>"$folder/locks/$key"
me="$key ${SPOOLCTL_ATTEMPT:--} ${SPOOLCTL_ATTEMPT_TOKEN:--} $$"
if ! flock -n 9; then echo "overlap $me ${EPOCHREALTIME/[.,]/}000" >> "$folder/record"; fi
echo "start $me ${EPOCHREALTIME/[.,]/}000" >> "$folder/record"
echo "ran $key"
sleep "$nap"
echo "end $me ${EPOCHREALTIME/[.,]/}000" >> "$folder/record"
"""
KEY_ARG = 5
"""Where the key is in a job's argv (`job_argv`)."""

NEVER_STARTED_REASONS = ("spawn", "damaged row")
"""Why a dead job may have no recorded start (docs/guarantees.md: a spawn
failure spends the retry budget; a damaged row is quarantined unrun)."""


def prepare(folder: Path) -> Path:
    """Make a record folder; returns it."""
    (folder / LOCKS).mkdir(parents=True)
    (folder / RECORD).touch()
    return folder


def job_argv(folder: Path, key: str, nap_s: float) -> list[str]:
    """The command of the job whose key is `key`: records, naps, records."""
    return ["bash", "-c", JOB, "history-job", str(folder), key, f"{nap_s:.2f}"]


def key_of(argv: list[str]) -> str | None:
    """The key in a job's argv (as `list --json` shows it), if it is one of ours."""
    if len(argv) > KEY_ARG and argv[:4] == ["bash", "-c", JOB, "history-job"]:
        return argv[KEY_ARG]
    return None


@dataclass(frozen=True)
class Line:
    kind: str
    key: str
    attempt: str
    token: str
    pid: int
    position: int
    """Its place in the record (the order it was written in)."""

    @property
    def copy(self) -> tuple[str, str, int]:
        """Names one execution: the key, the attempt's token, the shell's pid."""
        return (self.key, self.token, self.pid)


def read_record(path: Path) -> tuple[list[Line], list[str]]:
    """The record's lines, and those that are not lines of the record."""
    lines: list[Line] = []
    malformed: list[str] = []
    for position, text in enumerate(path.read_text(errors="replace").splitlines()):
        words = text.split()
        if len(words) != 6 or words[0] not in KINDS or not words[4].isdigit():
            malformed.append(text)
            continue
        kind, key, attempt, token, pid, _ns = words
        lines.append(Line(kind, key, attempt, token, int(pid), position))
    return lines, malformed


@dataclass
class Submissions:
    """What the test learnt from `add`: every key it tried, and how each try
    ended. Only an `ok` reply with a job id acknowledges a job."""

    tried: list[str] = field(default_factory=list)
    acked: dict[str, int] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    """key -> error code: the reply said the job was not added."""
    unanswered: list[str] = field(default_factory=list)
    """No reply could be read (it may or may not have been added)."""


@dataclass
class Faults:
    """The faults a run injected, by kind, and the kinds it could not inject."""

    injected: Counter[str] = field(default_factory=Counter)
    not_injected: dict[str, str] = field(default_factory=dict)
    observed: Counter[str] = field(default_factory=Counter)
    """What the run saw happen without causing it (a worker fenced by another)."""
    log: list[dict[str, Any]] = field(default_factory=list)
    """Each fault as it was injected (for a post-mortem; not in the figures)."""


@dataclass(frozen=True)
class Figures:
    jobs: int
    """Keys submitted (acknowledged or not)."""
    acknowledged: int
    executions: int
    """Recorded starts."""
    completed: int
    """Recorded ends."""
    duplicates: int
    """Executions beyond each key's first (at-least-once allows them after a crash)."""
    completed_twice: int
    """Keys that ran to their end more than once."""
    overlaps: int
    lost: int
    dead: int
    unacknowledged_run: int
    """Keys that ran although no reply acknowledged them (an ambiguous add)."""
    phantoms: int
    """Keys in the record that were never submitted."""
    malformed: int
    faults: dict[str, int]
    not_injected: dict[str, str]
    observed: dict[str, int]
    lost_keys: list[str]
    overlap_keys: list[str]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def overlapping_copies(lines: list[Line]) -> set[str]:
    """Keys with two copies at once: one found the lock held, or one started
    after another copy's start and before that copy's end (by record order)."""
    found = {line.key for line in lines if line.kind == "overlap"}
    began: dict[tuple[str, str, int], int] = {}
    ended: dict[tuple[str, str, int], int] = {}
    for line in lines:
        if line.kind == "start":
            began.setdefault(line.copy, line.position)
        elif line.kind == "end":
            ended.setdefault(line.copy, line.position)
    starts: dict[str, list[int]] = defaultdict(list)
    for (key, _, _), position in began.items():
        starts[key].append(position)
    for copy, end in ended.items():
        start = began.get(copy, -1)
        if any(start < other < end for other in starts[copy[0]]):
            found.add(copy[0])
    return found


def check(
    record: Path,
    submitted: Submissions,
    dead: Mapping[str, str],
    faults: Faults,
) -> Figures:
    """Judge a run from its record and what `add` answered. `dead`: the keys
    of jobs that ended dead (key -> their last error), from the run's end."""
    lines, malformed = read_record(record)
    starts = Counter(line.key for line in lines if line.kind == "start")
    ends = Counter(line.key for line in lines if line.kind == "end")
    tried = set(submitted.tried)
    overlapping = overlapping_copies(lines)

    def accounted(key: str) -> bool:
        if ends[key]:
            return True
        if key not in dead:
            return False
        return starts[key] > 0 or any(why in dead[key] for why in NEVER_STARTED_REASONS)

    lost = sorted(key for key in submitted.acked if not accounted(key))
    recorded = set(starts) | set(ends)
    return Figures(
        jobs=len(tried),
        acknowledged=len(submitted.acked),
        executions=sum(starts.values()),
        completed=sum(ends.values()),
        duplicates=sum(n - 1 for n in starts.values()),
        completed_twice=sum(1 for n in ends.values() if n > 1),
        overlaps=len(overlapping),
        lost=len(lost),
        dead=len(dead),
        unacknowledged_run=len(recorded & tried - set(submitted.acked)),
        phantoms=len(recorded - tried),
        malformed=len(malformed),
        faults=dict(sorted(faults.injected.items())),
        not_injected=dict(sorted(faults.not_injected.items())),
        observed=dict(sorted(faults.observed.items())),
        lost_keys=lost[:20],
        overlap_keys=sorted(overlapping)[:20],
    )


def publish(name: str, figures: Figures, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The run's figures as one JSON object, appended to SPOOLCTL_HISTORY_REPORT
    when it is set (so they can be quoted), and returned."""
    entry = {"run": name, **figures.as_dict(), **(extra or {})}
    target = os.environ.get(ENV_REPORT)
    if target:
        with open(target, "a") as out:
            out.write(json.dumps(entry, sort_keys=True) + "\n")
    return entry
