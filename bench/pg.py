"""PostgreSQL beside SQLite: the same spoolctl (ours: the work tree's .venv, or
BENCH_OURS_VENV) on both backends, interleaved A B B A in the same run, on the
same disk. The reference 0.4.11 has no PostgreSQL backend and takes no part.

- pg:drain: 1,000 due `true` jobs drained by 1, 2 and 4 `work --drain`
  processes, on PostgreSQL and on an SQLite file, the two arms of each worker
  count next to each other in every half-block (sqlite 1, pg 1, sqlite 2,
  pg 2, sqlite 4, pg 4, then back). Each PostgreSQL sample also records the
  server's commits and WAL bytes per job. After the timed blocks, one more
  (untimed, 300 jobs) PostgreSQL drain per worker count, and one with
  `--concurrency 4`, counts the server connections the workers hold
  (pg_stat_activity, sampled every 20 ms).
- pg:pickup: three idle loop-mode workers side by side, each on its own
  queue: PostgreSQL, SQLite, and PostgreSQL with SPOOLCTL_PG_NOTIFY=0
  (polling); first the idle CPU of all three (and of the server) over the
  same window, then pickup samples alternating between them A B C C B A.

The server (bench/pgserve.py) runs with fsync, synchronous_commit and
full_page_writes on, its data directory on the disk the SQLite files are on
(bench/results/.scratch). Every PostgreSQL queue is a fresh database copied
from a template made once by `spoolctl migrate` (CREATE DATABASE ... STRATEGY
FILE_COPY, which checkpoints before and after), dropped after its sample;
every SQLite queue a fresh file. Each backend's jobs write their output files
under a fresh folder on that same disk (`SPOOLCTL_SPOOL_DIR` for PostgreSQL,
the file's spool folder for SQLite).
"""

from __future__ import annotations

import contextlib
import random
import secrets
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pgserve
from filesystems import Target
from fixtures import (
    OURS,
    BenchError,
    clean_env,
    count_state,
    envelope_data,
    fresh_dir,
    percentile,
    seed,
    workdir,
)
from interleave import Arm, Records, Sample, run_blocks, spread
from pgserve import BenchServer
from plan import Plan
from workers import (
    SETTLE_S,
    START_STAMP,
    PeakRss,
    _drain_once,
    _stamp,
    _stop,
    _wait_for,
    idle_cpu,
)

WORKER_COUNTS = (1, 2, 4)
CENSUS_SETUPS = (
    ("1 worker", 1, ()),
    ("2 workers", 2, ()),
    ("4 workers", 4, ()),
    ("1 worker --concurrency 4", 1, ("--concurrency", "4")),
)
BACKENDS = ("sqlite", "pg")
CENSUS_PERIOD_S = 0.02
CENSUS_JOBS = 300
"""Jobs of each untimed drain that counts connections: enough to reach a steady state."""
POLLING = "pg, SPOOLCTL_PG_NOTIFY=0"
PICKUP_ARMS: tuple[tuple[str, str, dict[str, str]], ...] = (
    ("pg", "pg", {}),
    ("sqlite", "sqlite", {}),
    (POLLING, "pg", {"SPOOLCTL_PG_NOTIFY": "0"}),
)
"""(arm, backend, environment): the third arm is PostgreSQL without LISTEN/NOTIFY
(as behind PgBouncer in transaction pooling), waking by polling."""

_server: BenchServer | None = None


def server(disk: Target) -> BenchServer:
    """The benchmark's PostgreSQL server, started on first use (data on disk)."""
    global _server
    if _server is None:
        _server = pgserve.start(disk.root)
    return _server


def stop_server() -> None:
    global _server
    if _server is not None:
        try:
            _server.stop()
        finally:
            _templates.pop(id(_server), None)
            _server = None


def _label(n: int) -> str:
    return "1 worker" if n == 1 else f"{n} workers"


