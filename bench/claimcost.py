"""Time one claim in-process, many times, without consuming the queue.

Run under the interpreter of the implementation measured (ours: .venv, the
reference: bench/.venv-ref), with a queue file holding one due job:

    python bench/claimcost.py ours|ref DB REPS

Each sample is one whole claim transaction as a worker runs it (BEGIN
IMMEDIATE, the implementation's own claim function: select, update, attempt
insert, event, COMMIT). After each sample, untimed, the claim is undone with
plain SQL (attempt and `claimed` event deleted, job back to queued), so the
same job is claimable again and the table does not change. Prints a JSON list
of seconds per claim.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


def ours(db: Path, reps: int) -> list[float]:
    from spoolctl.db.backends import sqlite_at
    from spoolctl.db.queue import open_for_write
    from spoolctl.services.claim import Claimant, claim_up_to

    queue_file = open_for_write(sqlite_at(db))
    claimant = Claimant("bench-claim", os.getpid(), "default", queue_file.output_root)
    samples = []
    with queue_file.engine.connect() as conn, _undoer(db) as undo:
        for _ in range(reps):
            start = time.perf_counter()
            with conn.begin():
                claims = claim_up_to(conn, claimant, 1, time.time())
            claim = claims[0] if claims else None
            samples.append(time.perf_counter() - start)
            if claim is None:
                raise SystemExit("claimcost: no due job to claim")
            undo(claim.job_id, claim.attempt_id)
    return samples


def ref(db: Path, reps: int) -> list[float]:
    from spoolctl import store

    conn = store.connect(str(db))
    out_root = str(db.parent / "output")
    samples = []
    with _undoer(db) as undo:
        for _ in range(reps):
            start = time.perf_counter()
            claim = store.claim_next(conn, "bench-claim", os.getpid(), time.time(), out_root)
            samples.append(time.perf_counter() - start)
            if claim is None:
                raise SystemExit("claimcost: no due job to claim")
            undo(claim[0].id, claim[1].id)
    return samples


@contextmanager
def _undoer(db: Path) -> Iterator[Callable[[int, int], None]]:
    """Put a claimed job back exactly as it was (both schemas share these names)."""
    conn = sqlite3.connect(db, timeout=30, isolation_level=None)

    def undo(job_id: int, attempt_id: int) -> None:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("DELETE FROM job_events WHERE job_id = ? AND event = 'claimed'", (job_id,))
        conn.execute("DELETE FROM attempts WHERE id = ?", (attempt_id,))
        conn.execute(
            "UPDATE jobs SET state = 'queued', locked_by = NULL, locked_pid = NULL,"
            " locked_at = NULL, heartbeat_at = NULL, started_at = NULL WHERE id = ?",
            (job_id,),
        )
        conn.execute("COMMIT")

    try:
        yield undo
    finally:
        conn.close()


def main() -> None:
    impl, db, reps = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    measure = {"ours": ours, "ref": ref}[impl]
    print(json.dumps(measure(db, reps)))


if __name__ == "__main__":
    main()
