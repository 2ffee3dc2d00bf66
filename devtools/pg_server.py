"""A throwaway PostgreSQL server for the tests and the benchmark, from the
binaries of the PyPI package pgserver (initdb, pg_ctl, postgres in
pgserver/pginstall/bin). The one place that starts one: tests/pg_server.py
(the tests' fast server) and bench/pgserve.py (the benchmark's durable one)
both call start_private_server, neither imports the other.

Only the binaries are used, never pgserver's Python API (it creates system
users and keeps global state); the package is located with find_spec, which
does not import it.

start_private_server(base_dir, profile) runs initdb and pg_ctl start: one
superuser `spoolctl` with a random password, scram-sha-256 for every
connection, listening on 127.0.0.1 only, on a free port. PostgreSQL refuses to
run as root, so under root the server runs as user nobody (setpriv), in a
folder nobody else can enter. What differs is the profile:

- FAST (the tests): fsync off, a small WAL, the folder in RAM (/dev/shm) when
  there is room; a crash of the machine may lose it, which no test minds.
- DURABLE (the benchmark): fsync, synchronous_commit and full_page_writes on,
  the folder on disk in base_dir (never in RAM), everything else PostgreSQL's
  default: every commit waits for its WAL flush, which is what is measured.

server_at(url, source) wraps a server someone else runs (the tests'
SPOOLCTL_TEST_PG_URL, the benchmark's BENCH_PG_URL): nothing is started or
stopped, databases are created on it.

start_replica(primary, base_dir) adds a hot standby to a server started
here (pg_basebackup -R over the loopback replication connection initdb's
pg_hba.conf allows, then started on a port of its own), synchronous by
default; a server started here can also be crashed (pg_ctl stop -m
immediate) and a standby promoted (tests/pg/test_replica.py's failover).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import pwd
import secrets
import shlex
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import URL, make_url

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

SUPERUSER = "spoolctl"
SETUP_HINT = "run ./scripts/setup (it installs the test extra: pgserver and psycopg[binary])"
# libpq settings a developer may have in the environment; none may leak into the
# server's tools or steer them to another server
_LIBPQ_ENV = (
    "PGHOST",
    "PGHOSTADDR",
    "PGPORT",
    "PGUSER",
    "PGPASSWORD",
    "PGPASSFILE",
    "PGDATABASE",
    "PGSERVICE",
    "PGSERVICEFILE",
    "PGDATA",
    "PGOPTIONS",
    "PGSSLMODE",
)
# the server's folder goes in RAM if this RAM file system has room: data and WAL
# stay under 250 MB (a fresh cluster is 40 MB, the WAL is capped by max_wal_size)
SHM = Path("/dev/shm")
SHM_MIN_FREE = 1 << 30
# in each server folder: the process that started it, to stop servers whose
# process was killed (SIGKILL, a CI timeout) before it could stop them
OWNER_FILE = "owner"
_FOLDER_PREFIX = "spoolctl-pg-"
_SOCKET_PATH_MAX = 100  # sun_path is 108 bytes; the socket is <dir>/.s.PGSQL.<port>


class PgServerError(RuntimeError):
    """The server could not be set up or started."""


@dataclass(frozen=True)
class Profile:
    """How a server started here keeps its data: the settings passed to
    postgres (-c) besides where it listens, whether initdb syncs its files,
    and whether the folder may go in RAM."""

    name: str
    settings: Mapping[str, str]
    initdb_syncs: bool
    in_ram: bool


FAST = Profile(
    "fast",
    {
        "fsync": "off",
        "max_connections": "200",
        "shared_buffers": "32MB",
        # the folder may be in RAM (/dev/shm): keep the WAL small
        "min_wal_size": "32MB",
        "max_wal_size": "128MB",
    },
    initdb_syncs=False,
    in_ram=True,
)
"""The tests' server: nothing waits for the disk, and the folder is in RAM when it fits."""

