"""The fork server's children run spoolctl as `python -m spoolctl` does: the
same exit codes, output, environment and working directory as an exec'd
process, their own pids, and a timeout that kills them."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests import forkserver
from tests.helpers import child_env

pytestmark = pytest.mark.subprocess


def both(args: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], ...]:
    forked = forkserver.run(args, env, timeout=60, base_env=child_env())
    execd = forkserver._exec(args, env, timeout=60)
    return forked, execd


@pytest.mark.parametrize(
    "args",
    [
        ["--version"],
        ["status", "--json"],  # the queue named by SPOOLCTL_DB below
        ["show", "999", "--json"],  # exit 1, NOT_FOUND
        ["no-such-verb"],  # exit 2, on stderr
        ["add", "--json", "--", "sh", "-c", "exit 3"],
    ],
)
def test_a_forked_run_answers_as_an_execd_one(
    args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    env = child_env({"SPOOLCTL_DB": str(tmp_path / "q.db")})
    forked, execd = both(args, env)
    assert forked.returncode == execd.returncode, (forked, execd)
    assert _shape(forked.stdout) == _shape(execd.stdout)
    assert forked.stderr == execd.stderr


def _shape(text: str) -> object:
    """The envelope without what differs per run (meta: ids, times, hashes of
    data holding times); plain text as it is."""
    try:
        envelope = json.loads(text)
    except ValueError:
        return text
    envelope.pop("meta")
    data = envelope.get("data")
    if isinstance(data, dict):
        envelope["data"] = {
            k: v for k, v in data.items() if k not in ("job_id", "created_at", "next_run_at")
        }
    return envelope


def test_a_forked_run_sees_its_own_cwd_and_environment(tmp_path: Path) -> None:
    here = tmp_path / "here"
    here.mkdir()
    env = child_env({"SPOOLCTL_DB": "relative.db"})
    cwd = os.getcwd()
    os.chdir(here)
    try:
        forked = forkserver.run(["add", "--json", "--", "true"], env, 60, child_env())
    finally:
        os.chdir(cwd)
    assert forked.returncode == 0, forked.stderr
    assert (here / "relative.db").exists()


def test_a_run_past_its_timeout_is_killed(tmp_path: Path) -> None:
    env = child_env({"SPOOLCTL_DB": str(tmp_path / "q.db")})
    added = forkserver.run(["add", "--json", "--", "true"], env, 60, child_env())
    assert added.returncode == 0, added.stderr
    with pytest.raises(subprocess.TimeoutExpired):  # no worker: it would wait 30 s
        forkserver.run(["wait", "1", "--timeout", "30"], env, 1.0, child_env())
