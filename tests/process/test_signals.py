"""Signals and children: the documented exception to the process-group kill.

The group kill itself is proven elsewhere: on timeout and for a job ignoring
SIGTERM in tests/process/test_execute.py, on `cancel --running` and on a worker's
second signal in tests/process/test_worker.py and tests/process/test_steer.py. Here: a
child that calls setsid() leaves the job's group and outlives the kill where
the worker runs without cgroups (SPOOLCTL_CGROUP=off), just as
docs/guarantees.md says, while an ordinary grandchild dies with the group.
With a cgroup per attempt the same child dies: tests/process/test_containment.py.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from spoolctl.cli.database import open_write
from spoolctl.services.job_spec import JobSpec
from spoolctl.services.submit import submit
from tests.helpers import REPO, Strays, attempts_of, cli, pid_alive, wait_for

pytestmark = [pytest.mark.timeout(60), pytest.mark.subprocess]

ESCAPER = (
    'setsid sh -c \'echo $$ > "$1/escaped"; exec sleep 60\' sh "$1" & '
    'sleep 60 & echo $! > "$1/grandchild"; '
    'while [ ! -s "$1/escaped" ]; do sleep 0.01; done; sleep 60'
)


@pytest.fixture
def strays() -> Iterator[Strays]:
    """The escaped process, which the test kills at the end."""
    found = Strays()
    yield found
    found.kill()


def failure_mode_of_timeout_guarantee() -> str:
    text = (REPO / "docs" / "guarantees.md").read_text()
    section = text.split("## Per-job timeout with process-group kill", 1)[1].split("\n## ", 1)[0]
    return section.split("**Failure mode.**", 1)[1]


def test_a_child_that_calls_setsid_escapes_the_timeout_kill_as_documented(
    db: Path, tmp_path: Path, strays: Strays
) -> None:
    """Without containment (SPOOLCTL_CGROUP=off): with it, the same child dies
    with its attempt (tests/process/test_containment.py)."""
    documented = failure_mode_of_timeout_guarantee()
    assert re.search(r"setsid\(\)", documented) and "escapes the kill" in documented
    assert "SPOOLCTL_CGROUP=off" in documented

    queue = open_write(str(db))
    spec = JobSpec(
        argv=["sh", "-c", ESCAPER, "sh", str(tmp_path)], timeout_seconds=1, max_retries=0
    )
    job_id = queue.write(lambda conn: submit(conn, spec, time.time())).job_id
    queue.engine.dispose()

    result = cli("work", "--drain", db=db, json=True, env={"SPOOLCTL_CGROUP": "off"})

    assert result.exit_code == 0, result.stdout + result.stderr
    (attempt,) = attempts_of(db, job_id)
    assert attempt["state"] == "timed_out"
    grandchild = int((tmp_path / "grandchild").read_text())
    wait_for(lambda: not pid_alive(grandchild), 5, what="the grandchild to die with its group")
    runaway = strays.keep(int((tmp_path / "escaped").read_text()))
    assert pid_alive(runaway), "the setsid() child was killed: the documentation is out of date"
    assert os.getpgid(runaway) == runaway != attempt["job_pgid"]
