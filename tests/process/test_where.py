"""One queue per project, found like git finds its repository: real
processes started in a subfolder (cwd=) find the `.spoolctl/` above them,
through both the lean path and the click verbs; `add` that creates a queue
where nothing named one says where on stderr, and only then."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from spoolctl.db.where import find_project
from tests.helpers import child_env


def run_in(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spoolctl", *args],
        cwd=cwd,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def data(proc: subprocess.CompletedProcess[str]) -> Any:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["data"]


def test_a_subfolder_uses_the_project_queue_above_it(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    sub = project / "src" / "deep"
    sub.mkdir(parents=True)
    above = find_project(project)
    if above is not None:
        raise AssertionError(f"the .spoolctl folder in {above} would decide this test")
    first = run_in(project, "add", "--json", "--", "echo", "one")
    queue = project / ".spoolctl" / "queue.db"
    assert data(first)["job_id"] == 1
    assert first.stderr == f"spoolctl: created a new queue at {queue}\n"
    second = run_in(sub, "add", "--json", "--", "echo", "two")  # the lean path
    assert data(second)["job_id"] == 2 and second.stderr == ""
    third = run_in(sub, "add", "--json", "--tag", "k=v", "--", "echo", "three")  # click's
    assert data(third)["job_id"] == 3 and third.stderr == ""
    assert not (sub / ".spoolctl").exists() and not (project / "src" / ".spoolctl").exists()
    listed = data(run_in(sub, "list", "--json"))
    assert sorted(j["id"] for j in listed["jobs"]) == [1, 2, 3]
    shown = data(run_in(sub, "config-show", "--json"))
    assert shown["values"]["db_path"] == str(queue)
    assert shown["chosen_by"]["rule"] == "found_above"
    assert shown["chosen_by"]["folder"] == str(project)
    text = run_in(sub, "config-show")
    assert f"found above in {project}" in text.stdout


def test_a_project_config_applies_from_its_subfolders(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    sub = project / "sub"
    sub.mkdir(parents=True)
    (project / ".spoolctl").mkdir()
    config = project / ".spoolctl" / "config.json"
    config.write_text(json.dumps({"version": 1, "db_path": "named.db"}))
    added = run_in(sub, "add", "--json", "--", "true")
    assert data(added)["job_id"] == 1 and added.stderr == ""  # named: no note
    assert (project / ".spoolctl" / "named.db").exists()
    shown = data(run_in(sub, "config-show", "--json"))
    assert shown["config_path"] == str(config) and shown["chosen_by"]["rule"] == "config"
    assert data(run_in(sub, "config-validate", "--json"))["config_path"] == str(config)


def test_no_project_anywhere_makes_one_in_the_current_folder(tmp_path: Path) -> None:
    above = find_project(tmp_path)
    if above is not None:
        raise AssertionError(f"the .spoolctl folder in {above} would decide this test")
    shown = data(run_in(tmp_path, "config-show", "--json"))
    assert shown["chosen_by"]["rule"] == "new_here"
    assert shown["chosen_by"]["folder"] == str(tmp_path)
    named = run_in(tmp_path, "add", "--json", "--db", "x.db", "--", "true")
    assert data(named)["job_id"] == 1 and named.stderr == ""  # --db named it: no note
    assert not (tmp_path / ".spoolctl").exists()


def test_an_unknown_config_key_is_a_warning_of_every_verb_that_reads_it(
    tmp_path: Path,
) -> None:
    """`config-validate` refuses the file (INVALID_INPUT); every other verb
    answers as without the key (0.4.11's exit codes), with the warning
    CONFIG_UNKNOWN_KEY: the lean path and the click verbs alike."""
    project = tmp_path / "proj"
    sub = project / "sub"
    sub.mkdir(parents=True)
    (project / ".spoolctl").mkdir()
    config = project / ".spoolctl" / "config.json"
    config.write_text(json.dumps({"version": 1, "db_pth": "typo.db"}))
    for args in (
        ["add", "--json", "--", "true"],  # creates the queue: the click verb
        ["add", "--json", "--", "true"],  # the lean path
        ["add", "--json", "--tag", "k=v", "--", "true"],  # the click verb
        ["status", "--json"],  # the lean path
        ["list", "--json", "--tag", "k=v"],  # the click verb
        ["workers", "--json"],
        ["config-show", "--json"],
    ):
        proc = run_in(sub, *args)
        assert proc.returncode == 0, (args, proc.stderr)
        warnings = json.loads(proc.stdout)["warnings"]
        assert [w["code"] for w in warnings] == ["CONFIG_UNKNOWN_KEY"], (args, warnings)
        assert str(config) in warnings[0]["message"] and "db_pth" in warnings[0]["message"]
    text = run_in(sub, "status")
    assert text.returncode == 0
    assert f"spoolctl: warning: CONFIG_UNKNOWN_KEY: {config}" in text.stderr
    refused = run_in(sub, "config-validate", "--json")
    assert refused.returncode == 1
    assert json.loads(refused.stdout)["errors"][0]["code"] == "INVALID_INPUT"
    assert not (project / ".spoolctl" / "typo.db").exists()


def test_a_deleted_current_folder_is_a_structured_error(tmp_path: Path) -> None:
    """A shell still in a folder that was deleted: every verb answers
    INVALID_INPUT (no project can be searched for from it), never INTERNAL,
    and no queue is made anywhere."""
    gone = str(tmp_path / "gone")
    script = (
        "import os, sys, subprocess\n"
        f"os.mkdir({gone!r}); os.chdir({gone!r}); os.rmdir({gone!r})\n"
        f"python = {os.path.abspath(sys.executable)!r}\n"
        "sys.exit(subprocess.run([python, '-m', 'spoolctl', *sys.argv[1:]]).returncode)\n"
    )
    env = child_env()  # Python itself cannot start with "" (the folder) on its path
    env["PYTHONPATH"] = os.pathsep.join(p for p in env["PYTHONPATH"].split(os.pathsep) if p)
    for verb in (["add", "--json", "--", "true"], ["status", "--json"], ["list", "--json"]):
        proc = subprocess.run(
            [sys.executable, "-c", script, *verb],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert proc.stdout, proc.stderr
        error = json.loads(proc.stdout)["errors"][0]
        assert error["code"] == "INVALID_INPUT" and "no longer exists" in error["message"]
    assert list(tmp_path.iterdir()) == []
