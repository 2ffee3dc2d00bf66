"""A job's request through the real CLI (docs/verbs.md): `add --gpus 0.5
--weight 2` is stored and read back by `show` and `list` as it was asked
for, and a malformed request is INVALID_INPUT naming its flag with nothing
written. The input's every way in is tests/unit/test_job_request.py's."""

from __future__ import annotations

import pytest

from tests.helpers import Db, cli, cli_json, has_queue, rows

pytestmark = [pytest.mark.both_backends, pytest.mark.subprocess]


def test_a_request_is_stored_and_shown_as_asked(db: Db) -> None:
    added = cli_json(
        "add", "--gpus", "0.5", "--weight", "2", "--gpu-model", "A100", "--", "true", db=db
    )
    assert added.exit_code == 0, added.stderr
    job_id = added.data["job_id"]
    shown = cli_json("show", str(job_id), db=db).data["job"]
    assert (shown["gpus"], shown["weight"], shown["gpu_model"], shown["gpu_memory_bytes"]) == (
        "0.5",
        2,
        "A100",
        None,
    )
    stored = rows(db, "SELECT gpus, gpu_share, weight FROM jobs WHERE id = ?", (job_id,))
    assert tuple(stored[0]) == (1, 2, 2)
    (listed,) = cli_json("list", db=db).data["jobs"]
    assert (listed["gpus"], listed["weight"]) == ("0.5", 2)
    text = cli("show", str(job_id), db=db).stdout
    assert "needs     0.5 of a GPU (model A100), weight 2" in text


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--gpus", "-1"), ("--gpus", "0.3"), ("--gpus", "1/17"), ("--weight", "0")],
)
def test_a_malformed_request_writes_nothing(db: Db, flag: str, value: str) -> None:
    refused = cli_json("add", flag, value, "--", "true", db=db)
    assert refused.exit_code == 1, refused.stdout
    (error,) = refused.envelope["errors"]
    assert error["code"] == "INVALID_INPUT" and flag in error["message"], error
    assert not has_queue(db) or rows(db, "SELECT count(*) FROM jobs")[0][0] == 0
