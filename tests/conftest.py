"""Shared fixtures: the queue a test works on (`db`), on SQLite or on PostgreSQL.

`db` is an SQLite file (a `Path` in a fresh spool folder; the file does not
exist yet) unless the test is marked `both_backends`: then it runs twice,
`[sqlite]` and `[postgresql]`, and on PostgreSQL `db` is the URL (a `str`) of a
fresh empty database on the session's test server (tests/pg_fixtures.py).
Either is what `--db` takes; the helpers in tests/helpers.py accept both.

- `@pytest.mark.both_backends` (on a test, a class, or a module's `pytestmark`)
  parametrizes the `backend` fixture, and with it `db` and every fixture built
  on them (a module-scoped queue uses `module_db`).
- `@pytest.mark.pg_xfail(reason="...")` (on a test, or on one parameter with
  `pytest.param(..., marks=...)`) marks the PostgreSQL variant only as a
  strict xfail: a known PostgreSQL gap stays visible, and the test turns red
  once the gap is fixed, until the mark is removed.
- A test that cannot be backend-neutral (it opens the file with sqlite3, checks
  -wal files, file modes...) keeps plain `db`, or opts out of its module's
  mark with `@pytest.mark.sqlite_only("why")`.

`pytest -k "not postgresql"` runs the converted tests on SQLite only (the
tests/pg/ modules still need the server).

A test's folder is its kind (tests/README.md): tests/unit/ runs in-process
(no process started, no server but the [postgresql] run of a both_backends
test), tests/process/ starts real processes, tests/pg/ needs the PostgreSQL
test server, tests/browser/ drives Chromium, tests/compat/ runs the original.
The markers (registered in pyproject.toml) follow the folders, so that -m can
leave out what is slow or needs more than Python; the inner loop is
`./scripts/test tests/unit -m "not pg"`.

- `pg` is set here, never by hand: on every test under tests/pg/ (some start a
  server of their own), on every test that uses the test server's fixtures
  (pg_server, pg_databases, pg_url), and on the [postgresql] run of a
  both_backends test. A test that starts or reaches a test server without
  it fails (_marks_tell_the_truth), so the mark cannot go stale.
- `browser` is set here on tests/browser/ (and any test using its `chromium`
  fixture).
- `gpu` is put on by hand, on tests that need a real NVIDIA GPU: they run
  where `nvidia-smi -L` lists one (or SPOOLCTL_GPU_TESTS=1 says to), and
  elsewhere are left out of the run (deselected, not skipped), with one
  line at the end saying so and why (`gpu_tests_left_out`).
- `slow` is put on by hand, on tests of five seconds or more (grace periods,
  timeouts, the chaos runs, the differential suite): -m "not slow" skips them.
- `subprocess` is set here on tests/process/ and tests/compat/, and put on by
  hand (a module's `pytestmark`, or one test) elsewhere where a test starts
  real processes: spoolctl verbs or workers as processes, jobs (an
  in-process worker spawns its jobs), a worker's lease guard, any other
  program; a module fixture's processes count for every test using it. A
  test that starts a process without the mark fails with the hint to add it,
  so the mark stays true (a test server's initdb and pg_ctl are `pg`'s).
- tests/unit/ holds to its promise the same way: a test there that starts a
  process, carries `subprocess` or `browser`, or asks for the test server's
  fixtures itself fails with the hint to move it to its kind's folder.

Parallel runs (pytest-xdist, `./scripts/test` runs `-n N --dist loadgroup`):
each worker process gets its own PostgreSQL server (pg_server is per
session, and each worker is a session), its own basetemp and so its own
queues and spool folders; ports are always the kernel's free ones. The
reaper's scan of every process on the machine finds an attempt's processes
by a token of worker id, attempt row and claim time (spoolctl/runner/procs.py), so
one worker's reaper cannot take another's jobs for orphans. Tests
that share a module-scoped fixture (a queue filled once, a server or browser
of the module's own, the differential suite's one run of every scenario)
are put in one xdist group per module, so that they run on one worker and the
fixture is built once; every other test is spread singly.

A loaded machine: every deadline of the tests (wait_for, patience(), each
test's pytest-timeout limit) is scaled by SPOOLCTL_TEST_TIMEOUT_SCALE
(tests/helpers.py), and SPOOLCTL_TEST_LOAD=N has the run start N busy loops
of its own, once per run, in the controller (tests/load.py).
"""