def _db_name(kind: str) -> str:
    return f"bench_{kind}_{secrets.token_hex(4)}"


def _spoolctl(argv: list[str], env: dict[str, str], cwd: Path) -> Any:
    proc = subprocess.run(
        OURS.argv(*argv),
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    return envelope_data(OURS, tuple(argv), proc.returncode, proc.stdout, proc.stderr)


def _pg_env(srv: BenchServer, spool: Path) -> dict[str, str]:
    """What a spoolctl process on PostgreSQL gets: no SPOOLCTL_* knob but the
    output folder (on the measured disk), and the passfile."""
    env = srv.client_env(clean_env())
    env["SPOOLCTL_SPOOL_DIR"] = str(spool)
    return env


_templates: dict[int, str] = {}


def _schema_template(srv: BenchServer, d: Path) -> str:
    """A database at head with no rows, made once per server by `spoolctl
    migrate` (as docs/postgresql.md says), that each queue is copied from."""
    if id(srv) not in _templates:
        name = _db_name("template")
        url = srv.create_database(name)
        _spoolctl(["migrate", "--db", url, "--json"], _pg_env(srv, d / "spool"), d)
        _templates[id(srv)] = name
    return _templates[id(srv)]


def _pg_queue(srv: BenchServer, d: Path, kind: str) -> tuple[str, str, dict[str, str]]:
    """A fresh database at head holding one queued `true` job: (name, URL, env)."""
    name = _db_name(kind)
    url = srv.create_database(name, template=_schema_template(srv, d))
    env = _pg_env(srv, d / "spool")
    try:
        _spoolctl(["add", "--db", url, "--json", "--", "true"], env, d)
    except BaseException:
        srv.drop_database(name)
        raise
    return name, url, env


def _pg_clone_queued(srv: BenchServer, name: str, total: int, due_at: float) -> None:
    """Grow the queue's one job to `total` identical queued jobs with its
    events, in SQL (as fixtures.clone_queued does for SQLite), then ANALYZE
    (a queue in use has statistics; autovacuum would otherwise gather them at
    a random moment of the drain)."""
    with srv.connect(name, autocommit=True) as conn:
        cols = _columns(conn, "jobs")
        ev_cols = _columns(conn, "job_events")
        first = conn.execute("SELECT min(id) FROM jobs").fetchone()[0]
        listed = ", ".join(f'"{c}"' for c in cols)
        ev_listed = ", ".join(f'"{c}"' for c in ev_cols)
        ev_values = ", ".join("j.id" if c == "job_id" else f'e."{c}"' for c in ev_cols)
        with conn.transaction():
            conn.execute(
                f"INSERT INTO jobs ({listed}) SELECT {listed} FROM jobs, "
                "generate_series(1, %s) AS g WHERE id = %s ORDER BY g",
                (total - 1, first),
            )
            conn.execute(
                f"INSERT INTO job_events ({ev_listed}) SELECT {ev_values} "
                "FROM job_events e JOIN jobs j ON j.id <> e.job_id "
                "WHERE e.job_id = %s ORDER BY j.id, e.id",
                (first,),
            )
            conn.execute("UPDATE jobs SET next_run_at = %s, created_at = %s", (due_at, due_at))
        conn.execute("ANALYZE")


def _columns(conn: Any, table: str) -> list[str]:
    rows = conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = %s "
        "AND column_name <> 'id' ORDER BY ordinal_position",
        (table,),
    ).fetchall()
    return [r[0] for r in rows]


