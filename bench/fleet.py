"""A fleet on PostgreSQL beside the same fleet on SQLite.

- fleet:drain: K `work --drain --concurrency C` processes (K = 1, 2, 4, 8;
  C = 8) over due jobs of `sleep 0.05`, so that the spawn's CPU does not hide
  the database: the ideal is K·C/0.05 jobs/s. PostgreSQL and SQLite arms of
  each K next to each other, A B B A. Reported: jobs/s, the fraction of the
  ideal, and PostgreSQL / SQLite per pair.
- fleet:db: the capacity a larger fleet would see, without a process
  spawned: N clients (1, 2, 4, 8, 16, 32 processes), each running the real
  claim and outcome code (`services.settle.settle`, a worker's pass) in a loop of
  write transactions that each record the previous claims' successes and
  claim as many again, as a worker's settle pass does: one job per
  transaction (a worker with one slot), and SLOTS per transaction (a worker
  whose slots all ended in one pass). jobs/s over a fixed window, both backends interleaved.

Each sample is a fresh queue (a database copied from the template, or a
fresh file) filled with enough due jobs for the sample.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import harness
import pg
from backends import Backend
from filesystems import Target
from fixtures import OURS, BenchError, fresh_dir, workdir
from interleave import Arm, Sample, run_blocks, spread
from plan import Plan

FLEET_SIZES = (1, 2, 4, 8)
SLOTS = 8
JOB_S = 0.05
DB_CLIENTS = (1, 2, 4, 8, 16, 32)
DB_BATCHES = (1, SLOTS)
"""Jobs each database-only transaction records and claims."""
DB_WINDOW_S = 2.0
DB_FILL = 40_000
"""Due jobs in each database-only queue: more than one SQLite writer claims in the window."""
DB_START_DELAY_S = 0.5
"""Once every client has imported and connected, all begin this much later."""
HERE = Path(__file__).resolve().parent


def _ideal(k: int) -> float:
    return k * SLOTS / JOB_S


def _jobs_for(k: int, quick: bool) -> int:
    """About 1.5 s of jobs at the ideal rate (3 s in a full run), at least 200."""
    return max(200, int(_ideal(k) * (1.5 if quick else 3.0)))


def drain(plan: Plan, disk: Target) -> dict[str, Any]:
    by_name, srv = pg._backends(disk), pg.server(disk)
    quick = plan.drain_reps <= 1
    cpu_before = srv.server_cpu_s()
    with workdir("fleet-drain", disk.root) as scratch:
        arms = [
            Arm(f"{b} {k}x{SLOTS}", _drain_arm(by_name[b], _jobs_for(k, quick), k, scratch))
            for k in FLEET_SIZES
            for b in pg.BACKENDS
        ]
        records = run_blocks(arms, plan.drain_reps, f"fleet drain on {disk.describe()}")
    return {
        "filesystem": disk.facts(),
        "server": srv.facts,
        "arms": {a.name: spread(records.values(a.name)) for a in arms},
        "fraction_of_ideal": {
            name: spread([v / _ideal(k) for v in records.values(name)])
            for k in FLEET_SIZES
            for name in (f"{b} {k}x{SLOTS}" for b in pg.BACKENDS)
        },
        "ratios_pg_to_sqlite": {
            k: spread(records.ratios(f"pg {k}x{SLOTS}", f"sqlite {k}x{SLOTS}")) for k in FLEET_SIZES
        },
        "errors": records.errors,
        "samples": records.samples,
        "server_cpu_s": srv.server_cpu_s() - cpu_before,
        "method": f"K `work --drain --concurrency {SLOTS}` processes started at once over due "
        f"`sleep {JOB_S}` jobs (about 1.5 s of them at the ideal K*{SLOTS}/{JOB_S} jobs/s in a "
        "quick run, 3 s in a full one); jobs/s = jobs / wall time to the last exit. Arms "
        "interleaved A B B A; ratios per pair.",
    }


def _drain_arm(backend: Backend, jobs: int, k: int, scratch: Path) -> Callable[[], Sample]:
    return lambda: harness.drain_once(
        backend,
        OURS,
        scratch,
        jobs=jobs,
        workers=k,
        extra=("--concurrency", str(SLOTS)),
        job=("sleep", str(JOB_S)),
    )


# -- report ---------------------------------------------------------------------------------


def rows(results: dict[str, Any]) -> list[list[str]]:
    """Table rows (pg.COLUMNS) of whichever fleet scenarios ran."""
    out: list[list[str]] = []
    d = results.get("fleet:drain")
    if d is not None and "error" not in d:
        out.append([f"== fleet: K workers x {SLOTS} slots of sleep {JOB_S}", "", "", "", "", ""])
        for k in FLEET_SIZES:
            name = f"{k}x{SLOTS}"
            pg_frac = d["fraction_of_ideal"].get(f"pg {name}", {})
            sq_frac = d["fraction_of_ideal"].get(f"sqlite {name}", {})
            fractions = (
                f" ({pg_frac['median']:.2f} / {sq_frac['median']:.2f} of ideal)"
                if pg_frac.get("n") and sq_frac.get("n")
                else ""
            )
            out.append(
                [
                    f"fleet {k} worker(s) x {SLOTS}: jobs/s{fractions}",
                    pg._cell(d["arms"].get(f"pg {name}", {})),
                    pg._cell(d["arms"].get(f"sqlite {name}", {})),
                    pg._ratio(d["ratios_pg_to_sqlite"].get(k, {})),
                    ">= 0.5 of ideal, >= 0.9x" if k == 4 else "never falls as K grows",
                    "",
                ]
            )
        for k in FLEET_SIZES:
            out.append(
                [
                    f"  fleet {k} x {SLOTS}: CPU per job (workers and jobs + server)",
                    *(_drain_cpu(d, f"{b} {k}x{SLOTS}") for b in ("pg", "sqlite")),
                    "",
                    "",
                    "",
                ]
            )
    elif d is not None:
        out.append([f"fleet:drain: {d['error'][:100]}", "ERROR", "", "", "", ""])
    b = results.get("fleet:db")
    if b is not None and "error" not in b:
        for batch in DB_BATCHES:
            out += _db_rows(b, batch)
    elif b is not None:
        out.append([f"fleet:db: {b['error'][:100]}", "ERROR", "", "", "", ""])
    for name in ("fleet:drain", "fleet:db"):
        for arm, text in (results.get(name) or {}).get("errors", {}).items():
            out.append([f"{name} / {arm}: {text[:90]}", "ERROR", "", "", "", ""])
    return out


def _drain_cpu(d: dict[str, Any], arm: str) -> str:
    """The arm's mean CPU per job: its workers with their jobs, and the server."""
    found = [x for x in d["samples"] if x.get("arm") == arm and "workers_cpu_ms_per_job" in x]
    if not found:
        return "-"
    workers = sum(x["workers_cpu_ms_per_job"] for x in found) / len(found)
    server = sum(x.get("server_cpu_ms_per_job", 0.0) for x in found) / len(found)
    return f"{workers:.2f} + {server:.2f} ms"