DURABLE = Profile(
    "durable",
    {
        "fsync": "on",
        "synchronous_commit": "on",
        "full_page_writes": "on",
        "max_connections": "100",
    },
    initdb_syncs=True,
    in_ram=False,
)
"""The benchmark's server: as durable as PostgreSQL's defaults (set explicitly,
so that a changed default cannot change what is measured), data on disk."""


def pg_bin_dir() -> Path:
    """pgserver's bin folder (initdb, pg_ctl, postgres...), without importing pgserver."""
    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise PgServerError(f"the Python package pgserver is not installed: {SETUP_HINT}")
    for location in spec.submodule_search_locations:
        bin_dir = Path(location) / "pginstall" / "bin"
        if (bin_dir / "postgres").is_file():
            return bin_dir
    raise PgServerError(f"pgserver is installed but has no pginstall/bin/postgres: {SETUP_HINT}")


def libpq_url(url: str) -> str:
    """A SQLAlchemy URL (postgresql+psycopg://...) as a libpq URI for psycopg.connect."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


class PgServer:
    """A PostgreSQL server to create databases on (for a test, for the benchmark).

    Either one this module started (data_dir set; stop() shuts it down and
    removes its folder) or one given by a URL (server_at; stop() only closes
    the admin connection)."""

    def __init__(
        self,
        admin: URL,
        *,
        root: Path | None = None,
        data_dir: Path | None = None,
        run_as: Sequence[str] = (),
        extra_dirs: Sequence[Path] = (),
    ) -> None:
        self._admin = admin.set(drivername="postgresql+psycopg")
        self.root = root
        self.data_dir = data_dir
        self._run_as = list(run_as)
        self._extra_dirs = list(extra_dirs)
        self._conn: psycopg.Connection[Any] | None = None
        self._stopped = False
        self._pid = os.getpid()  # a forked child must not stop its parent's server

    @property
    def owned(self) -> bool:
        """True if this module started the server (and stop() shuts it down)."""
        return self.data_dir is not None

    @property
    def host(self) -> str:
        return str(self._admin.host)

    @property
    def port(self) -> int:
        return int(self._admin.port or 5432)

    @property
    def user(self) -> str:
        return str(self._admin.username)

    @property
    def password(self) -> str:
        return str(self._admin.password or "")

    def url(self, dbname: str) -> str:
        """SQLAlchemy URL of database dbname: postgresql+psycopg://user:pw@host:port/dbname."""
        return self._admin.set(database=dbname).render_as_string(hide_password=False)

    def admin_url(self) -> str:
        """SQLAlchemy URL of the maintenance database (postgres, or the env URL's)."""
        return self._admin.render_as_string(hide_password=False)

    def conninfo(self, dbname: str | None = None) -> str:
        """libpq URI (for psycopg.connect) of dbname, or of the maintenance database."""
        return libpq_url(self.url(dbname) if dbname else self.admin_url())

    def connect(self, dbname: str | None = None, **kwargs: Any) -> psycopg.Connection[Any]:
        """A new psycopg connection to dbname (default: the maintenance database)."""
        import psycopg

        kwargs.setdefault("connect_timeout", 10)
        return psycopg.connect(self.conninfo(dbname), **kwargs)

    def _admin_conn(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = self.connect(autocommit=True, application_name="spoolctl-test-admin")
        return self._conn

    def _admin_execute(self, query: sql.Composed) -> None:
        """Run query on the kept admin connection; reconnect once if it was lost
        (a test may have terminated every other backend)."""
        import psycopg

        try:
            self._admin_conn().execute(query)
        except psycopg.OperationalError:
            if self._conn is None or not self._conn.broken:
                raise
            self._admin_conn().execute(query)

    def create_database(self, name: str) -> str:
        """CREATE DATABASE name (empty, from template0, UTF8, locale C); returns its URL.

        STRATEGY FILE_COPY (PostgreSQL 15+) copies the template's files instead of
        writing all its pages to the WAL: as fast, and the WAL does not grow by
        the template's 7.5 MB per database."""
        from psycopg import sql

        query = "CREATE DATABASE {} TEMPLATE template0 ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C'"
        if self._admin_conn().info.server_version >= 150000:
            query += " STRATEGY FILE_COPY"
        self._admin_execute(sql.SQL(query).format(sql.Identifier(name)))
        return self.url(name)

    def drop_database(self, name: str) -> None:
        """DROP DATABASE IF EXISTS name WITH (FORCE): its sessions are terminated first."""
        from psycopg import sql

        self._admin_execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )

    @property
    def running(self) -> bool:
        """A server started here is up (between shut_down() and start_again() it is not)."""
        return self.data_dir is not None and (self.data_dir / "postmaster.pid").exists()

    def shut_down(self) -> None:
        """pg_ctl stop -m fast, keeping the folder: every session ends and every
        connection is refused until start_again() (only a server started here)."""
        if self.data_dir is None:
            raise PgServerError("only a server started by devtools/pg_server.py can be shut down")
        _pg_ctl_stop(self._run_as, self.data_dir, "fast")

    def start_again(self) -> None:
        """pg_ctl start after shut_down(), with the options the server last ran
        with (its postmaster.opts): the same port, folder and data."""
        if self.data_dir is None or self.root is None:
            raise PgServerError("only a server started by devtools/pg_server.py can be started")
        words = shlex.split((self.data_dir / "postmaster.opts").read_text())[1:]
        at = words.index("-D")
        del words[at : at + 2]  # pg_ctl passes its own -D
        _run(
            [
                *self._run_as,
                str(pg_bin_dir() / "pg_ctl"),
                *("start", "-w", "-t", "60", "-D", str(self.data_dir)),
                *("-l", str(self.root / "server.log"), "-o", shlex.join(words)),
            ],
            cwd=self.root,
        )

    def crash(self) -> None:
        """pg_ctl stop -m immediate, keeping the folder: the server ends at once
        without a checkpoint, as a machine that lost its power would, and
        start_again() recovers it from its WAL (only a server started here)."""
        if self.data_dir is None:
            raise PgServerError("only a server started by devtools/pg_server.py can be stopped")
        _pg_ctl_stop(self._run_as, self.data_dir, "immediate")

    def promote(self) -> None:
        """pg_ctl promote -w: a standby (start_replica) leaves recovery and
        takes writes; returns once it does."""
        if self.data_dir is None:
            raise PgServerError("only a server started by devtools/pg_server.py can be promoted")
        _run(
            [
                *self._run_as,
                str(pg_bin_dir() / "pg_ctl"),
                "promote",
                "-w",
                "-t",
                "60",
                "-D",
                str(self.data_dir),
            ],
            cwd=self.data_dir.parent,
        )

    def stop(self) -> None:
        """Close the admin connection; for a server started here, pg_ctl stop -m fast
        and remove its folder. Safe to call twice."""
        if self._stopped or os.getpid() != self._pid:
            return
        self._stopped = True
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None
        if self.data_dir is None:
            return
        try:
            if (self.data_dir / "postmaster.pid").exists():
                _pg_ctl_stop(self._run_as, self.data_dir, "fast")
        finally:
            for folder in [self.root, *self._extra_dirs]:
                if folder is not None:
                    shutil.rmtree(folder, ignore_errors=True)


