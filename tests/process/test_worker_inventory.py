"""A real `spoolctl work` knows what it has: with `--gpus` it finds its GPUs
(here declared by SPOOLCTL_TEST_GPUS, or through a stand-in `pynvml` on the
worker's path), registers them (workers.inventory, the devices rows), says
so, and its jobs see exactly the devices they were given (a plain job: none,
the rest hidden). Without `--gpus` nothing of NVML is loaded and the jobs'
environment is left as the worker's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from spoolctl.errors import install_command
from tests.helpers import REPO, Db, Result, add_job, child_env, job, rows

pytestmark = pytest.mark.subprocess

DECLARED = [
    {"uuid": "GPU-aaaa-1111", "index": 0, "model": "NVIDIA A100-SXM4-80GB", "memory": "80G"},
    {"uuid": "GPU-bbbb-2222", "index": 1, "model": "NVIDIA A100-SXM4-80GB", "memory": "80G"},
]
UUIDS = [d["uuid"] for d in DECLARED]
WORK = [sys.executable, "-m", "spoolctl", "work"]
SAYS = "CUDA_VISIBLE_DEVICES={c} NVIDIA_VISIBLE_DEVICES={n} SPOOLCTL_GPUS={g}"
PROBE = (
    'printf "CUDA_VISIBLE_DEVICES=%s NVIDIA_VISIBLE_DEVICES=%s SPOOLCTL_GPUS=%s" '
    '"${CUDA_VISIBLE_DEVICES-unset}" "${NVIDIA_VISIBLE_DEVICES-unset}" '
    '"${SPOOLCTL_GPUS-unset}" > "$0"'
)
"""A job that writes what it sees of its GPUs into the file named by its
first argument."""
FAKE_PYNVML = """
import os
from types import SimpleNamespace

open(os.environ["FAKE_NVML_MARK"], "a").write("imported\\n")
DEVICES = [("GPU-nvml-0000", b"NVIDIA H100 80GB HBM3", 85520809984),
           ("GPU-nvml-1111", b"NVIDIA H100 80GB HBM3", 85520809984)]

class NVMLError(Exception):
    pass

def nvmlInit():
    open(os.environ["FAKE_NVML_MARK"], "a").write("init\\n")

def nvmlShutdown():
    open(os.environ["FAKE_NVML_MARK"], "a").write("shutdown\\n")

def nvmlDeviceGetCount():
    return len(DEVICES)

def nvmlDeviceGetHandleByIndex(index):
    return index

def nvmlDeviceGetUUID(handle):
    return DEVICES[handle][0]

def nvmlDeviceGetName(handle):
    return DEVICES[handle][1]

def nvmlDeviceGetMemoryInfo(handle):
    return SimpleNamespace(total=DEVICES[handle][2], free=0, used=0)
