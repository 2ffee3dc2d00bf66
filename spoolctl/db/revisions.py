"""The schema revisions this code knows: light, so that the lean path
(`db/lean.py`) checks a queue's revision by the same constant as every
engine (`db/revision.py` holds the policy)."""

from __future__ import annotations

KNOWN_REVISIONS: tuple[str, ...] = (
    "0001_initial",
    "0002_state_checks",
    "0003_lanes_and_dependencies",
    "0004_output_chunks",
    "0005_ledger_positions",
    "0006_schedules",
    "0007_containment",
    "0008_pid_space",
    "0009_steering",
    "0010_resources",
)
"""Every revision this code knows, oldest first."""
HEAD_REVISION = KNOWN_REVISIONS[-1]
