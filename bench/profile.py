"""Profiling data for optimising ours: where `work --drain` and `add` spend
their time, and how many SQL statements a job costs.

    .venv/bin/python bench/profile.py [--jobs 1000]

- cProfile of `spoolctl work --drain` (one worker) over N queued `true` jobs,
  and of `spoolctl add -- true` as a whole process (imports included);
- top 15 functions by cumulative and by own (tottime) time for each;
- SQL statements per job during the drain and per `add` (bench/sqlcount.py).

Writes bench/results/profile-<timestamp>/summary.txt (the summary printed) and
the raw drain.prof and add.prof beside it (read them with `python -m pstats FILE`).

The profiled commands run as separate processes: this file is named like the
stdlib `profile` module that cProfile imports, so it must never import cProfile.
"""

from __future__ import annotations

import argparse
import io
import json
import pstats
import re
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fixtures import BENCH, OURS, BenchError, clean_env, clone_queued, count_state, seed, workdir

TOP = 15


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        argv, cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=900, check=False
    )
    if proc.returncode != 0:
        raise BenchError(f"`{' '.join(argv)[:200]}` exit {proc.returncode}: {proc.stderr[-800:]}")
    return proc


def _queue(d: Path, jobs: int) -> Path:
    db = d / "q.db"
    seed(OURS, db, d)
    clone_queued(db, jobs, time.time())
    return db


def cprofile(label: str, spoolctl_args: list[str], d: Path, out_dir: Path) -> tuple[Path, float]:
    prof = out_dir / f"{label}.prof"
    start = time.perf_counter()
    _run([str(OURS.python), "-m", "cProfile", "-o", str(prof), "-m", "spoolctl", *spoolctl_args], d)
    return prof, time.perf_counter() - start


def top_functions(prof: Path, order: str, only_ours: bool = False) -> str:
    """pstats table; only_ours keeps spoolctl's own functions (the cumulative
    view is otherwise led by runpy/click wrapper frames)."""
    buf = io.StringIO()
    stats = pstats.Stats(str(prof), stream=buf)
    if only_ours:
        stats.sort_stats(order).print_stats(r"/spoolctl/[^/]*(/[^/]*)?\.py", TOP)
    else:
        stats.strip_dirs().sort_stats(order).print_stats(TOP)
    text = re.sub(r"/\S*/spoolctl/", "spoolctl/", buf.getvalue())
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if "ncalls" in line)
    head = [line for line in lines[:start] if "function calls" in line]
    return "\n".join(head + lines[start:]).rstrip()


def sql_count(spoolctl_args: list[str], d: Path) -> dict[str, Any]:
    out = d / "sql.json"
    _run([str(OURS.python), str(BENCH / "sqlcount.py"), str(out), *spoolctl_args], d)
    summary: dict[str, Any] = json.loads(out.read_text())
    if summary["exit_code"] != 0:
        raise BenchError(f"sqlcount {spoolctl_args[0]}: exit {summary['exit_code']}")
    return summary


def sql_text(title: str, summary: dict[str, Any], per: int) -> str:
    lines = [f"{title}: {summary['total']} statements, {summary['total'] / per:.1f} per job"]
    lines.append(
        "  by kind per job: "
        + ", ".join(f"{k} {n / per:.2f}" for k, n in summary["by_kind"].items())
    )
    lines += [f"  {s['count'] / per:7.2f}/job  {s['sql'][:150]}" for s in summary["top_statements"]]
    return "\n".join(lines)


def _views(prof: Path) -> list[str]:
    return [
        f"-- top {TOP} by cumulative\n" + top_functions(prof, "cumulative"),
        f"-- top {TOP} spoolctl functions by cumulative\n"
        + top_functions(prof, "cumulative", only_ours=True),
        f"-- top {TOP} by tottime\n" + top_functions(prof, "tottime"),
    ]


def profile(jobs: int, out_dir: Path) -> str:
    sections = []
    with workdir("profile-drain") as d:
        db = _queue(d, jobs)
        prof, wall = cprofile("drain", ["work", "--db", str(db), "--drain", "--json"], d, out_dir)
        if count_state(db, "done") != jobs:
            raise BenchError("profiled drain did not finish every job")
        sections.append(
            f"== work --drain, 1 worker, {jobs} `true` jobs, under cProfile: "
            f"{wall:.2f} s wall ({jobs / wall:.0f} jobs/s with profiling overhead)"
        )
        sections += _views(prof)
    with workdir("profile-add") as d:
        db = _queue(d, 1)
        prof, wall = cprofile("add", ["add", "--db", str(db), "--json", "--", "true"], d, out_dir)
        sections.append(f"== add -- true as a process, under cProfile: {wall * 1000:.0f} ms wall")
        sections += _views(prof)
    with workdir("profile-sql") as d:
        db = _queue(d, jobs)
        drain = sql_count(["work", "--db", str(db), "--drain", "--json"], d)
        sections.append("== SQL\n" + sql_text(f"work --drain over {jobs} jobs", drain, jobs))
        add = sql_count(["add", "--db", str(db), "--json", "--", "true"], d)
        sections.append(sql_text("one add", add, 1))
    return "\n\n".join(sections)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000, help="jobs to drain (default 1000)")
    args = parser.parse_args(argv)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out_dir = BENCH / "results" / f"profile-{stamp}"
    out_dir.mkdir(parents=True, exist_ok=True)
    text = profile(args.jobs, out_dir)
    (out_dir / "summary.txt").write_text(text + "\n")
    print(text)
    print(f"\nprofile: {out_dir.relative_to(BENCH.parent)}/ (summary.txt, drain.prof, add.prof)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
