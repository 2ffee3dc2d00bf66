"""A job's output files are created 0600 whatever the worker's umask: output
may hold secrets, and a umask of 000 (a container's default in places)
would otherwise leave them readable and writable by every user."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import Db, add_job, attempts_of, child_env

pytestmark = [pytest.mark.both_backends, pytest.mark.subprocess, pytest.mark.timeout(60)]


def test_a_jobs_output_files_are_0600_under_umask_000(db: Db) -> None:
    job_id = add_job(db, "sh", "-c", "echo out; echo err >&2")
    drained = subprocess.run(
        [sys.executable, "-m", "spoolctl", "work", "--db", str(db), "--drain", "--json"],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
        umask=0,
    )
    assert drained.returncode == 0, drained.stdout + drained.stderr
    (attempt,) = attempts_of(db, job_id)
    assert attempt["state"] == "succeeded"
    for name, text in (("stdout_path", "out\n"), ("stderr_path", "err\n")):
        path = Path(attempt[name])
        assert path.read_text() == text
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, f"{name}: {oct(path.stat().st_mode)}"
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
