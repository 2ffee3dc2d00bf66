"""spoolctl benchmark: ours (the work tree's .venv) against the original
stdlib spoolctl 0.4.11 (bench/.venv-ref), measured in the same run.

    bench/run [--quick] [--only add,batch,drain,pickup,table,spawn]

Prints a table and writes bench/results/<timestamp>.json and latest.json with
medians, raw samples and the machine. See bench/README.md for what each
number means and the targets of SPEC section 6.
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

import cli_costs
import psutil
import report
import workers
from fixtures import BENCH, machine
from plan import DEFAULT, QUICK, Plan

SCENARIOS = ("add", "batch", "drain", "pickup", "table", "spawn")


def run_scenarios(plan: Plan, only: set[str]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    steps: list[tuple[str, str, Callable[[], Any]]] = [
        ("add", "add_process", lambda: cli_costs.add_process(plan)),
        ("add", "import_time", cli_costs.import_time),
        ("batch", "batch", lambda: cli_costs.batch(plan, _ref_add_median(results))),
        ("drain", "drain", lambda: workers.drain(plan)),
        ("pickup", "pickup_idle", lambda: workers.pickup_and_idle(plan)),
        ("table", "table_growth", lambda: cli_costs.table_growth(plan)),
        ("spawn", "spawn_baseline", lambda: workers.spawn_baseline(plan)),
    ]
    for group, name, step in steps:
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
        results[name]["foreign_cpu_cores"] = _foreign_cores(cpu_before, _cpu_split(), wall)
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


def _foreign_cores(before: tuple[float, float], after: tuple[float, float], wall: float) -> float:
    """Average number of cores busy with something other than the benchmark:
    other users of the machine, which make every number noisier."""
    foreign = (after[0] - before[0]) - (after[1] - before[1])
    return round(max(0.0, foreign) / wall, 3)


def _ref_add_median(results: dict[str, Any]) -> float | None:
    add = results.get("add_process", {})
    return add.get("ref", {}).get("median_s")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (~2 min)")
    parser.add_argument(
        "--only",
        default=",".join(SCENARIOS),
        help=f"comma-separated subset of: {', '.join(SCENARIOS)}",
    )
    args = parser.parse_args(argv)
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    unknown = only - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenario(s): {', '.join(sorted(unknown))}")
    plan = QUICK if args.quick else DEFAULT
    started = datetime.now(UTC)
    results = run_scenarios(plan, only)
    doc = {
        "started_at": started.isoformat(timespec="seconds"),
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "mode": "quick" if args.quick else "default",
        "plan": plan.__dict__,
        "machine": machine(),
        "results": results,
    }
    rows = report.rows(results)
    doc["table"] = rows
    foreign = {name: r.get("foreign_cpu_cores") for name, r in results.items()}
    print(report.render(rows, doc["machine"], foreign))
    print(report.import_summary(results))
    _write(doc, started)
    errors = [name for name, r in results.items() if "error" in r]
    for name in errors:
        print(f"\n[bench] {name} FAILED: {results[name]['error']}", file=sys.stderr)
    return 1 if errors else 0


def _write(doc: dict[str, Any], started: datetime) -> None:
    out = BENCH / "results"
    out.mkdir(exist_ok=True)
    text = json.dumps(doc, indent=1, default=str)
    stamped = out / f"{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    stamped.write_text(text)
    (out / "latest.json").write_text(text)
    print(f"\nresults: {stamped.relative_to(BENCH.parent)} (and bench/results/latest.json)")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
