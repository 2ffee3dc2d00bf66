"""doctor on a queue that real workers have worked (tests/populated.py):
every check passes. The rest of doctor, config-show and config-validate runs
in-process (tests/unit/test_doctor_and_config.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.populated import populate, run_json
from tests.unit.test_doctor_and_config import checks


@pytest.fixture(autouse=True)
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SPOOLCTL_DB", raising=False)
    return tmp_path


@pytest.mark.subprocess
def test_doctor_on_a_current_queue_passes_every_check(tmp_path: Path) -> None:
    populate(tmp_path / ".spoolctl" / "queue.db")
    result = run_json("doctor")
    assert set(checks(result.envelope).values()) == {"pass"}
    summary = result.envelope["data"]["summary"]
    assert summary == {
        "passed": len(checks(result.envelope)),
        "warnings": 0,
        "failed": 0,
        "skipped": 0,
    }