def server_at(raw_url: str, source: str) -> PgServer:
    """The server of a postgresql:// URL someone else runs (its maintenance
    database: the URL's, else postgres); source names where the URL came from,
    for the error. Nothing is started: stop() only closes the admin connection."""
    url = make_url(raw_url)
    if not url.drivername.startswith("postgresql"):
        raise PgServerError(f"{source} must be a postgresql:// URL, got {url.drivername}://")
    if not url.database:
        url = url.set(database="postgres")
    return PgServer(url)


def start_private_server(base_dir: Path, profile: Profile) -> PgServer:
    """Start a private PostgreSQL server with profile's settings.

    Its folder is, for a profile in RAM, a fresh folder in /dev/shm when that
    is a RAM file system with 1 GiB free; else (and always for a profile on
    disk) a fresh folder in base_dir (under root, if user nobody cannot reach
    base_dir: in the temp dir for a profile in RAM, an error for one on disk).
    Returns once the server accepts connections; call .stop() when done (an
    exit of this process does it too)."""
    bin_dir = pg_bin_dir()
    run_as, owner = server_user(bin_dir)
    reap_orphans()
    root = _server_folder(base_dir, owner, profile)
    extra_dirs: list[Path] = []
    try:
        sockets = server_sockets(root, owner, extra_dirs)
        data_dir = root / "data"
        password = secrets.token_urlsafe(24)
        pwfile = root / "pwfile"
        with open(os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as out:
            out.write(password + "\n")
        if owner is not None:
            os.chown(pwfile, *owner)

        _run(
            [
                *run_as,
                str(bin_dir / "initdb"),
                *("-D", str(data_dir), "-U", SUPERUSER, f"--pwfile={pwfile}"),
                *("--auth=scram-sha-256", "--encoding=UTF8", "--locale=C"),
                *(() if profile.initdb_syncs else ("--no-sync",)),
                "--no-instructions",
            ],
            cwd=root,
        )
        pwfile.unlink()
        port = _start(bin_dir, data_dir, sockets, root, run_as, profile)
    except BaseException:
        for folder in (root, *extra_dirs):
            shutil.rmtree(folder, ignore_errors=True)
        raise
    admin = URL.create(
        "postgresql+psycopg",
        username=SUPERUSER,
        password=password,
        host="127.0.0.1",
        port=port,
        database="postgres",
    )
    server = PgServer(admin, root=root, data_dir=data_dir, run_as=run_as, extra_dirs=extra_dirs)
    atexit.register(server.stop)  # a session that dies before its teardown still stops it
    return server


def server_user(bin_dir: Path) -> tuple[list[str], tuple[int, int] | None]:
    """How to run the server's programs: as ourselves, or under root as user
    nobody (setpriv's prefix, and nobody's uid and gid)."""
    if os.geteuid() != 0:
        return [], None
    nobody = pwd.getpwnam("nobody")
    owner = (nobody.pw_uid, nobody.pw_gid)
    if shutil.which("setpriv") is None:
        raise PgServerError("running as root: PostgreSQL must run as nobody, via setpriv")
    for path in (bin_dir / "postgres", bin_dir.parent / "lib"):
        if not _reachable_by_others(path):
            raise PgServerError(f"user nobody cannot reach the PostgreSQL binaries in {path}")
    return ["setpriv", f"--reuid={owner[0]}", f"--regid={owner[1]}", "--clear-groups"], owner


def server_sockets(root: Path, owner: tuple[int, int] | None, extra_dirs: list[Path]) -> Path:
    """In a fresh server folder: its owner file (for reap_orphans) and the
    folder of its Unix socket (in the temp dir, added to extra_dirs, when the
    socket's path would be too long there)."""
    (root / OWNER_FILE).write_text(_process_tag(os.getpid()))
    sockets = root / "sockets"
    sockets.mkdir(mode=0o700)
    if len(str(sockets)) + len("/.s.PGSQL.65535") > _SOCKET_PATH_MAX:
        sockets = Path(tempfile.mkdtemp(prefix="spoolctl-pgs-"))
        extra_dirs.append(sockets)
    if owner is not None:
        for path in (root, sockets):
            os.chown(path, *owner)
    return sockets


def start_replica(
    primary: PgServer, base_dir: Path, profile: Profile = FAST, *, synchronous: bool = True
) -> PgServer:
    """A hot standby of `primary` (a server started here), streaming its WAL:
    pg_basebackup -R over the primary's loopback replication connection
    (initdb's pg_hba.conf allows it, with the same password; wal_level is
    replica by default), then started on a free port of its own with
    profile's settings. With `synchronous`, the primary then waits for the
    standby on every commit (synchronous_standby_names '*', set after the
    copy so the standby does not inherit it; synchronous_commit is on by
    default), and this returns once the standby streams synchronously: a
    commit the primary acknowledged is on the standby. Its admin URL is the
    primary's on the standby's port; stop() stops and removes it."""
    if primary.data_dir is None:
        raise PgServerError("a replica is made of a server started by devtools/pg_server.py")
    bin_dir = pg_bin_dir()
    run_as, owner = server_user(bin_dir)
    root = _server_folder(base_dir, owner, profile)
    extra_dirs: list[Path] = []
    try:
        sockets = server_sockets(root, owner, extra_dirs)
        data_dir = root / "data"
        source = (
            f"host={primary.host} port={primary.port} user={primary.user} "
            f"password={primary.password} application_name=spoolctl_replica"
        )
        _run(
            [
                *run_as,
                str(bin_dir / "pg_basebackup"),
                "-D",
                str(data_dir),
                "-d",
                source,
                "-R",
                "-X",
                "stream",
                "-c",
                "fast",
                "--no-sync",
            ],
            cwd=root,
        )
        port = _start(bin_dir, data_dir, sockets, root, run_as, profile)
    except BaseException:
        for folder in (root, *extra_dirs):
            shutil.rmtree(folder, ignore_errors=True)
        raise
    admin = make_url(primary.admin_url()).set(port=port)
    replica = PgServer(admin, root=root, data_dir=data_dir, run_as=run_as, extra_dirs=extra_dirs)
    atexit.register(replica.stop)
    if synchronous:
        try:
            _wait_for_synchronous(primary)
        except BaseException:
            replica.stop()
            raise
    return replica


def _wait_for_synchronous(primary: PgServer, timeout_s: float = 60.0) -> None:
    """Make the primary wait for its standby on every commit, and return once
    the standby streams as its synchronous one."""
    with primary.connect(autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
        conn.execute("SELECT pg_reload_conf()")
        deadline = time.monotonic() + timeout_s
        while True:
            found = conn.execute(
                "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'"
            ).fetchone()
            if found is not None and found[0] > 0:
                return
            if time.monotonic() > deadline:
                raise PgServerError(f"the standby did not stream synchronously in {timeout_s} s")
            time.sleep(0.05)


def _start(
    bin_dir: Path, data_dir: Path, sockets: Path, root: Path, run_as: list[str], profile: Profile
) -> int:
    """pg_ctl start -w on a free loopback port with profile's settings; retry if
    another process takes the port between the probe and the start. Returns the port."""
    log = root / "server.log"
    for attempt in range(3):
        port = _free_port()
        settings = {
            "listen_addresses": "127.0.0.1",
            "port": str(port),
            "unix_socket_directories": str(sockets),
            **profile.settings,
        }
        options = " ".join(f"-c {shlex.quote(f'{k}={v}')}" for k, v in settings.items())
        try:
            _run(
                [
                    *run_as,
                    str(bin_dir / "pg_ctl"),
                    *("start", "-w", "-t", "60", "-D", str(data_dir)),
                    *("-l", str(log), "-o", options),
                ],
                cwd=root,
            )
            return port
        except PgServerError as exc:
            tail = _tail(log)
            if attempt < 2 and "could not bind" in tail:
                continue
            raise PgServerError(f"{exc}\n--- {log} ---\n{tail}") from None
    raise AssertionError("unreachable")


def _server_folder(base_dir: Path, owner: tuple[int, int] | None, profile: Profile) -> Path:
    """A fresh folder for the server, owned by owner if given (root runs it as nobody).

    In /dev/shm, for a profile in RAM, when it is a RAM file system with room to
    spare: on a disk, each CREATE DATABASE (7.5 MB copied) took 30 to 300 ms, in
    RAM 10 to 15 ms. A profile on disk is in base_dir or fails: elsewhere it
    would be on another disk than the one it is meant to measure."""
    if profile.in_ram and _roomy_tmpfs(SHM):
        root = Path(tempfile.mkdtemp(prefix=_FOLDER_PREFIX, dir=SHM))
    elif owner is None or _reachable_by_others(base_dir):
        base_dir.mkdir(parents=True, exist_ok=True)
        root = Path(tempfile.mkdtemp(prefix="pg-", dir=base_dir))
    elif not profile.in_ram:
        raise PgServerError(f"user nobody cannot reach {base_dir}, where the data must go")
    else:
        # pytest's folders under /tmp/pytest-of-root are 0700: nobody cannot enter them
        root = Path(tempfile.mkdtemp(prefix=_FOLDER_PREFIX))
        if not _reachable_by_others(root.parent):
            shutil.rmtree(root)
            raise PgServerError(f"user nobody cannot reach {root.parent} nor {base_dir}")
    if owner is not None:
        os.chown(root, *owner)
    root.chmod(0o700)
    return root


def _process_tag(pid: int) -> str:
    """pid and its start time: a reused pid does not pass for the same process."""
    import psutil

    try:
        return f"{pid} {psutil.Process(pid).create_time()}"
    except psutil.Error:
        return f"{pid} gone"


def reap_orphans() -> None:
    """Stop and remove the servers in /dev/shm and the temp dir whose process
    is gone without stopping them. Best effort: a folder this user may not stop
    is left alone."""
    for parent in {SHM, Path(tempfile.gettempdir())}:
        for root in parent.glob(f"{_FOLDER_PREFIX}*"):
            try:
                tag = (root / OWNER_FILE).read_text()
                if _process_tag(int(tag.split()[0])) == tag:
                    continue  # its process is alive
                data_dir = root / "data"
                if (data_dir / "postmaster.pid").exists():
                    run_as = _as_owner_of(data_dir)
                    if run_as is None:
                        continue
                    _pg_ctl_stop(run_as, data_dir, "immediate")
                shutil.rmtree(root)
            except (
                OSError,
                ValueError,
                IndexError,
                PgServerError,
            ):  # an owner file half written: its server is young
                continue


def _as_owner_of(path: Path) -> list[str] | None:
    """The setpriv prefix that runs a command as path's owner ([] if that is us),
    or None if this user cannot."""
    st = path.stat()
    if st.st_uid == os.geteuid():
        return []
    if os.geteuid() == 0:
        return ["setpriv", f"--reuid={st.st_uid}", f"--regid={st.st_gid}", "--clear-groups"]
    return None


def _pg_ctl_stop(run_as: list[str], data_dir: Path, mode: str) -> None:
    _run(
        [*run_as, str(pg_bin_dir() / "pg_ctl"), "stop", "-D", str(data_dir), "-m", mode, "-w"],
        cwd=data_dir.parent,
    )


def _roomy_tmpfs(path: Path) -> bool:
    """path is a writable, world-searchable RAM file system with SHM_MIN_FREE free."""
    try:
        if not any(
            line.split()[1:3] == [str(path), "tmpfs"]
            for line in Path("/proc/self/mounts").read_text().splitlines()
        ):
            return False
        st = os.statvfs(path)
    except OSError:
        return False
    free = st.f_bavail * st.f_frsize
    return free >= SHM_MIN_FREE and os.access(path, os.W_OK) and _reachable_by_others(path)


def _reachable_by_others(path: Path) -> bool:
    """Every folder from / to path (and path itself if it is a folder) is
    searchable by any user: a non-root user can reach path."""
    path = path.resolve()
    for folder in [*reversed(path.parents), path]:
        if not folder.exists():
            break
        st = folder.stat()
        if stat.S_ISDIR(st.st_mode) and not st.st_mode & stat.S_IXOTH:
            return False
    return True


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _LIBPQ_ENV}
    env["LC_ALL"] = "C"
    return env


def _run(argv: list[str], *, cwd: Path | None) -> None:
    proc = subprocess.run(
        argv,
        cwd=cwd,
        env=_clean_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if proc.returncode != 0:
        raise PgServerError(
            f"{shlex.join(argv)} exited with {proc.returncode}:\n{proc.stdout}{proc.stderr}"
        )


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(no log: {exc})"
