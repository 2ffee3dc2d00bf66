"""A PostgreSQL server for the benchmark, started the way the tests start
theirs (tests/pg_server.py: the pgserver wheel's initdb/pg_ctl/postgres, one
superuser with a random password, scram-sha-256, 127.0.0.1 only, run as
user nobody under root), but with what a comparison of durability needs:

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
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import psutil
from filesystems import mount_of
from fixtures import REPO, BenchError

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.pg_server import PgServer, pg_bin_dir

ENV_URL = "BENCH_PG_URL"
SUPERUSER = "spoolctl"
SETTINGS = {
    "listen_addresses": "127.0.0.1",
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
    "max_connections": "100",
}
"""Set explicitly (the tests' server differs on fsync); all else is the default."""
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
    server = _external(raw) if raw else _own(scratch)
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


def _external(raw: str) -> PgServer:
    from sqlalchemy.engine import make_url

    url = make_url(raw)
    if not url.drivername.startswith("postgresql"):
        raise BenchError(f"{ENV_URL} must be a postgresql:// URL")
    return PgServer(url.set(database=url.database or "postgres"))


def _own(scratch: Path) -> PgServer:
    bin_dir = pg_bin_dir()
    run_as: list[str] = []
    owner: tuple[int, int] | None = None
    if os.geteuid() == 0:  # PostgreSQL refuses root: run it as nobody
        nobody = pwd.getpwnam("nobody")
        owner = (nobody.pw_uid, nobody.pw_gid)
        run_as = ["setpriv", f"--reuid={owner[0]}", f"--regid={owner[1]}", "--clear-groups"]
    root = Path(tempfile.mkdtemp(prefix="pg-", dir=scratch))
    try:
        if owner is not None:
            os.chown(root, *owner)
        root.chmod(0o700)
        data_dir, sockets = root / "data", root / "sockets"
        sockets.mkdir(mode=0o700)
        password = secrets.token_urlsafe(24)
        pwfile = root / "pwfile"
        with open(os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as out:
            out.write(password + "\n")
        if owner is not None:
            for path in (sockets, pwfile):
                os.chown(path, *owner)
        _run(
            [
                *run_as,
                str(bin_dir / "initdb"),
                *("-D", str(data_dir), "-U", SUPERUSER, f"--pwfile={pwfile}"),
                *("--auth=scram-sha-256", "--encoding=UTF8", "--locale=C", "--no-instructions"),
            ],
            root,
        )
        pwfile.unlink()
        port = _free_port()
        settings = {
            **SETTINGS,
            "port": str(port),
            "unix_socket_directories": str(sockets),
        }
        options = " ".join(f"-c {shlex.quote(f'{k}={v}')}" for k, v in settings.items())
        log = root / "server.log"
        _run(
            [
                *run_as,
                str(bin_dir / "pg_ctl"),
                *("start", "-w", "-t", "60", "-D", str(data_dir), "-l", str(log), "-o", options),
            ],
            root,
        )
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    from sqlalchemy.engine import URL

    admin = URL.create(
        "postgresql+psycopg",
        username=SUPERUSER,
        password=password,
        host="127.0.0.1",
        port=port,
        database="postgres",
    )
    return PgServer(admin, root=root, data_dir=data_dir, run_as=run_as)


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


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run(argv: list[str], cwd: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C"
    proc = subprocess.run(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if proc.returncode != 0:
        raise BenchError(f"{shlex.join(argv)} exited {proc.returncode}: {proc.stderr[-600:]}")
