"""Shared plumbing of the benchmark: the two implementations under test, running
their CLIs as fresh processes, filling queue files fast, and machine facts.

Both implementations are driven only through their command lines (and, for the
claim cost, through bench/claimcost.py running under their own interpreter), so
the comparison measures what a user would run.
"""

from __future__ import annotations

import json
import os
import platform
import sqlite3
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
DAY_S = 86_400.0


class BenchError(Exception):
    """A command under test misbehaved: recorded in the results, never hidden."""


@dataclass(frozen=True)
class Impl:
    """One spoolctl to measure: ours (the work tree) or the reference (0.4.11)."""

    name: str
    venv: Path
    own_tree: bool = False
    """Ours: a PYTHONPATH the run was started with (naming the work tree to
    measure) reaches its processes. The reference is a wheel install: it never
    gets one, or its processes would import ours."""

    def environ(self, env: dict[str, str]) -> dict[str, str]:
        """env as this implementation's processes get it."""
        if self.own_tree or "PYTHONPATH" not in env:
            return env
        return {k: v for k, v in env.items() if k != "PYTHONPATH"}

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def cli(self) -> Path:
        return self.venv / "bin" / "spoolctl"

    def argv(self, *args: str) -> list[str]:
        return [str(self.cli), *args]


OURS = Impl("ours", Path(os.environ.get("BENCH_OURS_VENV", REPO / ".venv")), own_tree=True)
"""BENCH_OURS_VENV: measure another build of ours (e.g. a snapshot of a commit)."""
REF = Impl("ref", BENCH / ".venv-ref")
IMPLS = (OURS, REF)


def clean_env() -> dict[str, str]:
    """The caller's environment without SPOOLCTL_* knobs, so defaults apply,
    except those named in BENCH_KEEP_ENV (comma-separated), which a run can
    set on purpose: `BENCH_KEEP_ENV=SPOOLCTL_CGROUP SPOOLCTL_CGROUP=off`
    measures ours uncontained (the reference ignores the variable)."""
    keep = {name.strip() for name in os.environ.get("BENCH_KEEP_ENV", "").split(",")}
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOOLCTL_") or k in keep}
    env["LC_ALL"] = "C"
    return env