from __future__ import annotations

import functools
import gc
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from devtools import pg_server as pg_tools
from tests import forkserver
from tests.helpers import TIMEOUT_SCALE, Db, stop_started_workers
from tests.load import Load, load_from_env

pytest_plugins = ["tests.pg_fixtures"]

os.environ.pop("COLUMNS", None)
"""The views fit COLUMNS (cli/look.py), which pytest-xdist's workers export
(80): a test's text is uncut unless the test sets a width itself."""

BACKENDS = ("sqlite", "postgresql")


def pytest_configure(config: pytest.Config) -> None:
    # a stray .spoolctl in the temp folder or above must not decide where tests' queues are
    os.environ.setdefault("SPOOLCTL_CEILING_DIRECTORIES", tempfile.gettempdir())
    for line in (
        "both_backends: run the test on SQLite and on PostgreSQL ([sqlite] / [postgresql]):"
        " parametrizes the backend fixture, and with it db and module_db",
        "pg_xfail(reason): the [postgresql] variant of a both_backends test (or of one"
        " of its parameters) is a strict xfail (a known PostgreSQL gap)",
        "sqlite_only(reason): opt a test out of its module's both_backends mark",
    ):
        config.addinivalue_line("markers", line)
    if not hasattr(config, "workerinput"):  # the controller, or a run without xdist
        LOAD.start()  # before the watch: the session's, not a test's
    _watch_what_tests_do()
    _signals_as_from_a_terminal()


LOAD = Load(load_from_env())
"""SPOOLCTL_TEST_LOAD's busy loops (tests/load.py), one set per run."""


def pytest_unconfigure(config: pytest.Config) -> None:
    LOAD.stop()


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = [f"deadlines x{TIMEOUT_SCALE:g} (SPOOLCTL_TEST_TIMEOUT_SCALE, tests/helpers.py)"]
    return lines + ([LOAD.describe()] if LOAD.procs else [])


def _signals_as_from_a_terminal() -> None:
    """Undo what a launcher left ignored. A non-interactive shell starts a
    background job (`./scripts/test &`) with SIGINT and SIGQUIT ignored, and
    nohup ignores SIGHUP; an ignored signal stays ignored through every exec,
    so the verbs, workers and jobs the tests start would inherit it (seen:
    `status --watch` deaf to its Ctrl-C, jobs with SIGQUIT ignored). Each
    test process puts them back as a terminal would have them."""
    defaults = {
        signal.SIGINT: signal.default_int_handler,
        signal.SIGQUIT: signal.SIG_DFL,
        signal.SIGHUP: signal.SIG_DFL,
    }
    for number, handler in defaults.items():
        if signal.getsignal(number) == signal.SIG_IGN:
            signal.signal(number, handler)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    node = metafunc.definition
    if "backend" not in metafunc.fixturenames or node.get_closest_marker("both_backends") is None:
        return
    if node.get_closest_marker("sqlite_only") is not None:
        return
    metafunc.parametrize("backend", BACKENDS, ids=BACKENDS, indirect=True)


PG_FIXTURES = frozenset({"pg_server", "pg_databases", "pg_url"})
TESTS = Path(__file__).resolve().parent
KINDS = ("unit", "process", "pg", "browser", "compat")
"""The folders of tests/, one per kind of test (tests/README.md)."""
PROCESS_KINDS = frozenset({"process", "compat"})
SHARED_SCOPES = frozenset({"class", "module", "package"})
"""Session-scoped fixtures are built once per worker anyway (each is a session)."""
CHEAP_SHARED = frozenset({"backend", "_collect_after_module"})
"""Module-scoped fixtures that do not tie a module's tests to one worker."""