def _db_rows(b: dict[str, Any], batch: int) -> list[list[str]]:
    """The database-only rows of one batch size: jobs/s, CPU per job, growth."""
    out = [
        [
            f"== database only (claim + outcome, no spawn), {batch} job(s) per transaction",
            "",
            "",
            "",
            "",
            "",
        ]
    ]
    for n in DB_CLIENTS:
        pg_cell, sqlite_cell = (
            pg._cell(b["arms"].get(_db_name(x, n, batch), {})) for x in ("pg", "sqlite")
        )
        out.append([f"db-only {n} clients: jobs/s", pg_cell, sqlite_cell, "", "", ""])
    for n in DB_CLIENTS:
        cells = []
        for backend_name in ("pg", "sqlite"):  # the table's columns, in their order
            name = _db_name(backend_name, n, batch)
            arm = [x for x in b["samples"] if x.get("arm") == name]
            if not arm or "client_cpu_ms_per_job" not in arm[0]:
                cells.append("-")
                continue
            client = sum(x["client_cpu_ms_per_job"] for x in arm) / len(arm)
            server = sum(x["server_cpu_ms_per_job"] for x in arm) / len(arm)
            busy = sum(x["cores_busy"] for x in arm) / len(arm)
            cells.append(f"{client:.2f} + {server:.2f} ms; {busy:.1f} cores")
        out.append([f"  db-only {n} clients: CPU per job (clients + server)", *cells, "", "", ""])
    growth = b["growth_1_to_16" if batch == 1 else "growth_1_to_16_batched"]
    out.append(
        [
            "db-only growth, 16 clients / 1",
            _times(growth.get("pg")),
            _times(growth.get("sqlite")),
            "",
            ">= 5x (PostgreSQL)",
            "",
        ]
    )
    return out


def _times(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}x"


# -- the database alone ----------------------------------------------------------------------


def database_only(plan: Plan, disk: Target) -> dict[str, Any]:
    by_name, srv = pg._backends(disk), pg.server(disk)
    cpu_before = srv.server_cpu_s()
    with workdir("fleet-db", disk.root) as scratch:
        arms = [
            Arm(_db_name(b, n, batch), _db_arm(by_name[b], n, batch, scratch))
            for batch in DB_BATCHES
            for n in DB_CLIENTS
            for b in pg.BACKENDS
        ]
        records = run_blocks(arms, plan.drain_reps, f"fleet database-only on {disk.describe()}")
    arms_out = {a.name: spread(records.values(a.name)) for a in arms}
    return {
        "filesystem": disk.facts(),
        "server": srv.facts,
        "arms": arms_out,
        "growth_1_to_16": {
            b: _growth(arms_out, _db_name(b, 1, 1), _db_name(b, 16, 1)) for b in pg.BACKENDS
        },
        "growth_1_to_16_batched": {
            b: _growth(arms_out, _db_name(b, 1, SLOTS), _db_name(b, 16, SLOTS)) for b in pg.BACKENDS
        },
        "errors": records.errors,
        "samples": records.samples,
        "server_cpu_s": srv.server_cpu_s() - cpu_before,
        "method": f"N client processes, each in a loop of write transactions that record its "
        "previous claims as done and claim as many again (a worker's pass: settle), "
        f"1 or {SLOTS} jobs per transaction, started together and counted over the same "
        f"{DB_WINDOW_S:g} s window; no job process is spawned.",
    }


