"""Where the queue is when nothing names it: the nearest `.spoolctl/` in the
current folder or above it, as git finds its repository (db/where.py). The
mount-point rule is tested on a fake `stat`; the upward search on real
folders (and, in tests/process/test_where.py, real processes)."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from spoolctl.db.where import find_project, named_db, project_config
from spoolctl.errors import InvalidInput


@pytest.fixture(autouse=True)
def no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPOOLCTL_DB", raising=False)


def _fake_stat(folders: dict[str, int]) -> Callable[[str], os.stat_result]:
    """A stat over a made-up tree: {folder: device}; `.spoolctl` entries are
    folders on their parent's device."""

    def fake(path: str) -> os.stat_result:
        text = str(path)
        if text not in folders:
            raise FileNotFoundError(text)
        return os.stat_result((stat.S_IFDIR | 0o755, 0, folders[text], 0, 0, 0, 0, 0, 0, 0))

    return fake


def test_a_mount_point_stops_the_search() -> None:
    """/mnt/disk is another file system: its parent's `.spoolctl` is never
    looked in, although it exists (the mount point itself still is)."""
    tree = {"/": 1, "/mnt": 1, "/mnt/.spoolctl": 1, "/mnt/disk": 2, "/mnt/disk/work": 2}
    fake = _fake_stat(tree)
    assert find_project(Path("/mnt/disk/work"), stat=fake) is None
    tree["/mnt/disk/.spoolctl"] = 2
    fake = _fake_stat(tree)
    assert find_project(Path("/mnt/disk/work"), stat=fake) == Path("/mnt/disk")


def test_the_search_climbs_a_file_system_up_to_its_root() -> None:
    tree = {"/": 1, "/.spoolctl": 1, "/a": 1, "/a/b": 1, "/a/b/c": 1}
    fake = _fake_stat(tree)
    assert find_project(Path("/a/b/c"), stat=fake) == Path("/")
    del tree["/.spoolctl"]
    fake = _fake_stat(tree)
    assert find_project(Path("/a/b/c"), stat=fake) is None


def test_the_nearest_spoolctl_folder_wins_and_a_file_of_that_name_is_no_project(
    tmp_path: Path,
) -> None:
    (tmp_path / ".spoolctl").mkdir()
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    assert find_project(deep) == tmp_path
    (tmp_path / "a" / ".spoolctl").write_text("not a folder")
    assert find_project(deep) == tmp_path
    (tmp_path / "a" / "b" / ".spoolctl").mkdir()
    assert find_project(deep) == deep


def test_the_rules_in_their_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """found above, found here, a config's db_path (relative to its folder),
    SPOOLCTL_DB and --db (relative to the current folder, not the project)."""
    project = tmp_path / "proj"
    sub = project / "src" / "deep"
    sub.mkdir(parents=True)
    bare = tmp_path / "bare"
    bare.mkdir()
    if find_project(bare) is not None:
        raise AssertionError(f"a .spoolctl folder above {bare} would decide these tests")
    fresh = named_db(None, bare)
    assert (fresh.rule, fresh.project, fresh.plain_file()) == (
        "new_here",
        None,
        bare / ".spoolctl" / "queue.db",
    )
    (project / ".spoolctl").mkdir()
    above = named_db(None, sub)
    assert (above.rule, above.source, above.project) == ("found_above", "default", project)
    assert above.plain_file() == project / ".spoolctl" / "queue.db"
    here = named_db(None, project)
    assert (here.rule, here.project) == ("found_here", project)
    (project / ".spoolctl" / "config.json").write_text(json.dumps({"db_path": "other.db"}))
    configured = named_db(None, sub)
    assert (configured.rule, configured.source) == ("config", "config")
    assert configured.plain_file() == project / ".spoolctl" / "other.db"
    assert project_config(sub).path == project / ".spoolctl" / "config.json"
    flagged = named_db("mine.db", sub)
    assert (flagged.rule, flagged.plain_file()) == ("flag", sub / "mine.db")
    monkeypatch.setenv("SPOOLCTL_DB", "env.db")
    from_env = named_db(None, sub)
    assert (from_env.rule, from_env.plain_file()) == ("env", sub / "env.db")


def test_an_invalid_config_found_above_is_refused_from_a_subfolder(tmp_path: Path) -> None:
    (tmp_path / ".spoolctl").mkdir()
    (tmp_path / ".spoolctl" / "config.json").write_text("{nope")
    sub = tmp_path / "sub"
    sub.mkdir()
    with pytest.raises(InvalidInput, match="is invalid"):
        named_db(None, sub)


def test_a_ceiling_folder_is_never_climbed_into(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPOOLCTL_CEILING_DIRECTORIES, as GIT_CEILING_DIRECTORIES: the search
    looks in a folder below the ceiling, never in the ceiling or above it
    (a relative entry is ignored)."""
    (tmp_path / ".spoolctl").mkdir()
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    monkeypatch.setenv("SPOOLCTL_CEILING_DIRECTORIES", f"relative:{tmp_path}")
    assert find_project(deep) is None
    assert find_project(tmp_path) == tmp_path  # the start is looked in
    monkeypatch.setenv("SPOOLCTL_CEILING_DIRECTORIES", f"{tmp_path.parent}:relative")
    assert find_project(deep) == tmp_path