@pytest.hookimpl(tryfirst=True)  # before -m deselects and xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Sets the pg, browser and xdist_group marks (see the module docstring),
    then the pg_xfail ones; leaves out the gpu tests where no GPU is."""
    for item in items:
        kind = kind_of(item)
        if kind == "pg" or _needs_pg(item):
            item.add_marker(pytest.mark.pg)
        if kind == "browser" or "chromium" in _fixture_names(item):
            item.add_marker(pytest.mark.browser)
        if kind in PROCESS_KINDS:
            item.add_marker(pytest.mark.subprocess)
        if _shares_module_state(item):
            item.add_marker(pytest.mark.xdist_group(_module_id(item)))
        _scale_timeout(item)
    _mark_pg_xfails(items)
    if gpu_tests_left_out() is not None:
        left = [item for item in items if item.get_closest_marker("gpu") is not None]
        if left:
            config.hook.pytest_deselected(items=left)
            items[:] = [item for item in items if item.get_closest_marker("gpu") is None]
            GPU_TESTS_LEFT_OUT.extend(item.nodeid for item in left)


GPU_TESTS_ENV = "SPOOLCTL_GPU_TESTS"
GPU_TESTS_LEFT_OUT: list[str] = []
"""The gpu tests this process left out of its run (an xdist worker's own)."""


@functools.cache
def gpu_tests_left_out() -> str | None:
    """Why the tests marked gpu do not run here (None: they do): they need a
    GPU that `nvidia-smi -L` lists, unless SPOOLCTL_GPU_TESTS=1 says to run them."""
    if os.environ.get(GPU_TESTS_ENV) == "1":
        return None
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "no NVIDIA GPU here (no nvidia-smi)"
    try:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"nvidia-smi -L failed ({exc})"
    if listed.returncode != 0 or not re.search(r"^GPU \d+", listed.stdout, re.MULTILINE):
        return "nvidia-smi -L lists no GPU"
    return None


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """One line where the gpu tests were left out, and why (in a run without
    xdist, only where some were collected; the xdist controller collects
    nothing itself, so there it says so whenever the machine has no GPU)."""
    why = gpu_tests_left_out()
    if why is None or hasattr(config, "workerinput"):
        return
    if not GPU_TESTS_LEFT_OUT and config.pluginmanager.getplugin("dsession") is None:
        return
    count = f"{len(GPU_TESTS_LEFT_OUT)} " if GPU_TESTS_LEFT_OUT else ""
    terminalreporter.write_line(
        f"gpu: {count}tests marked gpu left out: {why}; "
        f"{GPU_TESTS_ENV}=1 runs them anyway (tests/README.md)"
    )


def _scale_timeout(item: pytest.Item) -> None:
    """pytest-timeout's limit for the test (its `timeout` mark, else --timeout,
    PYTEST_TIMEOUT or the ini's) times TIMEOUT_SCALE, as every deadline of
    the tests: a test's whole run slows down with the machine as its waits
    do. The scaled mark goes first, so it is the one pytest-timeout reads."""
    mark = item.get_closest_marker("timeout")
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = {}
    if mark is not None:
        kwargs = {k: v for k, v in mark.kwargs.items() if k != "timeout"}
        seconds = mark.kwargs.get("timeout", mark.args[0] if mark.args else None)
        args = tuple(mark.args[1:])
    else:
        config = item.config
        seconds = (
            config.getoption("timeout", None)
            or os.environ.get("PYTEST_TIMEOUT")
            or config.getini("timeout")
        )
    if seconds and float(seconds) > 0 and TIMEOUT_SCALE != 1:
        scaled = pytest.mark.timeout(float(seconds) * TIMEOUT_SCALE, *args, **kwargs)
        item.add_marker(scaled, append=False)


def kind_of(item: pytest.Item) -> str | None:
    """The kind folder the test's module is in (one of KINDS), else None."""
    path = item.path.resolve()
    parts = path.relative_to(TESTS).parts if path.is_relative_to(TESTS) else ()
    return parts[0] if len(parts) > 1 and parts[0] in KINDS else None


def _fixture_names(item: pytest.Item) -> list[str]:
    return list(getattr(item, "fixturenames", ()))


def _needs_pg(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    if callspec is not None and callspec.params.get("backend") == "postgresql":
        return True
    return bool(PG_FIXTURES & set(_fixture_names(item)))


def _shares_module_state(item: pytest.Item) -> bool:
    """The test uses a fixture built once per module (or class) that is not
    one of CHEAP_SHARED: the module's tests belong on one worker."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    for name in _fixture_names(item):
        defs = info.name2fixturedefs.get(name)
        if defs and name not in CHEAP_SHARED and defs[-1].scope in SHARED_SCOPES:
            return True
    return False


def _module_id(item: pytest.Item) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", item.nodeid.split("::")[0])


def _mark_pg_xfails(items: list[pytest.Item]) -> None:
    """pg_xfail (on a test, its module, or one of its parameters) makes the
    [postgresql] variant a strict xfail; the [sqlite] one runs as usual."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None or callspec.params.get("backend") != "postgresql":
            continue
        reasons = []
        for mark in item.iter_markers("pg_xfail"):
            reason = mark.kwargs.get("reason") or (mark.args[0] if mark.args else "")
            assert reason, f"{item.nodeid}: pg_xfail needs a reason (the diagnosis)"
            reasons.append(reason)
        if reasons:
            reason = "PostgreSQL: " + "; ".join(reasons)
            item.add_marker(pytest.mark.xfail(strict=True, reason=reason))


@pytest.fixture(scope="module")
def backend(request: pytest.FixtureRequest) -> str:
    """`sqlite`, or `postgresql` for the second run of a both_backends test.
    Module-scoped, so that a module-scoped queue (module_db) can follow it."""
    return str(getattr(request, "param", "sqlite"))


@pytest.fixture
def db(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> Iterator[Db]:
    """The queue of the test: on SQLite a path in a fresh spool folder (the
    file does not exist yet); on PostgreSQL the URL of a fresh empty database.
    The working directory is tmp_path; on PostgreSQL, workers keep their
    output files under tmp_path/state (XDG_STATE_HOME), never in $HOME."""
    monkeypatch.delenv("SPOOLCTL_DB", raising=False)
    monkeypatch.chdir(tmp_path)
    if backend == "sqlite":
        yield tmp_path / "spool" / "queue.db"
        return
    monkeypatch.delenv("SPOOLCTL_SPOOL_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    url: str = request.getfixturevalue("pg_url")
    yield url
    stop_started_workers()  # before the database is dropped under them


@pytest.fixture(scope="module")
def module_db(
    backend: str, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Db]:
    """A queue shared by a module's tests (not created yet): an SQLite path in a
    fresh spool folder, or the URL of a fresh empty PostgreSQL database,
    dropped at the end of the module. On PostgreSQL, XDG_STATE_HOME points
    into a temporary folder for the module."""
    stem = re.sub(r"[^a-z0-9]+", "_", request.module.__name__.split(".")[-1].lower())
    folder = tmp_path_factory.mktemp(stem)
    if backend == "sqlite":
        yield folder / "spool" / "queue.db"
        return
    from tests.pg_server import PgServer

    server: PgServer = request.getfixturevalue("pg_server")
    name = f"m_{stem[:30]}_{secrets.token_hex(4)}"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_STATE_HOME", str(folder / "state"))
        patch.delenv("SPOOLCTL_SPOOL_DIR", raising=False)
        url = server.create_database(name)
        try:
            yield url
        finally:
            stop_started_workers()
            server.drop_database(name)


@pytest.fixture(autouse=True)
def _no_stray_workers() -> Iterator[None]:
    """Every worker a test started is gone after it, even when the test failed."""
    yield
    stop_started_workers()


@pytest.fixture(autouse=True)
def _no_frozen_garbage() -> Iterator[None]:
    """A verb run in this process may call gc.freeze() (work and web do: a
    spoolctl process is short-lived), which would keep every unreachable
    engine of earlier in-process runs, and its open files and sockets, for
    the rest of the session: past 1024 descriptors select() fails. Give the
    frozen objects back to the collector after each test."""
    yield
    if gc.get_freeze_count():
        gc.unfreeze()


@pytest.fixture(autouse=True, scope="module")
def _collect_after_module() -> Iterator[None]:
    """Close what a module's in-process runs left for the collector."""
    yield
    gc.collect()


# -- the marks tell the truth ----------------------------------------------------------

F = TypeVar("F", bound=Callable[..., Any])


class _Did:
    """What the running test did that its marks must say (reset before each
    test's setup, so a module fixture's work counts for the test that made it)."""

    process: str | None = None
    pg: str | None = None


def _noting(kind: str, what: str, fn: F) -> F:
    @functools.wraps(fn)
    def noted(*args: Any, **kwargs: Any) -> Any:
        if getattr(_Did, kind) is None:
            setattr(_Did, kind, what)
        return fn(*args, **kwargs)

    return noted  # type: ignore[return-value]


def _watch_what_tests_do() -> None:
    """Every way a test process starts another (subprocess, fork, spawn, a
    child of tests/forkserver.py), and every way it starts or reaches a
    PostgreSQL test server (devtools/pg_server.py, which tests/pg_server.py
    re-exports), notes it in _Did. Wrapped once per session, in the test
    process only (children exec)."""
    popen: Any = subprocess.Popen
    if hasattr(popen._execute_child, "__wrapped__"):
        return
    popen._execute_child = _noting("process", "subprocess.Popen", popen._execute_child)
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp"):
        if hasattr(os, name):
            setattr(os, name, _noting("process", f"os.{name}", getattr(os, name)))
    forkserver.run = _noting("process", "tests.forkserver.run", forkserver.run)
    pg_tools.pg_bin_dir = _noting("pg", "start a test server", pg_tools.pg_bin_dir)
    pg_tools._run = _unnoted(pg_tools._run)  # initdb, pg_ctl: the pg mark says it
    server: Any = pg_tools.PgServer
    server.connect = _noting("pg", "connect to a test server", server.connect)


def _unnoted(fn: F) -> F:
    """fn's processes are not the test's own: starting or stopping a test
    server is what `pg` says (and the session's server is started by
    whichever pg test comes first)."""

    @functools.wraps(fn)
    def unnoted(*args: Any, **kwargs: Any) -> Any:
        before = _Did.process
        try:
            return fn(*args, **kwargs)
        finally:
            _Did.process = before

    return unnoted  # type: ignore[return-value]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _Did.process = _Did.pg = None


@pytest.fixture(autouse=True)
def _marks_tell_the_truth(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that started a process carries `subprocess`, one that started or
    reached a PostgreSQL test server carries `pg`: else -m would run it where
    it cannot work, or in a loop that promised to be quick. A test in
    tests/unit/ does neither (but the [postgresql] run of a both_backends
    test): else the inner loop would not be what it says."""
    node = request.node
    in_unit = kind_of(node) == "unit"
    if in_unit:
        _stays_in_process(node)
    yield
    if _Did.process and node.get_closest_marker("subprocess") is None:
        hint = (
            "tests/unit/ runs in-process only: move it to tests/process/"
            if in_unit
            else "add `pytestmark = pytest.mark.subprocess` to its module (or the mark to"
            " the test), or move it to tests/process/"
        )
        pytest.fail(
            f"{node.nodeid} started a process ({_Did.process}) but is not marked subprocess:"
            f" {hint}",
            pytrace=False,
        )
    if _Did.pg and node.get_closest_marker("pg") is None:
        pytest.fail(
            f"{node.nodeid} used PostgreSQL ({_Did.pg}) but is not marked pg: use the"
            " pg fixtures or both_backends, or move it to tests/pg/",
            pytrace=False,
        )


def _stays_in_process(node: pytest.Item) -> None:
    """A test in tests/unit/ that says it starts processes, drives the
    browser or needs the test server for itself is in the wrong folder."""
    wrong = [m for m in ("subprocess", "browser") if node.get_closest_marker(m) is not None]
    wrong += sorted(PG_FIXTURES & set(_fixture_names(node)))
    if wrong:
        pytest.fail(
            f"{node.nodeid} is in tests/unit/ (in-process only) but has {', '.join(wrong)}:"
            " move it to tests/process/, tests/pg/ or tests/browser/",
            pytrace=False,
        )
