"""Pytest fixtures for tests against a real PostgreSQL server (see tests/pg_server.py).

Registered from tests/conftest.py with `pytest_plugins = ["tests.pg_fixtures"]`.

- pg_server (session): one server for the whole session, stopped at its end;
  the server of SPOOLCTL_TEST_PG_URL instead if that is set.
- pg_databases (function): a factory, new_url = pg_databases(), of fresh
  empty databases, all dropped after the test.
- pg_url (function): the URL (postgresql+psycopg://...) of one fresh empty
  database, dropped after the test.

A missing pgserver fails the tests that need it (never a silent skip).
"""

from __future__ import annotations

import importlib.util
import re
import secrets
from collections.abc import Callable, Iterator

import pytest

from tests.pg_server import ENV_URL, SETUP_HINT, PgServer, server_from_env, start_server


def _missing_packages() -> list[str]:
    wanted = ["psycopg"] + ([] if server_from_env() is not None else ["pgserver"])
    return [name for name in wanted if importlib.util.find_spec(name) is None]


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PgServer]:
    """A PostgreSQL server for the session (superuser spoolctl on 127.0.0.1), or
    SPOOLCTL_TEST_PG_URL's server."""
    missing = _missing_packages()
    if missing:
        pytest.fail(
            f"the PostgreSQL tests need Python packages that are not installed"
            f" ({', '.join(missing)}): {SETUP_HINT}; or set {ENV_URL} to a server"
            " whose user may CREATE DATABASE",
            pytrace=False,
        )
    server = start_server(tmp_path_factory.mktemp("pg"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_databases(
    pg_server: PgServer, request: pytest.FixtureRequest
) -> Iterator[Callable[[], str]]:
    """Call it to create one more fresh empty database; returns its URL. All of
    them are dropped (WITH (FORCE)) after the test."""
    stem = re.sub(r"[^a-z0-9]+", "_", request.node.name.lower()).strip("_")[:30]
    created: list[str] = []

    def new_database() -> str:
        name = f"t_{stem}_{secrets.token_hex(4)}"
        url = pg_server.create_database(name)
        created.append(name)
        return url

    try:
        yield new_database
    finally:
        for name in reversed(created):
            pg_server.drop_database(name)


@pytest.fixture
def pg_url(pg_databases: Callable[[], str]) -> str:
    """SQLAlchemy URL (postgresql+psycopg://...) of a fresh empty database, dropped
    after the test."""
    return pg_databases()
