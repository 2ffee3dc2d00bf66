from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A queue path in a fresh spool folder (the file does not exist yet)."""
    monkeypatch.delenv("SPOOLCTL_DB", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path / "spool" / "queue.db"
