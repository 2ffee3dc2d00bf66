"""The input of a job's request, `add --weight`, `--gpus`, `--gpu-memory` and
`--gpu-model` (docs/verbs.md), in-process: every way in (`add`'s flags, the
lean path, `add --batch` lines, `schedule add`, the config file's
`defaults` table) stores the same columns, `show` and `list` give the
request back, and every malformed value is INVALID_INPUT naming its flag
with the queue unchanged. Placing the jobs is tests/unit/test_placement.py's."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from spoolctl import resources
from spoolctl.cli import lean
from spoolctl.errors import InvalidInput
from spoolctl.services import job_spec
from spoolctl.services.job_spec import JobSpec
from spoolctl.services.schedules import job_of
from tests.helpers import Db, Result, execute, has_queue, inproc, rows

Capsys = pytest.CaptureFixture[str]
NEW_KEYS = ("weight", "gpus", "gpu_memory_bytes", "gpu_model")
COLUMNS = "weight, gpus, gpu_share, gpu_memory_bytes, gpu_model"


def add(db: Db, capsys: Capsys, *args: str) -> Result:
    return inproc("add", "--db", str(db), "--json", *args, capsys=capsys)


def job_count(db: Db) -> int:
    return 0 if not has_queue(db) else int(rows(db, "SELECT count(*) FROM jobs")[0][0])


def request(db: Db, job_id: int) -> tuple[Any, ...]:
    return tuple(rows(db, f"SELECT {COLUMNS} FROM jobs WHERE id = ?", (job_id,))[0])


def refused(result: Result) -> dict[str, Any]:
    """The error, once checked to be INVALID_INPUT (exit 1)."""
    assert result.exit_code == 1, result.stdout
    (error,) = result.envelope["errors"]
    assert error["code"] == "INVALID_INPUT", error
    return dict(error)


def config(tmp_path: Path, defaults: Any) -> None:
    path = tmp_path / ".spoolctl" / "config.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({"version": 1, "defaults": defaults}))


def test_the_weight_bound_is_the_placement_s() -> None:
    assert job_spec.MAX_WEIGHT == resources.MAX_WEIGHT


@pytest.mark.parametrize(
    ("args", "stored"),
    [
        (("--gpus", "2"), (None, 2, None, None, None)),
        (("--gpus", "0.5"), (None, 1, 2, None, None)),
        (("--gpus", "1/3"), (None, 1, 3, None, None)),
        (("--gpus", "0"), (None, None, None, None, None)),
        (("--gpus", "0", "--gpu-model", "A100"), (None, None, None, None, None)),
        (("--weight", "1"), (None, None, None, None, None)),
        (("--weight", "4"), (4, None, None, None, None)),
        (("--gpu-model", "A100"), (None, 1, None, None, "A100")),
        (("--gpu-memory", "40G", "--gpus", "1/4"), (None, 1, 4, 40 << 30, None)),
    ],
)
def test_the_flags_store_their_columns_on_both_paths(
    db: Db, capsys: Capsys, args: tuple[str, ...], stored: tuple[Any, ...]
) -> None:
    full = add(db, capsys, *args, "--", "true")
    assert full.exit_code == 0, full.stdout
    assert lean.answer(["add", "--db", str(db), "-q", *args, "--", "true"]) == 0, "lean path"
    capsys.readouterr()
    assert request(db, 1) == request(db, 2) == stored


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (("--gpus", "-1"), "--gpus"),
        (("--gpus=-1",), "--gpus"),
        (("--gpus", "0.3"), "--gpus"),
        (("--gpus", "1/17"), "--gpus"),
        (("--gpus", "1.5"), "--gpus"),
        (("--gpus", "65"), "--gpus"),
        (("--gpus", "lots"), "--gpus"),
        (("--weight", "0"), "--weight"),
        (("--weight", "100000"), "--weight"),
        (("--gpu-memory", "40X"), "--gpu-memory"),
        (("--gpu-memory", "1K"), "--gpu-memory"),
        (("--gpu-model", ""), "--gpu-model"),
        (("--gpu-model", "x" * 201), "--gpu-model"),
    ],
)
def test_a_malformed_request_is_refused_naming_its_flag(
    db: Db, capsys: Capsys, args: tuple[str, ...], flag: str
) -> None:
    assert flag in refused(add(db, capsys, *args, "--", "true"))["message"]
    assert lean.answer(["add", "--db", str(db), *args, "--", "true"]) is None
    assert job_count(db) == 0


def test_show_and_list_give_the_request(db: Db, capsys: Capsys) -> None:
    add(db, capsys, "--", "true")
    request_flags = ("--gpus", "2", "--gpu-model", "A100", "--gpu-memory", "40G", "--weight", "2")
    add(db, capsys, *request_flags, "--", "true")
    add(db, capsys, "--gpus", "1/2", "--", "true")
    shown = inproc("show", "--db", str(db), "2", "--json", capsys=capsys).data["job"]
    assert (shown["weight"], shown["gpus"], shown["gpu_memory_bytes"], shown["gpu_model"]) == (
        2,
        "2",
        40 << 30,
        "A100",
    )
    text = inproc("show", "--db", str(db), "2", capsys=capsys).stdout
    assert "needs     2 GPUs (model A100, 40G memory), weight 2" in text
    assert "needs" not in inproc("show", "--db", str(db), "1", capsys=capsys).stdout
    listed = inproc("list", "--db", str(db), "--json", capsys=capsys).data["jobs"]
    assert [(j["id"], j["weight"], j["gpus"]) for j in listed] == [
        (3, 1, "0.5"),
        (2, 2, "2"),
        (1, 1, None),
    ]
    table = inproc("list", "--db", str(db), "--wide", capsys=capsys).stdout.splitlines()
    assert "NEEDS" in table[0]
    assert "2 GPU w2" in table[2] and "0.5 GPU" in table[1]


def test_list_without_requests_keeps_its_columns(db: Db, capsys: Capsys) -> None:
    add(db, capsys, "--memory", "1G", "--", "true")
    heading = inproc("list", "--db", str(db), capsys=capsys).stdout.splitlines()[0]
    assert heading.split() == [
        "ID",
        "STATE",
        "QUEUE",
        "PRI",
        "ATTEMPTS",
        "FAILURES",
        "CREATED",
        "COMMAND",
    ]


def test_the_defaults_table_sets_them(db: Db, capsys: Capsys, tmp_path: Path) -> None:
    config(tmp_path, {"gpus": 0.5, "weight": 2, "gpu_model": "H100"})
    result = add(db, capsys, "--", "true")
    assert result.exit_code == 0, result.stdout
    assert request(db, 1) == (2, 1, 2, None, "H100")
    none = add(db, capsys, "--gpus", "0", "--", "true")
    assert request(db, none.data["job_id"]) == (2, None, None, None, None)
    config(tmp_path, {"gpus": "1/17"})
    error = refused(add(db, capsys, "--", "true"))
    assert "defaults.gpus" in error["message"] and "--gpus" in error["message"]
    config(tmp_path, {"weight": 0})
    assert "defaults.weight" in refused(add(db, capsys, "--", "true"))["message"]
    assert job_count(db) == 2


def test_batch_lines_read_them_and_a_bad_line_adds_nothing(
    db: Db, capsys: Capsys, tmp_path: Path
) -> None:
    batch = tmp_path / "jobs.ndjson"
    lines = [
        {"argv": ["true"], "gpus": 0.25, "gpu_memory": "16G"},
        {"argv": ["true"], "gpus": "2", "weight": 3, "gpu_model": "A100"},
        {"argv": ["true"], "gpu_model": "L4"},
        {"argv": ["true"], "gpus": "0.3"},
    ]
    batch.write_text("".join(f"{json.dumps(line)}\n" for line in lines))
    error = refused(add(db, capsys, "--batch", str(batch)))
    assert error["message"].startswith("batch line 4:") and "--gpus" in error["message"]
    assert job_count(db) == 0
    batch.write_text("".join(f"{json.dumps(line)}\n" for line in lines[:3]))
    result = add(db, capsys, "--batch", str(batch), "--weight", "2")
    assert result.exit_code == 0, result.stdout
    assert [request(db, n) for n in (1, 2, 3)] == [
        (2, 1, 4, 16 << 30, None),
        (3, 2, None, None, "A100"),
        (2, 1, None, None, "L4"),
    ]


def test_schedule_add_keeps_them_and_its_occurrences_carry_them(db: Db, capsys: Capsys) -> None:
    base = ("schedule", "add", "nightly", "--db", str(db), "--json", "--every", "1h")
    refused(inproc(*base, "--gpus", "1/17", "--", "true", capsys=capsys))
    good = inproc(*base, "--gpus", "0.5", "--weight", "2", "--", "true", capsys=capsys)
    assert good.exit_code == 0, good.stdout
    job = good.data["job"]
    assert (job["gpus"], job["weight"], job["gpu_model"]) == ("0.5", 2, None)
    fired = inproc("schedule", "run", "nightly", "--db", str(db), "--json", capsys=capsys)
    assert fired.exit_code == 0, fired.stdout
    assert request(db, 1) == (2, 1, 2, None, None)


def test_a_schedule_stored_before_these_flags_still_fires(db: Db, capsys: Capsys) -> None:
    """A schedule's job kept by a release without the request's flags lacks
    their keys: it is not taken for damaged, and its occurrences ask for
    nothing."""
    kept = JobSpec(["true"]).scheduled()
    older = {k: v for k, v in kept.items() if k not in NEW_KEYS}
    assert job_of(SimpleNamespace(job=json.dumps(older), name="old")) == JobSpec(["true"])
    assert "gpu_share" not in kept, "kept once, as --gpus"
    base = ("schedule", "add", "old", "--db", str(db), "--json", "--every", "1h")
    assert inproc(*base, "--", "true", capsys=capsys).exit_code == 0
    execute(db, "UPDATE schedules SET job = ? WHERE name = ?", (json.dumps(older), "old"))
    fired = inproc("schedule", "run", "old", "--db", str(db), "--json", capsys=capsys)
    assert fired.exit_code == 0, fired.stdout
    assert request(db, 1) == (None, None, None, None, None)
    with pytest.raises(InvalidInput):
        job_of(SimpleNamespace(job=json.dumps({**older, "gpu_share": 2}), name="old"))
