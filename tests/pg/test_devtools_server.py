"""devtools/pg_server.py starts the one kind of server the tests and the
benchmark both use, with the profile each needs: FAST for the tests (fsync
off, in RAM when there is room), DURABLE for the benchmark (fsync,
synchronous_commit and full_page_writes on, data in the folder given, never
moved elsewhere). What both servers share (loopback only, passwords, not
root, stop removes the folder) is tested in tests/pg/test_server.py."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.pg_server import (
    DURABLE,
    FAST,
    SHM,
    SHM_MIN_FREE,
    PgServer,
    PgServerError,
    server_at,
    start_private_server,
)

SHOWN = ("fsync", "synchronous_commit", "full_page_writes", "data_directory")


@pytest.fixture
def base_dir() -> Iterator[Path]:
    """A folder user nobody can reach (root runs the server as nobody; pytest's
    own folders are 0700)."""
    base = Path(tempfile.mkdtemp(prefix="spoolctl-devtools-"))
    base.chmod(0o711)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def _shown(server: PgServer) -> dict[str, str]:
    with server.connect() as conn:
        return {name: str(conn.execute(f"SHOW {name}").fetchone()[0]) for name in SHOWN}


def _shm_has_room() -> bool:
    """As devtools decides: /dev/shm is a tmpfs with SHM_MIN_FREE free."""
    mounts = Path("/proc/self/mounts").read_text().splitlines()
    if not any(line.split()[1:3] == [str(SHM), "tmpfs"] for line in mounts):
        return False
    st = os.statvfs(SHM)
    return st.f_bavail * st.f_frsize >= SHM_MIN_FREE


def test_the_durable_server_waits_for_the_disk_it_was_given(base_dir: Path) -> None:
    server = start_private_server(base_dir, DURABLE)
    try:
        assert server.owned and server.root is not None and server.data_dir is not None
        assert server.data_dir.resolve().is_relative_to(base_dir.resolve())
        assert _shown(server) == {
            "fsync": "on",
            "synchronous_commit": "on",
            "full_page_writes": "on",
            "data_directory": str(server.data_dir),
        }
    finally:
        server.stop()
    assert not server.root.exists()


def test_the_fast_server_does_not_wait_and_goes_in_ram(base_dir: Path) -> None:
    server = start_private_server(base_dir, FAST)
    try:
        assert server.data_dir is not None
        shown = _shown(server)
        assert shown["fsync"] == "off"
        expected_home = SHM if _shm_has_room() else base_dir
        assert server.data_dir.resolve().is_relative_to(expected_home.resolve())
    finally:
        server.stop()


@pytest.mark.skipif(os.geteuid() != 0, reason="only under root does the server run as nobody")
def test_a_durable_server_is_not_moved_off_its_disk(tmp_path: Path) -> None:
    """Under root, a folder nobody cannot reach is refused for DURABLE (its
    numbers would be another disk's), where FAST falls back to the temp dir."""
    unreachable = tmp_path / "pg"  # under /tmp/pytest-of-root, mode 0700
    with pytest.raises(PgServerError, match="cannot reach"):
        start_private_server(unreachable, DURABLE)
    assert not unreachable.exists()


def test_a_server_at_a_url_must_be_postgresql() -> None:
    with pytest.raises(PgServerError, match=r"BENCH_PG_URL must be a postgresql:// URL"):
        server_at("sqlite:///q.db", "BENCH_PG_URL")
    server = server_at("postgresql://u:pw@127.0.0.1:5999", "SPOOLCTL_TEST_PG_URL")
    assert not server.owned
    assert server.admin_url().endswith("@127.0.0.1:5999/postgres")
