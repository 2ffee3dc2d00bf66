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
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import harness
import pgserve
from backends import SQLITE, Backend, PgBackend
from filesystems import Target
from fixtures import OURS, BenchError, workdir
from interleave import Arm, Sample, run_blocks, spread
from pgserve import BenchServer
from plan import Plan

WORKER_COUNTS = (1, 2, 4)
CENSUS_SETUPS = (
    ("1 worker", 1, ()),
    ("2 workers", 2, ()),
    ("4 workers", 4, ()),
    ("1 worker --concurrency 4", 1, ("--concurrency", "4")),
)
BACKENDS = (SQLITE.name, PgBackend.name)
"""The arms' backends, by name, in the order their arms run."""
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
_backend: PgBackend | None = None


def server(disk: Target) -> BenchServer:
    """The benchmark's PostgreSQL server, started on first use (data on disk)."""
    global _server
    if _server is None:
        _server = pgserve.start(disk.root)
    return _server


def backend(disk: Target) -> PgBackend:
    """Queues on that server (one schema template for the whole run)."""
    global _backend
    if _backend is None:
        _backend = PgBackend(server(disk))
    return _backend


def _backends(disk: Target) -> dict[str, Backend]:
    """SQLite, and PostgreSQL on the benchmark's server, by name."""
    return {SQLITE.name: SQLITE, PgBackend.name: backend(disk)}


def stop_server() -> None:
    global _server, _backend
    if _server is not None:
        try:
            _server.stop()
        finally:
            _server, _backend = None, None


def _label(n: int) -> str:
    return "1 worker" if n == 1 else f"{n} workers"


# -- drain ---------------------------------------------------------------------------------


def drain(plan: Plan, disk: Target) -> dict[str, Any]:
    by_name, srv = _backends(disk), server(disk)
    cpu_before = srv.server_cpu_s()
    with workdir("pg-drain", disk.root) as scratch:
        arms = [
            Arm(f"{b} {_label(n)}", _drain_arm(by_name[b], plan.drain_jobs, n, scratch))
            for n in WORKER_COUNTS
            for b in BACKENDS
        ]
        records = run_blocks(arms, plan.drain_reps, f"pg vs sqlite drain on {disk.describe()}")
        census = {
            label: _census(backend(disk), min(CENSUS_JOBS, plan.drain_jobs), n, extra, scratch)
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


def _drain_arm(backend: Backend, jobs: int, n: int, scratch: Path) -> Callable[[], Sample]:
    return lambda: harness.drain_once(backend, OURS, scratch, jobs=jobs, workers=n)


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
    pg: PgBackend, jobs: int, n: int, extra: tuple[str, ...], scratch: Path
) -> dict[str, Any]:
    """One more PostgreSQL drain, not timed, counting the connections held."""
    census = Census(pg.srv)
    try:
        harness.drain_once(pg, OURS, scratch, jobs=jobs, workers=n, extra=extra, during=census)
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


_gap = random.Random(7)


def pickup(plan: Plan, disk: Target) -> dict[str, Any]:
    by_name, srv = _backends(disk), server(disk)
    cpu_before = srv.server_cpu_s()
    with contextlib.ExitStack() as stack:
        running = {
            arm: harness.start_idle_worker(
                stack,
                by_name[b],
                OURS,
                stack.enter_context(workdir(f"pickup-{b}", disk.root)),
                _gap,
                env=more_env,
                read_claim=True,
            )
            for arm, b, more_env in PICKUP_ARMS
        }
        time.sleep(harness.SETTLE_S)
        connections = running["pg"].queue.connections()
        server_idle_before = srv.server_cpu_s()
        idle = harness.idle_cpu({b: w.proc.pid for b, w in running.items()}, plan.idle_s)
        server_idle = srv.server_cpu_s() - server_idle_before
        records = harness.pickup_blocks(running, plan, f"pg vs sqlite pickup on {disk.describe()}")
    return {
        "filesystem": disk.facts(),
        "server": srv.facts,
        "idle_cpu_pct_of_core": idle,
        "idle_server_cpu_pct_of_core": 100.0 * server_idle / plan.idle_s,
        "idle_window_s": plan.idle_s,
        "idle_worker_connections": connections,
        "arms": {b: harness.latency_summary(records, b) for b in running},
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
