"""spoolctl benchmark: ours (the work tree's .venv) against the original
stdlib spoolctl 0.4.11 (bench/.venv-ref), measured in the same run.

    bench/run [--quick] [--only cli,batch,submit,coldstart,idle,contained,drain,...]

Ours and the reference run interleaved (A B B A) in every scenario they share;
drain and pickup run on the disk the repository is on and on a tmpfs, beside
the machine's own spawn ceiling. `pg` runs ours on PostgreSQL beside ours on
SQLite (bench/pg.py), interleaved the same way. Prints a table and writes
bench/results/<timestamp>/results.json (and table.txt, and
bench/results/latest.json) with medians, spreads, per-pair ratios, raw samples,
the file systems and the machine. See bench/README.md for what each
number means and its target.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import ceiling
import cli_costs
import coldstart
import contained
import filesystems
import fleet
import pg
import psutil
import report
import scrape
import slow
import submit
import workers
from filesystems import Target
from fixtures import BENCH, machine
from plan import DEFAULT, QUICK, Plan

SCENARIOS = (
    "cli",
    "batch",
    "submit",
    "coldstart",
    "idle",
    "contained",
    "drain",
    "slow",
    "pickup",
    "table",
    "metrics",
    "pg",
    "fleet",
)
ALIASES = {"add": "cli", "spawn": "drain"}
"""Names of earlier versions: `add` is now part of `cli`, the spawn ceiling of `drain`."""

Step = tuple[str, str, Callable[[], Any]]


def steps(plan: Plan, found: list[Target], results: dict[str, Any]) -> list[Step]:
    disk = found[0]
    layout = ceiling.attempt_layout()
    out: list[Step] = [
        ("cli", "fresh_process", lambda: cli_costs.fresh_process(plan, disk)),
        ("cli", "import_time", cli_costs.import_time),
        ("batch", "batch", lambda: cli_costs.batch(plan, _ref_add_median(results), disk)),
        ("submit", "submit", lambda: submit.submission_loop(plan, disk)),
        ("coldstart", "coldstart", lambda: coldstart.cold_start(plan, disk)),
        ("idle", "idle", lambda: coldstart.idle(plan, disk)),
    ]
    out += [
        ("contained", f"contained:{t.label}", _bind(contained.contained_drain, plan, t))
        for t in found
    ]
    out += [("drain", f"drain:{t.label}", _bind(workers.drain, plan, t, layout)) for t in found]
    out.append(("slow", "slow", lambda: slow.slow_jobs(plan, disk)))
    out += [("pickup", f"pickup:{t.label}", _bind(workers.pickup_and_idle, plan, t)) for t in found]
    out.append(("table", "table_growth", lambda: cli_costs.table_growth(plan, disk)))
    out.append(("metrics", "metrics_scrape", lambda: scrape.scrape_growth(plan, disk)))
    out.append(("pg", "pg:drain", lambda: pg.drain(plan, disk)))
    out.append(("pg", "pg:pickup", lambda: pg.pickup(plan, disk)))
    out.append(("fleet", "fleet:drain", lambda: fleet.drain(plan, disk)))
    out.append(("fleet", "fleet:db", lambda: fleet.database_only(plan, disk)))
    return out


def _bind(fn: Callable[..., Any], *args: Any) -> Callable[[], Any]:
    return lambda: fn(*args)


def run_scenarios(plan: Plan, only: set[str], found: list[Target]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for group, name, step in steps(plan, found, results):
        if group not in only:
            continue
        print(f"[bench] {name} ...", file=sys.stderr, flush=True)
        start, cpu_before = time.perf_counter(), _cpu_split()
        try:
            results[name] = step()
        except Exception as exc:  # a broken scenario is reported, the rest still run
            results[name] = {
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(),
            }
        wall = time.perf_counter() - start
        results[name]["scenario_wall_s"] = round(wall, 2)
        server_cpu = results[name].get("server_cpu_s", 0.0)  # a PostgreSQL server we started
        results[name]["foreign_cpu_cores"] = _foreign_cores(
            cpu_before, _cpu_split(), wall, server_cpu
        )
        print(
            f"[bench] {name} done in {results[name]['scenario_wall_s']} s",
            file=sys.stderr,
            flush=True,
        )
    return results


def _cpu_split() -> tuple[float, float]:
    """(CPU seconds the whole machine has been busy, CPU seconds used by this
    process and every descendant it has waited for: workers, their jobs, CLIs)."""
    t = psutil.cpu_times()
    busy = t.user + t.nice + t.system + t.irq + t.softirq + t.steal
    own = os.times()
    return busy, own.user + own.system + own.children_user + own.children_system


def _foreign_cores(
    before: tuple[float, float], after: tuple[float, float], wall: float, server_cpu_s: float
) -> float:
    """Average number of cores busy with something other than the benchmark:
    other users of the machine, which make every number noisier. The
    PostgreSQL server the benchmark started is not a child it waits for: its
    CPU time is passed in and counted as the benchmark's own."""
    foreign = (after[0] - before[0]) - (after[1] - before[1]) - server_cpu_s
    return round(max(0.0, foreign) / wall, 3)