def _growth(arms: dict[str, Any], one: str, many: str) -> float | None:
    a, b = arms.get(one, {}), arms.get(many, {})
    if not a.get("n") or not b.get("n") or not a["median"]:
        return None
    return float(b["median"] / a["median"])


def _db_name(backend: str, clients: int, batch: int) -> str:
    return f"{backend} {clients} clients" + ("" if batch == 1 else f" x{batch}")


def _db_arm(backend: Backend, clients: int, batch: int, scratch: Path) -> Callable[[], Sample]:
    def run() -> Sample:
        d = fresh_dir(f"fleetdb-{backend.name}-{clients}-{batch}", scratch)
        queue = backend.queue(OURS, d)
        try:
            queue.fill(DB_FILL, time.time())
            procs = [
                subprocess.Popen(
                    [str(OURS.python), str(HERE / "fleet.py"), "client", queue.db, str(batch)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                    env=queue.env,
                    cwd=d,
                )
                for _ in range(clients)
            ]
            for proc in procs:  # each has imported and connected: start them together
                assert proc.stdout is not None
                if proc.stdout.readline().strip() != "ready":
                    raise BenchError("a database-only client failed before its window")
            srv = getattr(backend, "srv", None)  # PostgreSQL: the server's CPU too
            server_before = 0.0 if srv is None else srv.server_cpu_s()
            start_at = time.time() + DB_START_DELAY_S
            counts, client_cpu = [], 0.0
            for proc in procs:
                assert proc.stdin is not None
                proc.stdin.write(f"{start_at}\n")
                proc.stdin.flush()
            for proc in procs:
                out, _ = proc.communicate(timeout=120)
                if proc.returncode != 0:
                    raise BenchError(f"a database-only client failed ({proc.returncode})")
                told = json.loads(out)
                counts.append(told["jobs"])
                client_cpu += told["cpu_s"]
            server_cpu = 0.0 if srv is None else srv.server_cpu_s() - server_before
        finally:
            queue.close()
        jobs = max(1, sum(counts))
        per_job_ms = 1000 * (client_cpu + server_cpu) / jobs
        return {
            "value": sum(counts) / DB_WINDOW_S,
            "per_client": counts,
            "client_cpu_ms_per_job": 1000 * client_cpu / jobs,
            "server_cpu_ms_per_job": 1000 * server_cpu / jobs,
            "cpu_bound_jobs_per_s": (os.cpu_count() or 1) * 1000 / per_job_ms,
            "cores_busy": (client_cpu + server_cpu) / DB_WINDOW_S,
        }

    return run


def client(db: str, batch: int) -> None:
    """One database-only client (run under ours' interpreter): connects, says
    `ready`, reads the window's start from stdin, then in each transaction
    records its previous `batch` claims as done and claims `batch` more until
    the window closes; prints the jobs recorded."""
    from spoolctl.db.backends import locate
    from spoolctl.db.queue import open_for_write
    from spoolctl.services.claim import Claimant
    from spoolctl.services.outcome import Ending, Outcome
    from spoolctl.services.settle import settle

    queue = open_for_write(locate(db, Path.cwd(), "bench"))
    me = f"bench-db-{os.getpid()}"
    claimant = Claimant(me, os.getpid(), "default", queue.output_root)
    done = 0
    previous: list[Any] = []
    with queue.engine.connect() as conn:
        conn.exec_driver_sql("SELECT 1").all()
        conn.rollback()
        print("ready", flush=True)
        start_at = float(sys.stdin.readline())
        time.sleep(max(0.0, start_at - time.time()))
        cpu_before = time.process_time()
        deadline = start_at + DB_WINDOW_S
        while time.time() < deadline:
            with conn.begin():
                now = time.time()
                endings = [
                    Ending(c.job_id, c.attempt_id, c.attempt_no, Outcome(0, None), os.getpid())
                    for c in previous
                ]
                # a worker's pass (services/settle.py): the outcomes and the
                # claim sent together, answered in one wait where the backend can
                settled = settle(conn, claimant, endings, batch, now)
                done += sum(1 for s in settled.states if s)
                previous = settled.claims
            if not previous:
                raise SystemExit("fleet client: the queue ran dry; fill more jobs")
    cpu_s = time.process_time() - cpu_before
    queue.dispose()
    print(json.dumps({"jobs": done, "cpu_s": cpu_s}))


if __name__ == "__main__":
    if sys.argv[1:2] == ["client"]:
        client(sys.argv[2], int(sys.argv[3]))