def run_cli(
    impl: Impl, *args: str, cwd: Path, timeout: float = 600, env: dict[str, str] | None = None
) -> tuple[float, Any]:
    """Run one CLI command as a fresh process (in env, default clean_env());
    return (wall seconds, JSON data).

    Raises BenchError on a non-zero exit or an envelope that is not ok."""
    start = time.perf_counter()
    proc = subprocess.run(
        impl.argv(*args),
        cwd=cwd,
        env=impl.environ(clean_env() if env is None else env),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    wall = time.perf_counter() - start
    return wall, envelope_data(impl, args, proc.returncode, proc.stdout, proc.stderr)


def envelope_data(impl: Impl, args: tuple[str, ...], code: int, out: str, err: str) -> Any:
    shown = " ".join(args)[:200]
    try:
        env = json.loads(out)
    except ValueError:
        raise BenchError(
            f"{impl.name}: `spoolctl {shown}` exit {code}, stdout not JSON: "
            f"{out[:300]!r} stderr: {err[-600:]!r}"
        ) from None
    if code != 0 or not env.get("ok"):
        raise BenchError(
            f"{impl.name}: `spoolctl {shown}` exit {code}: {json.dumps(env.get('errors'))[:600]}"
            f" stderr: {err[-300:]!r}"
        )
    return env.get("data")


@contextmanager
def workdir(label: str, root: Path | None = None) -> Iterator[Path]:
    """A fresh folder for one measurement (the spool lives inside it), under
    root (a bench/filesystems.py target) or else the system's temp folder."""
    with tempfile.TemporaryDirectory(prefix=f"spoolbench-{label}-", dir=root) as tmp:
        yield Path(tmp)


def fresh_dir(label: str, parent: Path) -> Path:
    """A fresh folder under parent that is left in place: removed with parent,
    after the scenario, so that deleting one arm's output (thousands of files)
    does not slow the arm measured next."""
    return Path(tempfile.mkdtemp(prefix=f"{label}-", dir=parent))


def seed(impl: Impl, db: Path, cwd: Path) -> None:
    """Create the queue file through the CLI itself: one queued `true` job."""
    run_cli(impl, "add", "--db", str(db), "--json", "--", "true", cwd=cwd)


def clone_queued(db: Path, total: int, due_at: float) -> None:
    """Grow a queue that holds one queued job (made by `add`) to `total` identical
    queued jobs, copying the job row and its events with plain SQL: the rows
    are exactly what `add` writes, for either schema, at a fraction of the cost."""
    with closing_db(db) as conn:
        template = select_rows(conn, "SELECT * FROM jobs ORDER BY id LIMIT 1")[0]
        events = select_rows(conn, "SELECT * FROM job_events WHERE job_id = ?", (template["id"],))
        first = int(template["id"])
        jobs = [
            {**template, "id": first + i, "created_at": due_at, "next_run_at": due_at}
            for i in range(1, total)
        ]
        insert_rows(conn, "jobs", jobs)
        insert_rows(conn, "job_events", [_event_copy(e, j["id"]) for j in jobs for e in events])
        conn.execute(
            "UPDATE jobs SET next_run_at = ?, created_at = ? WHERE id = ?", (due_at, due_at, first)
        )
        conn.commit()


def _event_copy(event: dict[str, Any], job_id: int) -> dict[str, Any]:
    row = {k: v for k, v in event.items() if k != "id"}
    row["job_id"] = job_id
    return row


@contextmanager
def closing_db(db: Path) -> Iterator[sqlite3.Connection]:
    conn = sqlite3.connect(db, timeout=30)
    conn.row_factory = sqlite3.Row
    try:
        yield conn
    finally:
        conn.close()


def select_rows(
    conn: sqlite3.Connection, sql: str, params: tuple[Any, ...] = ()
) -> list[dict[str, Any]]:
    return [dict(r) for r in conn.execute(sql, params).fetchall()]


def insert_rows(conn: sqlite3.Connection, table: str, rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    cols = list(rows[0])
    sql = f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"
    conn.executemany(sql, ([r[c] for c in cols] for r in rows))


def count_state(db: Path, state: str) -> int:
    with closing_db(db) as conn:
        return int(
            conn.execute("SELECT count(*) FROM jobs WHERE state = ?", (state,)).fetchone()[0]
        )


def median(samples: list[float]) -> float:
    return statistics.median(samples)


def percentile(samples: list[float], pct: float) -> float:
    """Nearest-rank percentile (no interpolation): a value that was observed."""
    ordered = sorted(samples)
    rank = max(1, round(pct / 100 * len(ordered) + 0.5 - 1e-9))
    return ordered[min(rank, len(ordered)) - 1]


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    return {
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "memory_total_mb": _meminfo_mb("MemTotal"),
        "kernel": platform.release(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "filesystem_of_tmp": _filesystem(Path(tempfile.gettempdir())),
        "versions": {impl.name: _interpreter_facts(impl) for impl in IMPLS},
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _meminfo_mb(key: str) -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) // 1024
    except OSError:
        pass
    return None


def _filesystem(path: Path) -> str:
    best, kind = "", "unknown"
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            mount = parts[1]
            if str(path).startswith(mount) and len(mount) >= len(best):
                best, kind = mount, f"{parts[2]} on {mount}"
    except OSError:
        pass
    return kind


def _interpreter_facts(impl: Impl) -> dict[str, str]:
    code = (
        "import sys, sqlite3, importlib.metadata as m;"
        "print(sys.version.split()[0], sqlite3.sqlite_version, m.version('spoolctl'))"
    )
    try:
        out = subprocess.run(
            [str(impl.python), "-c", code],
            env=impl.environ(dict(os.environ)),
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.split()
    except (OSError, subprocess.SubprocessError) as exc:
        return {"error": str(exc)}
    return {"python": out[0], "sqlite": out[1], "spoolctl": out[2]}
