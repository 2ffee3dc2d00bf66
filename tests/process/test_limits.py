"""`add --memory SIZE --cpus N [--require-limits]` on real cgroups (the CI
machine runs as root): a memory hog is OOM-killed and recorded as such, a
cpu quota is set in the attempt's own cgroup, a worker that cannot enforce
limits runs the job without them and records it, and a job that requires
them waits for a worker that can."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.helpers import attempts_of, cli, job, rows

pytestmark = [pytest.mark.timeout(60), pytest.mark.subprocess]

OFF = {"SPOOLCTL_CGROUP": "off"}


def root_required() -> None:
    if os.geteuid() != 0:
        pytest.fail("this test runs as root (as CI does): it makes real cgroups")


def add(db: Path, *args: str) -> int:
    result = cli("add", *args, db=db, json=True)
    assert result.exit_code == 0, result.stdout + result.stderr
    return int(result.data["job_id"])


def work_once(db: Path, env: dict[str, str] | None = None) -> str:
    result = cli("work", "--once", db=db, env=env)
    assert result.exit_code == 0, result.stdout + result.stderr
    return result.stdout


def test_a_memory_hog_is_oom_killed_and_recorded(tmp_path: Path) -> None:
    root_required()
    db = tmp_path / "queue.db"
    hog = "x = bytearray(512 << 20); print(len(x))"
    job_id = add(db, "--memory", "48M", "--max-retries", "0", "--", sys.executable, "-c", hog)
    work_once(db)
    (attempt,) = attempts_of(db, job_id)
    assert attempt["state"] == "failed"
    assert attempt["failure_reason"] == "oom_killed", dict(attempt)
    assert "out of memory" in attempt["error"]
    assert 0 < attempt["peak_memory_bytes"] <= 48 << 20, "peak above the limit"
    assert job(db, job_id)["last_failure_reason"] == "oom_killed"


CPU_PROBE = """
from spoolctl.runner.containment import cgroup, hierarchy
layout = hierarchy.discover()
found = []
if "cpu" in layout.v1:
    found.append(cgroup.read(layout.v1["cpu"], "cpu.cfs_quota_us").strip())
if layout.v2:
    found.append(cgroup.read(layout.v2, "cpu.max").strip() if
                 __import__("os").path.exists(layout.v2 + "/cpu.max") else "")
print(found)
"""


def test_a_cpu_limit_is_the_quota_of_the_attempts_own_cgroup(tmp_path: Path) -> None:
    root_required()
    db = tmp_path / "queue.db"
    job_id = add(db, "--cpus", "0.5", "--", sys.executable, "-c", CPU_PROBE)
    work_once(db)
    (attempt,) = attempts_of(db, job_id)
    assert attempt["state"] == "succeeded", dict(attempt)
    seen = Path(attempt["stdout_path"]).read_text()
    assert "50000" in seen, seen  # 0.5 of a 100 ms period, v1 cfs_quota_us or v2 cpu.max


def test_a_worker_without_cgroups_runs_limited_jobs_and_says_it_could_not_limit(
    tmp_path: Path,
) -> None:
    db = tmp_path / "queue.db"
    job_id = add(db, "--memory", "64M", "--cpus", "1", "--", "true")
    work_once(db, OFF)
    assert job(db, job_id)["state"] == "done"
    (event,) = rows(db, "SELECT detail FROM job_events WHERE event = 'limits_not_enforced'")
    detail = json.loads(event["detail"])
    assert detail["not_enforced"] == ["memory", "cpus"]
    assert (detail["attempt"], detail["memory_bytes"], detail["cpus"]) == (1, 64 << 20, 1.0)


def test_a_job_that_requires_limits_waits_for_a_worker_that_can_enforce_them(
    tmp_path: Path,
) -> None:
    root_required()
    db = tmp_path / "queue.db"
    job_id = add(db, "--memory", "64M", "--require-limits", "--", "true")
    assert "nothing to run" in work_once(db, OFF)
    assert job(db, job_id)["state"] == "queued"
    status = cli("status", db=db, json=True).data
    assert status["waiting_for_limits"] == [job_id]
    assert f"job(s) {job_id}" in cli("status", db=db).stdout

    work_once(db)  # this one can: cgroups with a memory controller

    assert job(db, job_id)["state"] == "done"
    assert cli("status", db=db, json=True).data["waiting_for_limits"] == []
    assert not rows(db, "SELECT id FROM job_events WHERE event = 'limits_not_enforced'")


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--memory", "10"),
        ("--memory", "lots"),
        ("--memory", "2P"),
        ("--cpus", "0"),
        ("--cpus", "nan"),
        ("--cpus", "2000"),
    ],
)
def test_bad_limits_are_invalid_input_and_add_nothing(
    tmp_path: Path, flag: str, value: str
) -> None:
    db = tmp_path / "queue.db"
    result = cli("add", flag, value, "--", "true", db=db, json=True)
    assert result.exit_code == 1, result.stdout
    assert json.loads(result.stdout)["errors"][0]["code"] == "INVALID_INPUT"
    assert not db.exists() or not rows(db, "SELECT id FROM jobs")


def test_batch_lines_take_the_same_limits(tmp_path: Path) -> None:
    db = tmp_path / "queue.db"
    batch = tmp_path / "jobs.ndjson"
    batch.write_text(
        '{"argv": ["true"], "memory": "1.5G", "cpus": 2, "require_limits": true}\n'
        '{"argv": ["true"]}\n'
    )
    result = cli("add", "--batch", str(batch), "--cpus", "0.25", db=db, json=True)
    assert result.exit_code == 0, result.stdout
    first, second = result.data["job_ids"]
    shown = cli("show", str(first), db=db, json=True).data["job"]
    assert (shown["memory_bytes"], shown["cpus"], shown["require_limits"]) == (3 << 29, 2.0, 1)
    shown = cli("show", str(second), db=db, json=True).data["job"]
    assert (shown["memory_bytes"], shown["cpus"], shown["require_limits"]) == (None, 0.25, None)
    bad = tmp_path / "bad.ndjson"
    bad.write_text('{"argv": ["true"], "require_limits": "yes"}\n')
    refused = cli("add", "--batch", str(bad), db=db, json=True)
    assert refused.exit_code == 1 and "require_limits" in refused.stdout
