"""The tests' PostgreSQL server: devtools/pg_server.py's FAST profile (fsync
off, its folder in RAM when there is room), or the server of
SPOOLCTL_TEST_PG_URL (one you run, whose user may CREATE DATABASE) when that
is set, so that no server is started.

The server start itself lives in devtools/pg_server.py, which the benchmark
uses too (with its DURABLE profile); this module only chooses for the tests
and re-exports what they use, so their imports stay as they were. A test
that needs servers it may crash or promote (tests/pg/test_replica.py)
starts its own with start_private_server and start_replica.
"""

from __future__ import annotations

import os
from pathlib import Path

from devtools.pg_server import (
    FAST,
    SETUP_HINT,
    PgServer,
    PgServerError,
    libpq_url,
    pg_bin_dir,
    reap_orphans,
    server_at,
    start_private_server,
    start_replica,
)

__all__ = [
    "ENV_URL",
    "FAST",
    "SETUP_HINT",
    "PgServer",
    "PgServerError",
    "libpq_url",
    "pg_bin_dir",
    "reap_orphans",
    "server_from_env",
    "start_private_server",
    "start_replica",
    "start_server",
]

ENV_URL = "SPOOLCTL_TEST_PG_URL"


def server_from_env() -> PgServer | None:
    """The server of SPOOLCTL_TEST_PG_URL, or None if it is not set."""
    raw = os.environ.get(ENV_URL, "").strip()
    return server_at(raw, ENV_URL) if raw else None


def start_server(base_dir: Path) -> PgServer:
    """SPOOLCTL_TEST_PG_URL's server if it is set, else a private one with the
    FAST profile (its folder in /dev/shm when that has room, else in
    base_dir). Returns once the server accepts connections; call .stop() when
    done."""
    from_env = server_from_env()
    if from_env is not None:
        return from_env
    return start_private_server(base_dir, FAST)