"""


def work(db: Db, *args: str, env: dict[str, str] | None = None) -> Result:
    """`spoolctl work --drain --json` as a process, in an environment of
    its own: no CUDA_VISIBLE_DEVICES unless `env` sets one."""
    full = child_env(env)
    if env is None or "CUDA_VISIBLE_DEVICES" not in env:
        full.pop("CUDA_VISIBLE_DEVICES", None)
    proc = subprocess.run(
        [*WORK, "--db", str(db), "--drain", "--json", *args],
        capture_output=True,
        text=True,
        env=full,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def declared(devices: list[dict[str, Any]] = DECLARED, **more: str) -> dict[str, str]:
    return {"SPOOLCTL_TEST_GPUS": json.dumps(devices), **more}


def probe(db: Db, tmp_path: Path, name: str) -> tuple[int, Path]:
    seen = tmp_path / name
    return add_job(db, "sh", "-c", PROBE, str(seen)), seen


def registered(db: Db, worker_id: str) -> dict[str, Any]:
    (row,) = rows(db, "SELECT inventory FROM workers WHERE id = ?", (worker_id,))
    return dict(json.loads(row["inventory"]))


def test_a_worker_with_declared_gpus_registers_them_and_a_plain_job_sees_none(
    db: Path, tmp_path: Path
) -> None:
    job_id, seen = probe(db, tmp_path, "plain")
    result = work(db, "--gpus", "all", "--memory", "64G", "--worker-id", "w-gpus", env=declared())
    assert result.exit_code == 0, result.stderr + result.stdout
    inventory = result.data["inventory"]
    assert inventory["gpus"] == 2 and inventory["memory_bytes"] == 64 << 30
    assert [d["uuid"] for d in inventory["devices"]] == UUIDS
    assert inventory["devices"][0] == {
        "uuid": "GPU-aaaa-1111",
        "index": 0,
        "model": "NVIDIA A100-SXM4-80GB",
        "memory_bytes": 80 << 30,
    }
    kept = registered(db, "w-gpus")
    assert [d["uuid"] for d in kept["devices"]] == UUIDS
    assert kept["memory_bytes"] == 64 << 30 and kept["slots"] == 1
    devices = rows(db, "SELECT uuid, idx, model, memory_bytes, held FROM devices ORDER BY idx")
    assert [tuple(d) for d in devices] == [
        ("GPU-aaaa-1111", 0, "NVIDIA A100-SXM4-80GB", 80 << 30, 0),
        ("GPU-bbbb-2222", 1, "NVIDIA A100-SXM4-80GB", 80 << 30, 0),
    ]
    assert job(db, job_id)["state"] == "done"
    assert seen.read_text() == SAYS.format(c="", n="", g=""), "set, and naming none"


def test_gpus_names_limit_the_worker_and_cuda_visible_devices_does_too(
    db: Path, tmp_path: Path
) -> None:
    for args, env, found in (
        (["--gpus", "0"], declared(), ["GPU-aaaa-1111"]),
        (["--gpus", "GPU-bbbb"], declared(), ["GPU-bbbb-2222"]),
        (["--gpus", "all"], declared(CUDA_VISIBLE_DEVICES="GPU-bbbb-2222"), ["GPU-bbbb-2222"]),
        (["--gpus", "all"], declared(CUDA_VISIBLE_DEVICES=""), []),
        (["--gpus", "none"], declared(), []),
    ):
        worker_id = f"w-{'-'.join(found)}-{args[1]}"
        result = work(db, *args, "--worker-id", worker_id, env=env)
        assert result.exit_code == 0, result.stderr + result.stdout
        assert [d["uuid"] for d in result.data["inventory"]["devices"]] == found, args
        assert result.data["inventory"]["gpus"] == len(found)
        assert [d["uuid"] for d in registered(db, worker_id)["devices"]] == found


def test_the_worker_says_what_it_places_jobs_on(db: Path) -> None:
    env = child_env(declared())
    env.pop("CUDA_VISIBLE_DEVICES", None)
    proc = subprocess.run(
        [
            *WORK,
            "--db",
            str(db),
            "--drain",
            "--gpus",
            "all",
            "--memory",
            "1G",
            "--log-format",
            "json",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    said = [json.loads(line) for line in proc.stderr.splitlines()]
    assert [r["event"] for r in said] == ["containment", "inventory"]
    assert said[1]["gpus"] == 2 and said[1]["memory_bytes"] == 1 << 30
    assert [d["uuid"] for d in said[1]["devices"]] == UUIDS
    assert said[1]["worker_id"] == said[0]["worker_id"]
    keys = {"event", "at", "worker_id", "slots", "memory_bytes", "gpus", "devices"}
    assert set(said[1]) == keys
    monitoring = (REPO / "docs" / "monitoring.md").read_text(encoding="utf-8")
    assert all(f"| `{key}` |" in monitoring for key in keys), "each key documented"


def test_without_gpus_nvml_is_never_loaded_and_jobs_keep_the_workers_devices(
    db: Path, tmp_path: Path
) -> None:
    stand_in = tmp_path / "nvml"
    stand_in.mkdir()
    (stand_in / "pynvml.py").write_text(FAKE_PYNVML)
    mark = tmp_path / "nvml-calls"
    base = child_env()
    env = {
        "PYTHONPATH": f"{stand_in}:{base['PYTHONPATH']}",
        "FAKE_NVML_MARK": str(mark),
        "CUDA_VISIBLE_DEVICES": "7",
    }
    job_id, seen = probe(db, tmp_path, "untouched")
    result = work(db, "--worker-id", "w-plain", env=env)
    assert result.exit_code == 0, result.stderr + result.stdout
    assert "inventory" not in result.data
    assert not mark.exists(), "pynvml was imported by a worker without --gpus"
    assert registered(db, "w-plain")["devices"] == []
    assert seen.read_text() == SAYS.format(c="7", n="unset", g="unset")
    assert job(db, job_id)["state"] == "done"

    job_id, seen = probe(db, tmp_path, "through-nvml")
    result = work(
        db, "--gpus", "1", "--worker-id", "w-nvml", env={**env, "CUDA_VISIBLE_DEVICES": ""}
    )
    assert result.exit_code == 1, "CUDA_VISIBLE_DEVICES empty: the worker may use no GPU"
    assert "finds none" in result.envelope["errors"][0]["message"]
    result = work(
        db, "--gpus", "1", "--worker-id", "w-nvml", env={**env, "CUDA_VISIBLE_DEVICES": "0,1"}
    )
    assert result.exit_code == 0, result.stderr + result.stdout
    assert mark.read_text().split() == ["imported", "init", "shutdown"] * 2
    assert [d["uuid"] for d in registered(db, "w-nvml")["devices"]] == ["GPU-nvml-1111"]
    assert registered(db, "w-nvml")["devices"][0]["model"] == "NVIDIA H100 80GB HBM3"
    assert seen.read_text() == SAYS.format(c="", n="", g="")


def test_bad_gpus_a_bad_knob_and_a_missing_extra_are_errors_and_register_nothing(
    db: Path, tmp_path: Path
) -> None:
    job_id = add_job(db, "true")
    blocker = tmp_path / "hide"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text("import sys\nsys.modules['pynvml'] = None\n")
    hidden = {"PYTHONPATH": f"{blocker}:{child_env()['PYTHONPATH']}"}
    for args, env, code, words in (
        (["--gpus", "2"], declared(), "INVALID_INPUT", "'2', which is not one of"),
        (["--gpus", "0,,1"], declared(), "INVALID_INPUT", "'--gpus'"),
        (["--gpus", "all"], declared([{"uuid": "x"}]), "INVALID_INPUT", "SPOOLCTL_TEST_GPUS"),
        (["--memory", "lots"], None, "INVALID_INPUT", "'--memory'"),
        (["--gpus", "all"], hidden, "EXTRA_MISSING", install_command("gpu")),
    ):
        result = work(db, *args, env=env)
        (error,) = result.envelope["errors"]
        assert error["code"] == code and words in error["message"], (args, error)
        assert "Traceback" not in result.stderr
    assert rows(db, "SELECT id FROM workers") == []
    assert job(db, job_id)["state"] == "queued"
