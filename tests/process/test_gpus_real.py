"""On a machine with a real NVIDIA GPU (marked `gpu`: tests/conftest.py leaves
these tests out, and says so, where `nvidia-smi -L` lists none): a worker's
`--gpus all` finds through NVML every GPU nvidia-smi lists, and a job asking
for one GPU is given exactly one, named the same way by CUDA_VISIBLE_DEVICES
(its NVML index, as nvidia-smi numbers it) and SPOOLCTL_GPUS (its UUID).
How to run them: tests/README.md."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import Db, Result, child_env, cli, job, rows

pytestmark = [pytest.mark.gpu, pytest.mark.subprocess]

LISTED = re.compile(r"^GPU (\d+): (.+) \(UUID: (GPU-[0-9a-fA-F-]+)\)$", re.MULTILINE)


def listed() -> dict[str, int]:
    """Each GPU `nvidia-smi -L` lists: its UUID -> its index."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        pytest.fail("a gpu test needs nvidia-smi (SPOOLCTL_GPU_TESTS=1 without it?)")
    proc = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    found = {uuid: int(index) for index, _, uuid in LISTED.findall(proc.stdout)}
    assert found, f"nvidia-smi -L lists no GPU: {proc.stdout!r}"
    return found


def work(db: Db, *args: str) -> Result:
    """A real worker, seeing every GPU of the machine (no CUDA_VISIBLE_DEVICES)."""
    env = child_env()
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.pop("SPOOLCTL_TEST_GPUS", None)
    proc = subprocess.run(
        [sys.executable, "-m", "spoolctl", "work", "--db", str(db), "--drain", "--json", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def test_nvml_finds_every_gpu_nvidia_smi_lists(db: Path) -> None:
    expected = listed()
    result = work(db, "--gpus", "all", "--worker-id", "w-real")
    assert result.exit_code == 0, result.stderr + result.stdout
    devices = result.data["inventory"]["devices"]
    assert {d["uuid"]: d["index"] for d in devices} == expected
    assert all(d["model"] and d["memory_bytes"] > 0 for d in devices), devices
    (row,) = rows(db, "SELECT inventory FROM workers WHERE id = ?", ("w-real",))
    assert sorted(d["uuid"] for d in json.loads(row["inventory"])["devices"]) == sorted(expected)
    stored = rows(db, "SELECT uuid FROM devices")
    assert sorted(r["uuid"] for r in stored) == sorted(expected)


def test_a_job_asking_for_one_gpu_sees_exactly_one_listed_device(db: Path, tmp_path: Path) -> None:
    expected = listed()
    seen = tmp_path / "seen"
    added = cli(
        "add",
        "--gpus",
        "1",
        "--",
        "sh",
        "-c",
        'printf "%s|%s" "$CUDA_VISIBLE_DEVICES" "$SPOOLCTL_GPUS" > "$0"',
        str(seen),
        db=db,
        json=True,
    )
    assert added.exit_code == 0, added.stdout + added.stderr
    result = work(db, "--gpus", "all")
    assert result.exit_code == 0, result.stderr + result.stdout
    assert job(db, added.data["job_id"])["state"] == "done"
    visible, uuids = seen.read_text().split("|")
    assert visible.isdigit() and "," not in uuids, (visible, uuids)
    assert uuids in expected, f"{uuids} is not a GPU nvidia-smi lists"
    assert expected[uuids] == int(visible), "CUDA_VISIBLE_DEVICES names the same device"
