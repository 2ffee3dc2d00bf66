from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import STARTED_WORKERS

pytest_plugins = ["tests.pg_fixtures"]


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A queue path in a fresh spool folder (the file does not exist yet)."""
    monkeypatch.delenv("SPOOLCTL_DB", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path / "spool" / "queue.db"


@pytest.fixture(autouse=True)
def _no_stray_workers() -> Iterator[None]:
    """Every worker a test started is gone after it, even when the test failed."""
    yield
    while STARTED_WORKERS:
        proc = STARTED_WORKERS.pop()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
