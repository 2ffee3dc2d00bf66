"""A real PgBouncer for the tests: Debian's package, started by the test on
loopback in front of the tests' PostgreSQL server, never as a service.

PgBouncer refuses to run as root, so under root it runs as user nobody
(setpriv), in a folder of its own. Clients log in without a password (trust);
PgBouncer logs in to the server with the server's password (auth_file).
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from sqlalchemy.engine import make_url

from tests.pg_server import PgServer

POOL_SIZE = 2
"""Server connections per (database, user): fewer than the clients, so
clients take turns on the same server sessions."""


def pgbouncer_binary() -> str | None:
    for candidate in ("pgbouncer", "/usr/sbin/pgbouncer"):
        found = shutil.which(candidate)
        if found:
            return found
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PgBouncer:
    """PgBouncer in transaction pooling mode in front of server; url(name)
    is the URL of database name through it."""

    def __init__(self, server: PgServer) -> None:
        binary = pgbouncer_binary()
        if binary is None:
            raise RuntimeError("pgbouncer is not installed (./scripts/setup installs it as root)")
        # in the system's temp dir: pytest's folders under root are 0700, and
        # under root PgBouncer runs as nobody
        self.folder = folder = Path(tempfile.mkdtemp(prefix="spoolctl-pgbouncer-"))
        self.port = _free_port()
        self._user = server.user
        (folder / "users.txt").write_text(f'"{server.user}" "{server.password}"\n')
        (folder / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={server.host} port={server.port}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {folder / 'users.txt'}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {POOL_SIZE}\n"
            "min_pool_size = 0\n"
            "reserve_pool_size = 0\n"
            "max_client_conn = 200\n"
            "server_reset_query =\n"
            "ignore_startup_parameters = extra_float_digits\n"
            f"admin_users = {server.user}\n"
            f"logfile = {folder / 'pgbouncer.log'}\n"
        )
        run_as: list[str] = []
        if os.geteuid() == 0:
            nobody = pwd.getpwnam("nobody")
            for path in (folder, *folder.iterdir()):
                os.chown(path, nobody.pw_uid, nobody.pw_gid)
            run_as = ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}"]
            run_as.append("--clear-groups")
        self._proc = subprocess.Popen(
            [*run_as, binary, str(folder / "pgbouncer.ini")],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=(folder / "stderr").open("w"),
        )
        self._wait_until_listening()

    def _wait_until_listening(self) -> None:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"pgbouncer exited: {self.log()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"pgbouncer did not listen within 15 s: {self.log()}")

    def client_names(self) -> set[str]:
        """The application_name of every client connected now (the admin
        console's SHOW CLIENTS, which speaks only the simple protocol)."""
        import psycopg

        conninfo = f"host=127.0.0.1 port={self.port} user={self._user} dbname=pgbouncer"
        with psycopg.connect(conninfo, autocommit=True) as conn:
            result = conn.pgconn.exec_(b"SHOW CLIENTS")
            column = next(
                i for i in range(result.nfields) if result.fname(i) == b"application_name"
            )
            return {
                (result.get_value(row, column) or b"").decode() for row in range(result.ntuples)
            }

    def log(self) -> str:
        path = self.folder / "pgbouncer.log"
        parts = [p.read_text(errors="replace")[-2000:] for p in (path, self.folder / "stderr")]
        return "\n".join(parts)

    def url(self, database: str) -> str:
        """postgresql+psycopg://user@127.0.0.1:port/database, through the pooler."""
        return (
            make_url("postgresql+psycopg://")
            .set(username=self._user, host="127.0.0.1", port=self.port, database=database)
            .render_as_string(hide_password=False)
        )

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)
