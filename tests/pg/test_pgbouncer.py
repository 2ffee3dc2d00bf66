"""PostgreSQL behind a real PgBouncer in transaction pooling mode (Debian's
package, started here on loopback; tests/pgbouncer.py).

In that mode each transaction may run on any of the pool's server sessions,
and the next client of a session inherits whatever the last one left in it.
spoolctl leaves nothing: every setting it needs is the transaction's own, with
SPOOLCTL_PG_TRANSACTION_POOLING=1 no statement is prepared (a prepared
statement lives in one session) and no worker LISTENs (it polls).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from tests.helpers import cli, cli_json, rows, start_worker
from tests.pg_server import PgServer, libpq_url
from tests.pgbouncer import POOL_SIZE, PgBouncer, pgbouncer_binary

pytestmark = [
    pytest.mark.subprocess,
    pytest.mark.timeout(120),
]

POOLED = {"SPOOLCTL_PG_TRANSACTION_POOLING": "1"}
JOBS = 40
SETTINGS = {
    "lock_timeout": "0",
    "idle_in_transaction_session_timeout": "0",
    "enable_seqscan": "on",
    "plan_cache_mode": "auto",
}
"""What spoolctl sets in its transactions (plan_cache_mode only where statements
are prepared, so not through a pooler), and the server's default of each."""


@pytest.fixture(scope="module")
def bouncer(pg_server: PgServer) -> Iterator[PgBouncer]:
    if pgbouncer_binary() is None:
        pytest.fail("pgbouncer is not installed: ./scripts/setup installs it (as root, with apt)")
    pooler = PgBouncer(pg_server)
    try:
        yield pooler
    finally:
        pooler.stop()


@pytest.fixture
def pooled(pg_databases: Callable[[], str], bouncer: PgBouncer) -> tuple[str, str]:
    """(direct URL, URL through the pooler) of one fresh database."""
    direct = pg_databases()
    return direct, bouncer.url(direct.rsplit("/", 1)[1])


def session_settings(url: str) -> set[tuple[str, str]]:
    """What a plain client of the pool finds in the server sessions it is
    handed: several tries, so that each of the pool's sessions is seen."""
    seen: set[tuple[str, str]] = set()
    for _ in range(4 * POOL_SIZE):
        with psycopg.connect(libpq_url(url), autocommit=True, prepare_threshold=None) as conn:
            for name in SETTINGS:
                value = conn.execute(f"SHOW {name}").fetchone()
                assert value is not None
                seen.add((name, str(value[0])))
    return seen


def test_a_fleet_drains_through_the_pooler_and_leaves_its_sessions_clean(
    pooled: tuple[str, str], bouncer: PgBouncer, tmp_path: Path
) -> None:
    direct, url = pooled
    assert cli("migrate", db=url, env=POOLED).exit_code == 0
    batch = tmp_path / "batch.ndjson"
    line = '{{"argv": ["sh", "-c", "sleep 0.2; echo job {n}"]}}\n'
    batch.write_text("".join(line.format(n=n) for n in range(JOBS)))
    added = cli_json("add", "--batch", str(batch), db=url, env=POOLED)
    assert added.exit_code == 0, added.stderr
    # More clients than server sessions: two workers of four slots, and
    # readers beside them, all take turns on POOL_SIZE sessions.
    workers = [start_worker(url, "--drain", "--concurrency", "4", env=POOLED) for _ in range(2)]
    names: set[str] = set()
    readers = 0
    while any(w.poll() is None for w in workers):
        names |= bouncer.client_names()
        if "spoolctl" in names and readers < 2:
            readers += 1
            assert cli_json("status", db=url, env=POOLED).exit_code == 0
            assert cli_json("events", db=url, env=POOLED).exit_code == 0
        time.sleep(0.02)
    outputs = [w.communicate(timeout=90) for w in workers]
    assert [w.returncode for w in workers] == [0, 0], outputs
    assert "spoolctl" in names, names  # the workers were seen, as clients of the pooler
    assert "spoolctl-listen" not in names, "a worker behind a transaction pooler must not LISTEN"
    done = rows(direct, "SELECT state, count(*) AS n FROM jobs GROUP BY state")
    assert [(r["state"], r["n"]) for r in done] == [("done", JOBS)]
    runs = rows(direct, "SELECT job_id, count(*) AS n FROM attempts GROUP BY job_id")
    assert len(runs) == JOBS and {r["n"] for r in runs} == {1}
    shown = cli("output", "7", db=url, env=POOLED)
    assert shown.exit_code == 0 and "job 6" in shown.stdout, shown
    # The ledger read through the pooler is whole: every event once, in order.
    events = cli_json("events", "--limit", "0", db=url, env=POOLED).data
    ids = [e["id"] for e in events["events"]]
    assert ids == sorted(set(ids)) and len(ids) >= 3 * JOBS
    # Nothing of spoolctl's stays in the server sessions for the next client.
    assert session_settings(url) == set(SETTINGS.items())
