"""Statements and round trips per job on PostgreSQL: the statements counted
by the server, the round trips on the wire.

    .venv/bin/python bench/pgcount.py [--jobs 200] [--concurrency 1,8] [--out FILE.json]

Starts a private server (devtools' FAST profile: what is counted does not
depend on fsync) and, for each concurrency given, a fresh database: makes a
queue with `spoolctl migrate`, adds JOBS `true` jobs, turns on
`log_statement = all` for that database only, and drains it with one
`spoolctl work --drain --concurrency C`.

Two counts, because they differ. Statements: every statement the server ran
for the worker's sessions, read from the server's log. Round trips: the
worker connects through `devtools/pgwire.py`'s loopback relay (with
`sslmode=disable`, so the relay can read the protocol), which counts how
often a client starts sending after the server has answered, that is, how
often it waits for the server. Without pipelining each statement is one round
trip (BEGIN and COMMIT included: psycopg sends each on its own), but
psycopg's `executemany` pipelines its statements: N logged INSERTs, one round
trip. The relay also counts the messages the worker sent by type (Parse,
Bind, Execute, Sync, Query...): a prepared statement skips its Parse.
Migrate and add connect directly; they are not counted.

Prints and writes (a list, one entry per concurrency) the totals per job, by
first keyword and by session, the round trips and messages, and the most
frequent statement shapes (literals and parameters replaced by ?).
bench/sqlcount.py counts statements on SQLite.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from devtools.pg_server import FAST, PgServer, start_private_server  # noqa: E402
from devtools.pgwire import Relay, Session  # noqa: E402

LINE = re.compile(r"\[(\d+)\] LOG:  (?:statement|execute [^:]*): (.*)")
SHAPE = re.compile(r"'(?:[^']|'')*'|\$\d+|\b\d+(?:\.\d+)?(?:e[-+]?\d+)?\b", re.IGNORECASE)
MESSAGE_NAMES = {
    "P": "Parse",
    "B": "Bind",
    "D": "Describe",
    "E": "Execute",
    "S": "Sync",
    "H": "Flush",
    "C": "Close",
    "Q": "Query",
    "X": "Terminate",
    "p": "Password/SASL",
}
"""Frontend message types by name, for the report (others keep their letter)."""


def _spoolctl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_STATE_HOME": str(cwd / "state")}
    proc = subprocess.run(
        [sys.executable, "-m", "spoolctl", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"spoolctl {args[0]}: exit {proc.returncode}: {proc.stderr[-600:]}")
    return proc


def relayed_url(url: str, relay: Relay) -> str:
    """url with the relay in place of the server, in the clear (the relay
    reads the protocol, which TLS would hide)."""
    parsed = make_url(url)
    query = {**parsed.query, "sslmode": "disable"}
    moved = parsed.set(host=relay.host, port=relay.port, query=query)
    return str(moved.render_as_string(hide_password=False))


def statements(text: str, jobs: int) -> dict[str, Any]:
    """The statements of a slice of the server's log, per job, by kind, by
    session (server process) and by shape."""
    shapes: collections.Counter[str] = collections.Counter()
    sessions: collections.Counter[str] = collections.Counter()
    for match in LINE.finditer(text):
        pid, sql = match.groups()
        sessions[pid] += 1
        shapes[SHAPE.sub("?", " ".join(sql.split()))] += 1
    total = sum(shapes.values())
    by_kind: collections.Counter[str] = collections.Counter()
    for shape, n in shapes.items():
        by_kind[shape.split(" ", 1)[0].upper()] += n
    return {
        "statements": total,
        "statements_per_job": round(total / jobs, 2),
        "by_kind_per_job": {k: round(n / jobs, 2) for k, n in by_kind.most_common()},
        "sessions": sorted(sessions.values(), reverse=True),
        "top_statements": [{"count": n, "sql": s[:200]} for s, n in shapes.most_common(20)],
    }


def round_trips(sessions: list[Session], jobs: int) -> dict[str, Any]:
    """The relay's counts: round trips per job and per connection (start-up
    and authentication apart too), and the client's messages per job."""
    if any(session.opaque for session in sessions):
        raise SystemExit("pgcount: a worker connection negotiated encryption; the relay is blind")
    total = sum(session.round_trips for session in sessions)
    messages: collections.Counter[str] = collections.Counter()
    for session in sessions:
        messages.update(session.client_messages)
    return {
        "round_trips": total,
        "round_trips_per_job": round(total / jobs, 2),
        "round_trips_by_session": sorted((s.round_trips for s in sessions), reverse=True),
        "startup_round_trips": sum(session.startup_round_trips for session in sessions),
        "client_messages_per_job": {
            MESSAGE_NAMES.get(kind, kind): round(n / jobs, 2) for kind, n in messages.most_common()
        },
    }


def count(server: PgServer, name: str, jobs: int, concurrency: int, folder: Path) -> dict[str, Any]:
    """One drain of a fresh database `name` on server, counted both ways."""
    folder.mkdir()
    url = server.create_database(name)
    _spoolctl("migrate", "--db", url, "--json", cwd=folder)
    batch = folder / "jobs.ndjson"
    batch.write_text('{"argv": ["true"]}\n' * jobs)
    _spoolctl("add", "--db", url, "--batch", str(batch), "--json", cwd=folder)
    with server.connect(autocommit=True) as admin:
        admin.execute(f"ALTER DATABASE {name} SET log_statement = 'all'")
    assert server.root is not None, "a private server: its log is in its root"
    log = Path(server.root) / "server.log"
    start = log.stat().st_size
    with Relay(server.host, server.port) as relay:
        out = _spoolctl(
            "work",
            "--db",
            relayed_url(url, relay),
            "--drain",
            "--json",
            "--concurrency",
            str(concurrency),
            cwd=folder,
        ).stdout
    with log.open("rb") as file:
        file.seek(start)
        text = file.read().decode("utf-8", "replace")
    return {
        "jobs": jobs,
        "executed": json.loads(out)["data"]["executed"],
        "concurrency": concurrency,
        **statements(text, jobs),
        **round_trips(relay.sessions, jobs),
    }


def _concurrencies(text: str) -> list[int]:
    """--concurrency 1,8: each a drain of its own, in that order."""
    try:
        levels = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma list of numbers: {text!r}") from None
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"each concurrency must be at least 1: {text!r}")
    return levels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--concurrency", type=_concurrencies, default=[1])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = start_private_server(Path(tmp), FAST)
        try:
            results = [
                count(server, f"counted{i}", args.jobs, level, Path(tmp) / f"run{i}")
                for i, level in enumerate(args.concurrency)
            ]
        finally:
            server.stop()
    text = json.dumps(results, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