def _pg_count(srv: BenchServer, name: str, state: str) -> int:
    with srv.connect(name, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM jobs WHERE state = %s", (state,)).fetchone()
        return int(row[0])


# -- drain ---------------------------------------------------------------------------------


def drain(plan: Plan, disk: Target) -> dict[str, Any]:
    srv = server(disk)
    cpu_before = srv.server_cpu_s()
    with workdir("pg-drain", disk.root) as scratch:
        arms = [
            Arm(f"{backend} {_label(n)}", _drain_arm(backend, srv, plan.drain_jobs, n, scratch))
            for n in WORKER_COUNTS
            for backend in BACKENDS
        ]
        records = run_blocks(arms, plan.drain_reps, f"pg vs sqlite drain on {disk.describe()}")
        census = {
            label: _census(srv, min(CENSUS_JOBS, plan.drain_jobs), n, extra, scratch)
            for label, n, extra in CENSUS_SETUPS
        }
    return {
        "filesystem": disk.facts(),
        "server": srv.facts,
        "jobs": plan.drain_jobs,
        "arms": {a.name: spread(records.values(a.name)) for a in arms},
        "ratios_pg_to_sqlite": {
            _label(n): spread(records.ratios(f"pg {_label(n)}", f"sqlite {_label(n)}"))
            for n in WORKER_COUNTS
        },
        "peak_rss_mb": {
            b: max(records.values(f"{b} 1 worker", "peak_rss_mb"), default=0.0) for b in BACKENDS
        },
        "server_work_per_job": {
            _label(n): {
                k: spread(records.values(f"pg {_label(n)}", f"{k}_per_job"))
                for k in ("commits", "rollbacks", "wal_bytes")
            }
            for n in WORKER_COUNTS
        },
        "connections_untimed_drain": census,
        "errors": records.errors,
        "samples": records.samples,
        "server_cpu_s": srv.server_cpu_s() - cpu_before,
        "method": "1,000 due `true` jobs, N `work --drain --json` processes started at once; "
        "jobs/s = jobs / wall time from starting them to the last one exiting. SQLite: a "
        "fresh file (workers' default synchronous=NORMAL in WAL mode). PostgreSQL: a fresh "
        "database (fsync, synchronous_commit on), made by `migrate` + `add` + an SQL copy "
        "of the job, then ANALYZE. Arms interleaved A B B A per block; ratios per pair.",
    }


def _drain_arm(
    backend: str, srv: BenchServer, jobs: int, n: int, scratch: Path
) -> Callable[[], Sample]:
    if backend == "sqlite":
        return lambda: _drain_once(OURS, jobs, n, (), scratch)
    return lambda: _pg_drain_once(srv, jobs, n, scratch)


def _pg_drain_once(
    srv: BenchServer,
    jobs: int,
    workers: int,
    scratch: Path,
    census: Census | None = None,
    extra: tuple[str, ...] = (),
) -> Sample:
    """As workers._drain_once, on a fresh PostgreSQL database."""
    d = fresh_dir("drain-pg", scratch)
    name, url, env = _pg_queue(srv, d, "drain")
    try:
        _pg_clone_queued(srv, name, jobs, time.time())
        before = _server_counters(srv, name)
        argv = OURS.argv("work", "--db", url, "--drain", "--json", *extra)
        logs = [(d / f"out{i}", d / f"err{i}") for i in range(workers)]
        with contextlib.ExitStack() as files:
            if census is not None:
                files.enter_context(census)
            start = time.perf_counter()
            procs = [
                subprocess.Popen(
                    argv,
                    cwd=d,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=files.enter_context(out.open("w")),
                    stderr=files.enter_context(err.open("w")),
                )
                for out, err in logs
            ]
            sampler = PeakRss(procs[0].pid)
            sampler.start()
            codes = [p.wait(timeout=600) for p in procs]
            wall = time.perf_counter() - start
        sampler.done.set()
        sampler.join()
        executed = sum(
            envelope_data(OURS, tuple(argv[1:]), code, out.read_text(), err.read_text())["executed"]
            for code, (out, err) in zip(codes, logs, strict=True)
        )
        done = _pg_count(srv, name, "done")
        after = _server_counters(srv, name)
    finally:
        srv.drop_database(name)
    if done != jobs:
        raise BenchError(f"pg: drain left {jobs - done} of {jobs} jobs not done")
    return {
        "value": jobs / wall,
        "wall_s": wall,
        "executed": executed,
        "peak_rss_mb": max(sampler.max_rss, sampler.hwm) / 2**20,
        **{f"{k}_per_job": (after[k] - before[k]) / jobs for k in before},
    }


def _server_counters(srv: BenchServer, name: str) -> dict[str, float]:
    """Commits, rollbacks and WAL bytes so far (the database's, the server's
    WAL), to tell how much work a drain asked of the server. The counts of
    backends that have exited are complete; they include the few statements
    of this query's own connection."""
    with srv.connect(autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit, xact_rollback, "
            "pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::float8 "
            "FROM pg_stat_database WHERE datname = %s",
            (name,),
        ).fetchone()
    return {"commits": float(row[0]), "rollbacks": float(row[1]), "wal_bytes": float(row[2])}


class Census:
    """Samples, every 20 ms while in use, how many server connections each
    application_name holds (all databases but the sampler's own)."""

    def __init__(self, srv: BenchServer) -> None:
        self.srv = srv
        self.max_by_app: dict[str, int] = {}
        self.max_total = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Census:
        self._conn = self.srv.connect(autocommit=True, application_name="spoolbench-census")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._conn.close()

    def _run(self) -> None:
        query = (
            "SELECT application_name, count(*) FROM pg_stat_activity "
            "WHERE backend_type = 'client backend' AND application_name LIKE 'spoolctl%' "
            "AND application_name <> 'spoolctl-test-admin' GROUP BY 1"
        )
        while not self._stop.is_set():
            counts = dict(self._conn.execute(query).fetchall())
            self.samples += 1
            for app, count in counts.items():
                self.max_by_app[app] = max(self.max_by_app.get(app, 0), int(count))
            self.max_total = max(self.max_total, sum(int(c) for c in counts.values()))
            self._stop.wait(CENSUS_PERIOD_S)


def _census(
    srv: BenchServer, jobs: int, n: int, extra: tuple[str, ...], scratch: Path
) -> dict[str, Any]:
    """One more PostgreSQL drain, not timed, counting the connections held."""
    census = Census(srv)
    try:
        _pg_drain_once(srv, jobs, n, scratch, census, extra)
    except BenchError as exc:
        return {"error": str(exc)}
    return {
        "workers": n,
        "options": list(extra),
        "max_by_application_name": census.max_by_app,
        "max_total": census.max_total,
        "samples": census.samples,
    }


# -- pickup --------------------------------------------------------------------------------


class IdleWorker:
    """A loop-mode `spoolctl work` on its own queue (PostgreSQL or SQLite),
    and the pickup samples taken from it."""

    def __init__(
        self, backend: str, d: Path, srv: BenchServer, more_env: dict[str, str] | None = None
    ) -> None:
        self.backend, self.d, self.srv = backend, d, srv
        self.taken = 0
        self.stop_code: int | None = None
        self.db_name: str | None = None
        if backend == "pg":
            self.db_name, self.db, self.env = _pg_queue(srv, d, "pickup")
            self._pg = srv.connect(self.db_name, autocommit=True)
        else:
            self.db, self.env = str(d / "q.db"), clean_env()
            seed(OURS, Path(self.db), d)
        self.env.update(more_env or {})
        self.proc = subprocess.Popen(
            OURS.argv("work", "--db", self.db, "--json"),
            cwd=d,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=(d / "out").open("w"),
            stderr=(d / "err").open("w"),
        )
        _wait_for(lambda: self.count("done") == 1, f"{backend}: the seed job", self.proc)

    def count(self, state: str) -> int:
        if self.backend == "pg":
            row = self._pg.execute("SELECT count(*) FROM jobs WHERE state = %s", (state,))
            return int(row.fetchone()[0])
        return count_state(Path(self.db), state)

    def claimed_at(self, job_id: int) -> float:
        """The attempt's claim time as stored: the server's clock on PostgreSQL
        (here the same machine's, through spoolctl's sampled offset), this
        machine's on SQLite."""
        sql = "SELECT started_at FROM attempts WHERE job_id = {p} ORDER BY attempt_no LIMIT 1"
        if self.backend == "pg":
            return float(self._pg.execute(sql.format(p="%s"), (job_id,)).fetchone()[0])
        with contextlib.closing(sqlite3.connect(self.db, timeout=30)) as conn:
            return float(conn.execute(sql.format(p="?"), (job_id,)).fetchone()[0])

    def next_sample(self) -> Sample:
        self.taken += 1
        marker = self.d / f"started-{self.taken}"
        argv = ["add", "--db", self.db, "--json", "--", "bash", "-c", START_STAMP + str(marker)]
        proc = subprocess.run(
            OURS.argv(*argv),
            cwd=self.d,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
            check=False,
        )
        returned = time.time()
        data = envelope_data(OURS, tuple(argv), proc.returncode, proc.stdout, proc.stderr)
        _wait_for(lambda: _stamp(marker) is not None, f"job {self.taken} to start", self.proc)
        started = _stamp(marker)
        assert started is not None
        claimed = self.claimed_at(int(data["job_id"]))
        time.sleep(_gap.uniform(0.05, 0.3))  # random phase against any poll period
        return {
            "value": (started - returned) * 1000,
            "from_submit_ms": (started - float(data["next_run_at"])) * 1000,
            "claim_ms": (claimed - returned) * 1000,
        }

    def connections(self) -> dict[str, int]:
        if self.backend != "pg":
            return {}
        rows = self._pg.execute(
            "SELECT application_name, count(*) FROM pg_stat_activity WHERE datname = %s "
            "AND pid <> pg_backend_pid() GROUP BY 1",
            (self.db_name,),
        ).fetchall()
        return {str(app): int(n) for app, n in rows}

    def stop(self) -> None:
        self.stop_code = _stop(self.proc)
        if self.db_name is not None:
            self._pg.close()
            self.srv.drop_database(self.db_name)


_gap = random.Random(7)


def pickup(plan: Plan, disk: Target) -> dict[str, Any]:
    srv = server(disk)
    cpu_before = srv.server_cpu_s()
    with contextlib.ExitStack() as stack:
        running: dict[str, IdleWorker] = {}
        for arm, backend, more_env in PICKUP_ARMS:
            d = stack.enter_context(workdir(f"pickup-{backend}", disk.root))
            running[arm] = IdleWorker(backend, d, srv, more_env)
            stack.callback(running[arm].stop)
        time.sleep(SETTLE_S)
        connections = running["pg"].connections()
        server_idle_before = srv.server_cpu_s()
        idle = idle_cpu({b: w.proc.pid for b, w in running.items()}, plan.idle_s)
        server_idle = srv.server_cpu_s() - server_idle_before
        arms = [Arm(b, w.next_sample) for b, w in running.items()]
        records = run_blocks(
            arms, -(-plan.pickup_samples // 2), f"pg vs sqlite pickup on {disk.describe()}"
        )
    return {
        "filesystem": disk.facts(),
        "server": srv.facts,
        "idle_cpu_pct_of_core": idle,
        "idle_server_cpu_pct_of_core": 100.0 * server_idle / plan.idle_s,
        "idle_window_s": plan.idle_s,
        "idle_worker_connections": connections,
        "arms": {b: _latency(records, b) for b in running},
        "ratios_pg_to_sqlite": spread(records.ratios("pg", "sqlite")),
        "errors": records.errors,
        "worker_exit_code_after_sigterm": {b: w.stop_code for b, w in running.items()},
        "samples": records.samples,
        "server_cpu_s": srv.server_cpu_s() - cpu_before,
        "method": "as bench/workers.py pickup: the job runs bash -c 'printf %s "
        '"$EPOCHREALTIME" > FILE\'; pickup = that stamp - time.time() right after the '
        "`add` process exited; from_submit = stamp - the submit time `add` stamped inside its "
        "transaction; claim = the attempt's stored claim time - the same `add` exit (no spawn; "
        "negative when the worker claimed before `add` finished exiting).",
    }


def _latency(records: Records, arm: str) -> dict[str, Any]:
    ms = records.values(arm)
    if not ms:
        return {"n": 0}
    out = {**spread(ms), "p50_ms": percentile(ms, 50), "p95_ms": percentile(ms, 95)}
    for key in ("from_submit_ms", "claim_ms"):
        values = records.values(arm, key)
        stem = key.removesuffix("_ms")
        out[f"{stem}_p50_ms"] = percentile(values, 50)
        out[f"{stem}_p95_ms"] = percentile(values, 95)
    return out


# -- report --------------------------------------------------------------------------------

COLUMNS = ("metric", "PostgreSQL", "SQLite", "pg/sqlite (pairs)", "target", "")


def rows(results: dict[str, Any]) -> list[list[str]]:
    out: list[list[str]] = []
    d = results.get("pg:drain")
    if d is not None:
        out += _drain_rows(d)
    p = results.get("pg:pickup")
    if p is not None:
        out += _pickup_rows(p)
    return out


def _cell(s: dict[str, Any], fmt: str = ".0f") -> str:
    if not s or not s.get("n"):
        return "-"
    return f"{s['median']:{fmt}} [{s['min']:{fmt}}..{s['max']:{fmt}}]"


def _ratio(s: dict[str, Any]) -> str:
    if not s or not s.get("n"):
        return ""
    return f"{s['median']:.2f}x [{s['min']:.2f}..{s['max']:.2f}]"


def _drain_rows(d: dict[str, Any]) -> list[list[str]]:
    if "error" in d:
        return [[f"pg:drain: {d['error'][:100]}", "ERROR", "", "", "", ""]]
    fs = d["filesystem"]
    pgfs = d["server"]["data_directory_filesystem"]
    out = [
        [
            f"== drain: SQLite file on {fs['fstype']} {fs['mount_point']}, PostgreSQL data on "
            f"{pgfs['fstype']} {pgfs['mount_point']}",
            "",
            "",
            "",
            "",
            "",
        ],
    ]
    for n in WORKER_COUNTS:
        label = _label(n)
        out.append(
            [
                f"work --drain {d['jobs']:,} true, {label}: jobs/s",
                _cell(d["arms"].get(f"pg {label}", {})),
                _cell(d["arms"].get(f"sqlite {label}", {})),
                _ratio(d["ratios_pg_to_sqlite"].get(label, {})),
                "reported beside SQLite" if n > 1 else "",
                "",
            ]
        )
    for label, work in d.get("server_work_per_job", {}).items():
        commits, wal = work["commits"], work["wal_bytes"]
        if commits.get("n"):
            out.append(
                [
                    f"  server, {label}: commits / WAL bytes per job",
                    f"{commits['median']:.1f} / {wal['median']:.0f}",
                    "",
                    "",
                    "",
                    "",
                ]
            )
    rss = d["peak_rss_mb"]
    out.append(
        ["worker peak RSS, 1 worker: MB", f"{rss['pg']:.1f}", f"{rss['sqlite']:.1f}", "", "", ""]
    )
    for label, c in d.get("connections_untimed_drain", {}).items():
        if "error" in c:
            continue
        by_app = ", ".join(f"{k} {v}" for k, v in sorted(c["max_by_application_name"].items()))
        out.append(
            [
                f"server connections held, {label} (max; untimed drain)",
                f"{c['max_total']} ({by_app})",
                "",
                "",
                "",
                "",
            ]
        )
    out += [
        [f"pg:drain / {arm}: {text[:90]}", "ERROR", "", "", "", ""]
        for arm, text in d.get("errors", {}).items()
    ]
    return out


def _pickup_rows(p: dict[str, Any]) -> list[list[str]]:
    if "error" in p:
        return [[f"pg:pickup: {p['error'][:100]}", "ERROR", "", "", "", ""]]
    pg, sq = p["arms"]["pg"], p["arms"]["sqlite"]
    out = [
        ["== idle worker, pickup (PostgreSQL and SQLite workers side by side)", "", "", "", "", ""]
    ]
    checks: list[tuple[str, str, str, Callable[[float], bool] | None]] = [
        ("pickup latency p50: ms", "p50_ms", "<= 25 ms", lambda v: v <= 25),
        ("pickup latency p95: ms", "p95_ms", "<= 100 ms", lambda v: v <= 100),
        ("job start - submit time, p50: ms", "from_submit_p50_ms", "", None),
        ("job start - submit time, p95: ms", "from_submit_p95_ms", "", None),
        ("claim (stored time) - add exit, p50: ms", "claim_p50_ms", "", None),
        ("claim (stored time) - add exit, p95: ms", "claim_p95_ms", "", None),
    ]
    for metric, key, target, ok in checks:
        if key not in pg or key not in sq:
            continue
        out.append(
            [
                metric,
                f"{pg[key]:.1f}",
                f"{sq[key]:.1f}",
                _ratio(p["ratios_pg_to_sqlite"]) if key == "p50_ms" else "",
                target,
                "" if ok is None else ("met" if ok(pg[key]) else "MISSED"),
            ]
        )
    poll = p["arms"].get(POLLING, {})
    if poll.get("n"):
        out.append(
            [
                f"pickup p50 / p95, {POLLING} (polling): ms",
                f"{poll['p50_ms']:.1f} / {poll['p95_ms']:.1f}",
                "",
                "",
                "",
                "",
            ]
        )
    idle = p["idle_cpu_pct_of_core"]
    polling_cpu = f", polling {idle[POLLING]:.2f}" if POLLING in idle else ""
    out.append(
        [
            f"idle worker CPU, same {p['idle_window_s']:.0f} s window: % of a core",
            f"{idle['pg']:.2f}{polling_cpu} (+ server {p['idle_server_cpu_pct_of_core']:.2f})",
            f"{idle['sqlite']:.2f}",
            "",
            "< 1 %",
            "",
        ]
    )
    conns = ", ".join(f"{k} {v}" for k, v in sorted(p["idle_worker_connections"].items()))
    out.append(["idle worker (LISTEN on): server connections held", conns, "", "", "", ""])
    out += [
        [f"pg:pickup / {arm}: {text[:90]}", "ERROR", "", "", "", ""]
        for arm, text in p.get("errors", {}).items()
    ]
    return out


def render(table: list[list[str]], results: dict[str, Any]) -> str:
    if not table:
        return ""
    widths = [max([len(COLUMNS[i]), *(len(r[i]) for r in table)]) for i in range(len(COLUMNS))]
    line = "  ".join("{:" + str(w) + "}" for w in widths)
    text = ["", line.format(*COLUMNS), line.format(*("-" * w for w in widths))]
    text += [line.format(*r).rstrip() for r in table]
    srv = next(
        (r["server"] for r in results.values() if isinstance(r, dict) and "server" in r), None
    )
    if srv is not None:
        s = srv["settings"]
        fs = srv["data_directory_filesystem"]
        text.append(
            f"PostgreSQL {s['server_version']}: fsync={s['fsync']}, synchronous_commit="
            f"{s['synchronous_commit']}, full_page_writes={s['full_page_writes']}, "
            f"wal_sync_method={s['wal_sync_method']}, shared_buffers={s['shared_buffers']}; "
            f"data directory on {fs['fstype']} {fs['mount_point']} ({fs['device']}), "
            f"server on 127.0.0.1 (same machine). SQLite workers: WAL, synchronous=NORMAL "
            f"(spoolctl's default; `add` commits with FULL)."
        )
    return "\n".join(text)
