"""The worker: reap -> claim -> execute -> record, for one lane of a queue.

One process runs up to `concurrency` attempts at once from a single-threaded
loop (`loop.py`): children are watched through pidfds, new work is noticed
through the queue's change watch (its driver's: SQLite's `PRAGMA
data_version`, PostgreSQL's LISTEN/NOTIFY), and heartbeats, timeouts and
signals are handled between waits. No transaction is open while a child
runs; every transaction is short, and takes the backend's write lock as it
opens.

- `shift.py`: what the parts share (the queue, the worker's identity, what
  runs now, the report, the write backoff).
- `settle.py`: recording ended attempts and claiming the next, one
  transaction per pass; spawning what was claimed.
- `duties.py`: the periodic duties (heartbeat, the lease fence, the reap
  pass, spawn records, output passes), each with `due_at()` and `run()`:
  the loop waits for the earliest.
- `reaping.py`: judging and reaping other workers' stale jobs.
- `report.py`: the options a worker runs with and what it reports.

The loop never stalls: a write that cannot get the lock within a short
slice, or finds the disk full or the server gone, is retried with bounded
backoff while timeouts, signals and group kills go on. A worker whose
heartbeats have not landed for half the hang threshold kills its jobs and
claims nothing (`services/lease.py`). A worker started while the server
cannot be reached waits for it before it registers (`db/outage.py`).
"""

from spoolctl.worker.loop import Worker
from spoolctl.worker.report import AttemptResult, Mode, WorkerOptions, WorkReport, default_worker_id

__all__ = ["AttemptResult", "Mode", "WorkReport", "Worker", "WorkerOptions", "default_worker_id"]