def _ref_add_median(results: dict[str, Any]) -> float | None:
    add = results.get("fresh_process", {})
    median: float | None = add.get("arms", {}).get("ref add", {}).get("median")
    return median


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (~7 min)")
    parser.add_argument(
        "--only",
        default=",".join(SCENARIOS),
        help=f"comma-separated subset of: {', '.join(SCENARIOS)}",
    )
    args = parser.parse_args(argv)
    only = {ALIASES.get(s.strip(), s.strip()) for s in args.only.split(",") if s.strip()}
    unknown = only - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenario(s): {', '.join(sorted(unknown))}")
    plan = QUICK if args.quick else DEFAULT
    started = datetime.now(UTC)
    with filesystems.targets() as (found, skipped):
        try:
            results = run_scenarios(plan, only, found)
        finally:
            pg.stop_server()
    doc = {
        "started_at": started.isoformat(timespec="seconds"),
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "mode": "quick" if args.quick else "default",
        "plan": plan.__dict__,
        "machine": machine(),
        "kept_env": {  # SPOOLCTL_* knobs BENCH_KEEP_ENV passed to both sides on purpose
            k: os.environ[k]
            for k in os.environ.get("BENCH_KEEP_ENV", "").split(",")
            if k.strip() and k in os.environ
        },
        "filesystems": [t.facts() for t in found],
        "filesystems_skipped": skipped,
        "results": results,
    }
    _write(doc, started, "", announce=False)  # the raw results survive a rendering error
    rows = report.rows(results)
    doc["table"] = rows
    foreign = {name: r.get("foreign_cpu_cores") for name, r in results.items()}
    rendered = report.render(rows, doc["machine"], foreign, doc["filesystems"], skipped)
    pg_rows = pg.rows(results) + fleet.rows(results)
    doc["table_pg"] = pg_rows
    table = "\n".join(
        part
        for part in (rendered, pg.render(pg_rows, results), report.import_summary(results))
        if part
    )
    print(table)
    _write(doc, started, table)
    errors = [name for name, r in results.items() if "error" in r or r.get("errors")]
    for name in errors:
        what = results[name].get("error") or results[name]["errors"]
        print(f"\n[bench] {name} FAILED: {what}", file=sys.stderr)
    return 1 if errors else 0


def _write(doc: dict[str, Any], started: datetime, table: str, announce: bool = True) -> None:
    out = BENCH / "results" / started.strftime("%Y%m%dT%H%M%SZ")
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(doc, indent=1, default=str)
    (out / "results.json").write_text(text)
    (out / "table.txt").write_text(table + "\n")
    (BENCH / "results" / "latest.json").write_text(text)
    if announce:
        print(f"\nresults: {out.relative_to(BENCH.parent)}/ (and bench/results/latest.json)")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
