"""The benchmark's PostgreSQL server: started by devtools/pg_server.py, the
start the tests use too (the pgserver wheel's initdb/pg_ctl/postgres, one
superuser with a random password, scram-sha-256, 127.0.0.1 only, run as user
nobody under root), with its DURABLE profile instead of the tests' FAST one,
because a comparison of durability needs it:

- its data directory is on the disk the repository is on (a folder in
  bench/results/.scratch, the same file system the SQLite drains use), never
  in RAM;
- `fsync`, `synchronous_commit` and `full_page_writes` are on (the tests
  turn fsync off); everything else is PostgreSQL's default.

BENCH_PG_URL=postgresql://user:pw@host:port/postgres measures a server you run
instead (its user must be allowed to CREATE DATABASE); its settings are
recorded as found, its file system as unknown.

Clients (spoolctl's CLIs and workers) get no password in their URL: it is in
a passfile named by PGPASSFILE in their environment, as docs/postgresql.md
recommends.
"""

from __future__ import annotations

import os
import pwd
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import psutil
from filesystems import mount_of
from fixtures import REPO

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from devtools.pg_server import DURABLE, PgServer, server_at, start_private_server

ENV_URL = "BENCH_PG_URL"
REPORTED = (
    "server_version",
    "fsync",
    "synchronous_commit",
    "full_page_writes",
    "wal_sync_method",
    "shared_buffers",
    "max_wal_size",
    "checkpoint_timeout",
    "max_connections",
    "data_directory",
)


class BenchServer:
    """A PostgreSQL server, its facts, and how spoolctl processes reach it."""

    def __init__(self, server: PgServer, passfile: Path | None, facts: dict[str, Any]) -> None:
        self.server = server
        self.passfile = passfile
        self.facts = facts

    def create_database(self, name: str, template: str | None = None) -> str:
        """A fresh database, empty or a copy of template (a database nobody is
        connected to); returns the URL spoolctl is given (no password).
        STRATEGY FILE_COPY checkpoints before and after the copy, so every
        database starts with nothing dirty in the server's buffers."""
        if template is None:
            self.server.create_database(name)
        else:
            from psycopg import sql

            query = sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY").format(
                sql.Identifier(name), sql.Identifier(template)
            )
            with self.connect(autocommit=True) as conn:
                conn.execute(query)
        return self.client_url(name)

    def drop_database(self, name: str) -> None:
        self.server.drop_database(name)

    def client_url(self, name: str) -> str:
        s = self.server
        return f"postgresql+psycopg://{s.user}@{s.host}:{s.port}/{name}"

    def client_env(self, base: dict[str, str]) -> dict[str, str]:
        """base plus PGPASSFILE, without any other libpq setting that could steer
        it (for a BENCH_PG_URL without a password: base as it is)."""
        if self.passfile is None:
            return dict(base)
        env = {k: v for k, v in base.items() if not k.startswith("PG")}
        env["PGPASSFILE"] = str(self.passfile)
        return env

    def connect(self, name: str | None = None, **kwargs: Any) -> Any:
        return self.server.connect(name, **kwargs)

    def server_cpu_s(self) -> float:
        """CPU seconds used so far by the server: the postmaster, its reaped
        children (backends that exited) and its living children."""
        pid = self.facts.get("postmaster_pid")
        if pid is None:
            return 0.0
        try:
            master = psutil.Process(pid)
            t = master.cpu_times()
            total = t.user + t.system + t.children_user + t.children_system
            return total + sum(_cpu_of(child) for child in master.children())
        except psutil.Error:
            return 0.0

    def stop(self) -> None:
        self.server.stop()
        if self.passfile is not None:
            shutil.rmtree(self.passfile.parent, ignore_errors=True)


def _cpu_of(proc: psutil.Process) -> float:
    try:
        t = proc.cpu_times()
        return float(t.user + t.system)
    except psutil.Error:
        return 0.0


def start(scratch: Path) -> BenchServer:
    """Start the benchmark's server with its data directory under scratch (or
    use BENCH_PG_URL's); returns once it accepts connections."""
    scratch.mkdir(parents=True, exist_ok=True)
    raw = os.environ.get(ENV_URL, "").strip()
    server = server_at(raw, ENV_URL) if raw else start_private_server(scratch, DURABLE)
    passfile: Path | None = None
    try:
        if server.password:
            passfile = Path(tempfile.mkdtemp(prefix="pgpass-", dir=scratch)) / "pgpass"
            line = f"{server.host}:{server.port}:*:{server.user}:{_escape(server.password)}\n"
            with open(os.open(passfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
                f.write(line)
        facts = _facts(server)
    except BaseException:
        server.stop()
        if passfile is not None:
            shutil.rmtree(passfile.parent, ignore_errors=True)
        raise
    return BenchServer(server, passfile, facts)


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace(":", "\\:")


def _facts(server: PgServer) -> dict[str, Any]:
    """The settings that matter for the numbers, where the data lives, and on
    what file system."""
    with server.connect(autocommit=True) as conn:
        shown = {name: conn.execute(f"SHOW {name}").fetchone()[0] for name in REPORTED}
    facts: dict[str, Any] = {"settings": shown, "started_by_bench": server.owned}
    if server.owned and server.data_dir is not None:
        fstype, mount, device = mount_of(server.data_dir)
        facts["data_directory_filesystem"] = {
            "fstype": fstype,
            "mount_point": mount,
            "device": device,
            "root": str(server.data_dir),
        }
        pidfile = server.data_dir / "postmaster.pid"
        facts["postmaster_pid"] = int(pidfile.read_text().split()[0])
        facts["runs_as"] = pwd.getpwuid(server.data_dir.stat().st_uid).pw_name
    else:
        facts["data_directory_filesystem"] = {
            "fstype": "unknown (external server)",
            "mount_point": "?",
            "device": "?",
            "root": shown["data_directory"],
        }
    return facts
