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
tests/test_pg_*.py modules still need the server).
"""

from __future__ import annotations

import gc
import re
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import Db, stop_started_workers

pytest_plugins = ["tests.pg_fixtures"]

BACKENDS = ("sqlite", "postgresql")


def pytest_configure(config: pytest.Config) -> None:
    for line in (
        "both_backends: run the test on SQLite and on PostgreSQL ([sqlite] / [postgresql]):"
        " parametrizes the backend fixture, and with it db and module_db",
        "pg_xfail(reason): the [postgresql] variant of a both_backends test (or of one"
        " of its parameters) is a strict xfail (a known PostgreSQL gap)",
        "sqlite_only(reason): opt a test out of its module's both_backends mark",
    ):
        config.addinivalue_line("markers", line)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    node = metafunc.definition
    if "backend" not in metafunc.fixturenames or node.get_closest_marker("both_backends") is None:
        return
    if node.get_closest_marker("sqlite_only") is not None:
        return
    metafunc.parametrize("backend", BACKENDS, ids=BACKENDS, indirect=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
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
