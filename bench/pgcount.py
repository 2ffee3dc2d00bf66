"""Statements and round trips per job on PostgreSQL, counted by the server.

    .venv/bin/python bench/pgcount.py [--jobs 200] [--concurrency 1] [--out FILE.json]

Starts a private server (devtools' FAST profile: what is counted does not
depend on fsync), makes a queue with `spoolctl migrate`, adds JOBS `true`
jobs, turns on `log_statement = all` for that database only, and drains it
with one `spoolctl work --drain`. Every statement the server ran for the
worker's sessions (the worker's own and its lease guard's) is then read from
the server's log. Without pipeline mode each logged statement is one round
trip between the worker and the server (BEGIN and COMMIT included: psycopg
sends each on its own), so the count per job is the round trips per job.
Prints and writes the totals per job, by first keyword and by session, and
the most frequent statement shapes (literals and parameters replaced by ?).
bench/sqlcount.py counts the same on SQLite.
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from devtools.pg_server import FAST, start_private_server  # noqa: E402

LINE = re.compile(r"\[(\d+)\] LOG:  (?:statement|execute [^:]*): (.*)")
SHAPE = re.compile(r"'(?:[^']|'')*'|\$\d+|\b\d+(?:\.\d+)?(?:e[-+]?\d+)?\b", re.IGNORECASE)


def _spoolctl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_STATE_HOME": str(cwd / "state")}
    proc = subprocess.run([sys.executable, "-m", "spoolctl", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, check=False)  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"spoolctl {args[0]}: exit {proc.returncode}: {proc.stderr[-600:]}")
    return proc


def count(jobs: int, concurrency: int, folder: Path) -> dict[str, Any]:
    server = start_private_server(folder, FAST)
    try:
        url = server.create_database("counted")
        _spoolctl("migrate", "--db", url, "--json", cwd=folder)
        batch = folder / "jobs.ndjson"
        batch.write_text('{"argv": ["true"]}\n' * jobs)
        _spoolctl("add", "--db", url, "--batch", str(batch), "--json", cwd=folder)
        with server.connect(autocommit=True) as admin:
            admin.execute("ALTER DATABASE counted SET log_statement = 'all'")
        log = Path(server.root) / "server.log"
        start = log.stat().st_size
        out = _spoolctl("work", "--db", url, "--drain", "--json",
                        "--concurrency", str(concurrency), cwd=folder).stdout  # fmt: skip
        executed = json.loads(out)["data"]["executed"]
        with log.open("rb") as file:
            file.seek(start)
            text = file.read().decode("utf-8", "replace")
    finally:
        server.stop()
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
        "jobs": jobs,
        "executed": executed,
        "concurrency": concurrency,
        "statements": total,
        "statements_per_job": round(total / jobs, 2),
        "by_kind_per_job": {k: round(n / jobs, 2) for k, n in by_kind.most_common()},
        "sessions": sorted(sessions.values(), reverse=True),
        "top_statements": [{"count": n, "sql": s[:200]} for s, n in shapes.most_common(20)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = count(args.jobs, args.concurrency, Path(tmp))
    text = json.dumps(result, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
