"""`add` with a worker behind it: an idempotency key is free again once its
job is done. The rest of `add` runs in-process (tests/unit/test_add.py)."""

from __future__ import annotations

import pytest

from tests.helpers import Db, inproc
from tests.unit.test_add import Capsys, add

pytestmark = pytest.mark.both_backends


@pytest.mark.subprocess
def test_a_key_is_free_again_once_its_job_is_done(
    db: Db, capsys: Capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = add(db, capsys, "--key", "once", "--", "true")
    monkeypatch.setenv("SPOOLCTL_TEST_HEARTBEAT_INTERVAL", "0.2")
    worked = inproc("work", "--db", str(db), "--once", "--json", capsys=capsys)
    assert worked.data["job_state"] == "done"

    again = add(db, capsys, "--key", "once", "--", "true")

    assert again.data["deduplicated"] is False
    assert again.data["job_id"] != first.data["job_id"]
