"""Run one spoolctl command line in-process and count the SQL it executes.

    python bench/sqlcount.py OUT.json work --db Q --drain --json

Every DBAPI connection SQLAlchemy opens gets a sqlite3 trace callback, which
sees each statement SQLite runs (including BEGIN/COMMIT issued by hooks and
the worker's PRAGMA data_version polls). Writes a JSON summary: totals by
first keyword and the most frequent statement shapes (literals replaced by ?).
"""

from __future__ import annotations

import collections
import contextlib
import io
import json
import re
import sqlite3
import sys
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, event

LITERALS = re.compile(r"'(?:[^']|'')*'|\b\d+(?:\.\d+)?(?:e[-+]?\d+)?\b", re.IGNORECASE)
statements: collections.Counter[str] = collections.Counter()


def _trace(sql: str) -> None:
    shape = LITERALS.sub("?", " ".join(sql.split()))
    statements[shape] += 1


@event.listens_for(Engine, "connect")
def _on_connect(dbapi_conn: sqlite3.Connection, _record: Any) -> None:
    dbapi_conn.set_trace_callback(_trace)


def main() -> None:
    out, argv = Path(sys.argv[1]), sys.argv[2:]
    from spoolctl.cli import run

    captured = io.StringIO()
    with contextlib.redirect_stdout(captured):
        code = run(argv)
    by_kind: collections.Counter[str] = collections.Counter()
    for shape, n in statements.items():
        by_kind[shape.split(" ", 1)[0].upper()] += n
    summary = {
        "argv": argv,
        "exit_code": code,
        "stdout_head": captured.getvalue()[:400],
        "total": sum(statements.values()),
        "by_kind": dict(by_kind.most_common()),
        "top_statements": [{"count": n, "sql": s[:240]} for s, n in statements.most_common(25)],
    }
    out.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
