"""How soon a worker delivers a control request: `requested_at` to
`settled_at` of each request, with an idle worker (one slot) running one
long sleep job, on SQLite and, with --pg, on PostgreSQL (the benchmark's
server, bench/pgserve.py).

Each request is a `signal --signal USR1 --no-wait` (the job ignores USR1),
written by a CLI process of its own; the next is written once the last is
settled, so no request waits behind another. Both times are the queue's
clock (on PostgreSQL the server's, as the worker and the CLI read it), so
the latency is the worker's wake-up, its read, its settling transaction.

    .venv/bin/python bench/steering.py [--requests 40] [--pg]

Prints p50, p95 and the maximum per backend, in milliseconds; the target is
p95 <= 100 ms (docs/steering.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PYTHON = str(REPO / ".venv" / "bin" / "python")
JOB = "trap '' USR1; sleep 600"


def spoolctl(db: str, env: dict[str, str], *args: str) -> dict[str, Any]:
    out = subprocess.run(
        [PYTHON, "-m", "spoolctl", args[0], "--db", db, "--json", *args[1:]],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    found: dict[str, Any] = json.loads(out.stdout)
    return found


Reader = Callable[[int], "tuple[float, float] | None"]
"""A request's (requested_at, settled_at), None while it waits."""
SQL = "SELECT requested_at, settled_at FROM control_requests WHERE id = {}"


def sqlite_reader(db: str) -> Reader:
    def read(request_id: int) -> tuple[float, float] | None:
        with sqlite3.connect(db) as conn:
            row = conn.execute(SQL.format("?"), (request_id,)).fetchone()
        return None if row is None or row[1] is None else (float(row[0]), float(row[1]))

    return read


def pg_reader(conn: Any) -> Reader:
    def read(request_id: int) -> tuple[float, float] | None:
        row = conn.execute(SQL.format("%s"), (request_id,)).fetchone()
        return None if row is None or row[1] is None else (float(row[0]), float(row[1]))

    return read


def measure(db: str, env: dict[str, str], requests: int, read: Reader) -> list[float]:
    job = spoolctl(db, env, "add", "--", "sh", "-c", JOB)["data"]["job_id"]
    worker = subprocess.Popen(
        [PYTHON, "-m", "spoolctl", "work", "--db", db, "--quiet"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    latencies: list[float] = []
    try:
        deadline = time.monotonic() + 60
        while spoolctl(db, env, "show", str(job))["data"]["job"]["state"] != "running":
            if time.monotonic() > deadline:
                raise SystemExit("the job did not start")
            time.sleep(0.05)
        time.sleep(1.0)  # the worker past its start-up: idle, its one job running
        for _ in range(requests):
            sent = spoolctl(db, env, "signal", str(job), "--signal", "USR1", "--no-wait")
            request_id = sent["data"]["request_id"]
            while (times := read(request_id)) is None:
                time.sleep(0.005)
            latencies.append((times[1] - times[0]) * 1000)
    finally:
        spoolctl(db, env, "cancel", str(job), "--running", "--yes", "--now")
        worker.terminate()
        worker.wait(timeout=60)
    return latencies


def report(name: str, latencies: list[float]) -> None:
    ordered = sorted(latencies)
    p95 = ordered[max(0, round(0.95 * len(ordered)) - 1)]
    print(
        f"{name}: n={len(ordered)} p50={statistics.median(ordered):.1f} ms "
        f"p95={p95:.1f} ms max={ordered[-1]:.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--pg", action="store_true", help="PostgreSQL too")
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOOLCTL_")}
    env["PYTHONPATH"] = str(REPO)
    with tempfile.TemporaryDirectory(prefix="steering-") as scratch:
        os.chmod(scratch, 0o755)  # PostgreSQL runs as user nobody: its data goes in here
        queue = str(Path(scratch) / "queue.db")
        report("sqlite", measure(queue, env, args.requests, sqlite_reader(queue)))
        if args.pg:
            sys.path.insert(0, str(REPO))
            sys.path.insert(0, str(REPO / "bench"))
            import pgserve

            server = pgserve.start(Path(scratch) / "pg")
            try:
                url = server.create_database("steering")
                with server.connect("steering", autocommit=True) as conn:
                    latencies = measure(url, server.client_env(env), args.requests, pg_reader(conn))
                report("postgresql", latencies)
            finally:
                server.stop()


if __name__ == "__main__":
    main()
