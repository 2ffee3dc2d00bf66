"""The spawn record: a running attempt's job pid, process group, start
time and cgroup, written on its attempt row so that a reaper can later end
an orphaned group after checking it is still the same process
(`runner/supervise.py` reads them from the process it started)."""

from __future__ import annotations

from sqlalchemy import Connection, bindparam, update

from spoolctl.db.prepared import Prepared
from spoolctl.db.tables import attempts

_RECORD_SPAWN = Prepared(
    update(attempts)
    .where(attempts.c.id == bindparam("b_id"))
    .values(
        job_pid=bindparam("b_pid"),
        job_pgid=bindparam("b_pid"),
        job_started_at=bindparam("b_started"),
    )
)
_RECORD_CONTAINED = Prepared(
    update(attempts)
    .where(attempts.c.id == bindparam("b_id"))
    .values(
        job_pid=bindparam("b_pid"),
        job_pgid=bindparam("b_pid"),
        job_started_at=bindparam("b_started"),
        cgroup=bindparam("b_cgroup"),
    )
)
"""The same with the attempt's cgroup, for one its worker contained."""


def record(
    conn: Connection, attempt_id: int, pid: int, started_at: float, cgroup: str | None
) -> None:
    """Store the job's pid (which leads its process group), its start time and,
    where its worker contained it, its cgroup on the attempt."""
    params = {"b_id": attempt_id, "b_pid": pid, "b_started": started_at}
    if cgroup is None:
        _RECORD_SPAWN.execute(conn, params)
        return
    _RECORD_CONTAINED.execute(conn, {**params, "b_cgroup": cgroup})
