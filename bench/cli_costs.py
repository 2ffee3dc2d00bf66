"""Costs of single CLI invocations: `add`, `status` and `list` as fresh
processes against the import floor (interleaved with the reference), what
`add` imports, `add --batch`, and claim / `status` / `list` as the jobs table
grows."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import bigtable
from filesystems import Target
from fixtures import (
    BENCH,
    IMPLS,
    OURS,
    BenchError,
    Impl,
    clean_env,
    median,
    percentile,
    run_cli,
    seed,
    workdir,
)
from interleave import Arm, Sample, run_blocks, spread
from plan import Plan

FLAGGED_IMPORTS = ("alembic", "mako", "sqlalchemy.orm", "sqlalchemy.ext", "psutil")
"""Modules `add` has no use for: reported when the add path imports them."""


VERBS: dict[str, tuple[str, ...]] = {
    "add": ("add", "--json", "--", "true"),
    "status": ("status", "--json"),
    "list": ("list", "--json", "--limit", "50"),
}
FLOOR = "floor"
FLOOR_CODE = "import sqlalchemy, click"
"""The imports the design requires of every verb: `python -c` of them under
ours' interpreter is the floor for a fresh process of ours."""


def fresh_process(plan: Plan, target: Target) -> dict[str, Any]:
    """Wall time of `add`, `status` and `list` as fresh processes, ours and the
    reference, and of `python -c "import sqlalchemy, click"` (the import
    floor), all interleaved A B B A. `add` goes to a queue holding one job;
    `status` and `list` read a queue of plan.small_table jobs (bigtable mix)."""
    with workdir("cli", target.root) as d:
        queues = {impl.name: _cli_queues(impl, d, plan.small_table) for impl in IMPLS}
        arms = [Arm(FLOOR, lambda: _floor_sample(d))]
        arms += [
            Arm(f"{impl.name} {verb}", _verb_arm(impl, verb, queues[impl.name][verb], d))
            for verb in VERBS
            for impl in IMPLS
        ]
        records = run_blocks(
            arms, -(-plan.add_reps // 2), f"fresh processes on {target.describe()}"
        )
    return {
        "filesystem": target.facts(),
        "read_queue_jobs": plan.small_table,
        "arms": {a.name: spread(records.values(a.name)) for a in arms},
        "ratios_ours_to_ref": {
            verb: spread(records.ratios(f"ours {verb}", f"ref {verb}")) for verb in VERBS
        },
        "over_floor_s": {
            f"{impl.name} {verb}": spread(records.differences(f"{impl.name} {verb}", FLOOR))
            for verb in VERBS
            for impl in IMPLS
        },
        "floor_command": [str(OURS.python), "-c", FLOOR_CODE],
        "errors": records.errors,
        "samples": records.samples,
    }


def _cli_queues(impl: Impl, d: Path, read_jobs: int) -> dict[str, Path]:
    """The add queue (schema made, two jobs, not measured) and the read queue."""
    add_db, read_dir = d / f"{impl.name}-add.db", d / f"{impl.name}-read"
    seed(impl, add_db, d)
    run_cli(impl, *_with_db(VERBS["add"], add_db), cwd=d)
    read_dir.mkdir()
    bigtable.build(impl, read_dir / "q.db", read_dir, read_jobs)
    read_db = read_dir / "q.db"
    return {"add": add_db, "status": read_db, "list": read_db}


def _with_db(verb_args: tuple[str, ...], db: Path) -> tuple[str, ...]:
    return (verb_args[0], "--db", str(db), *verb_args[1:])


def _verb_arm(impl: Impl, verb: str, db: Path, d: Path) -> Callable[[], Sample]:
    args = _with_db(VERBS[verb], db)

    def run() -> Sample:
        wall, _ = run_cli(impl, *args, cwd=d)
        return {"value": wall}

    return run


def _floor_sample(d: Path) -> Sample:
    start = time.perf_counter()
    proc = subprocess.run(
        [str(OURS.python), "-c", FLOOR_CODE],
        cwd=d,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise BenchError(f"import floor failed: {proc.stderr[-300:]}")
    return {"value": wall}


def import_time() -> dict[str, Any]:
    """`python -X importtime -m spoolctl add ...` for both: total and top modules."""
    out: dict[str, Any] = {}
    with workdir("importtime") as d:
        for impl in IMPLS:
            db = d / f"{impl.name}.db"
            seed(impl, db, d)
            proc = subprocess.run(
                [
                    str(impl.python),
                    "-X",
                    "importtime",
                    "-m",
                    "spoolctl",
                    "add",
                    "--db",
                    str(db),
                    "--json",
                    "--",
                    "true",
                ],
                cwd=d,
                env=impl.environ(clean_env()),
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            if proc.returncode != 0:
                raise BenchError(f"{impl.name}: importtime add failed: {proc.stderr[-600:]}")
            out[impl.name] = summarize_importtime(proc.stderr)
    return out


def summarize_importtime(stderr: str) -> dict[str, Any]:
    modules = []
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, cum_us, name = line[len("import time:") :].split("|", 2)
        depth = (len(name) - len(name.lstrip(" ")) - 1) // 2
        modules.append(
            {
                "module": name.strip(),
                "self_ms": int(self_us) / 1000,
                "cumulative_ms": int(cum_us) / 1000,
                "depth": depth,
            }
        )
    names = [m["module"] for m in modules]
    flagged = sorted(
        n for n in names if any(n == f or n.startswith(f + ".") for f in FLAGGED_IMPORTS)
    )
    top_self = sorted(modules, key=lambda m: -m["self_ms"])[:10]
    top_level = sorted((m for m in modules if m["depth"] == 0), key=lambda m: -m["cumulative_ms"])
    return {
        "total_ms": round(sum(m["self_ms"] for m in modules), 1),
        "module_count": len(modules),
        "sqlalchemy_modules": sum(1 for n in names if n.split(".")[0] == "sqlalchemy"),
        "alembic_imported": any(n.split(".")[0] == "alembic" for n in names),
        "flagged_imports": flagged,
        "top10_self": [_strip_depth(m) for m in top_self],
        "top10_toplevel_cumulative": [_strip_depth(m) for m in top_level[:10]],
    }


def _strip_depth(module: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in module.items() if k != "depth"}


def batch(plan: Plan, ref_add_median_s: float | None, target: Target) -> dict[str, Any]:
    """`add --batch` of N `true` jobs into an existing queue (ours only: the
    reference has no batch, its cost is estimated as N single-add processes)."""
    samples = []
    with workdir("batch", target.root) as d:
        ndjson = d / "jobs.ndjson"
        ndjson.write_text('{"argv": ["true"]}\n' * plan.batch_jobs)
        for _ in range(plan.batch_reps):
            db = d / f"q{len(samples)}.db"
            seed(OURS, db, d)
            wall, data = run_cli(
                OURS, "add", "--db", str(db), "--json", "--batch", str(ndjson), cwd=d
            )
            if data.get("count") != plan.batch_jobs:
                raise BenchError(f"ours: batch reported count {data.get('count')}")
            samples.append(wall)
    result: dict[str, Any] = {
        "filesystem": target.facts(),
        "jobs": plan.batch_jobs,
        "ours": {"median_s": median(samples), "samples_s": samples},
    }
    if ref_add_median_s is not None:
        result["ref_estimate_s"] = ref_add_median_s * plan.batch_jobs
        result["ref_estimate_note"] = (
            "ESTIMATE: the reference has no --batch; median single `add` process x job count"
        )
    return result


def table_growth(plan: Plan, target: Target) -> dict[str, Any]:
    """claim (in-process), `status --json` and `list --json --limit 50` (fresh
    processes) with a small and a big jobs table, for both implementations.
    The two sizes are measured in alternation, so that load from elsewhere
    on the machine hits both alike instead of skewing their ratio."""
    out: dict[str, Any] = {"filesystem": target.facts()}
    for impl in IMPLS:
        with (
            workdir(f"small-{impl.name}", target.root) as small,
            workdir(f"big-{impl.name}", target.root) as big,
        ):
            queues = {plan.small_table: small, plan.big_table: big}
            for size, d in queues.items():
                bigtable.build(impl, d / "q.db", d, size)
            sizes = _alternating_costs(impl, queues, plan)
        out[impl.name] = {"sizes": sizes, "ratios_big_to_small": _ratios(sizes, plan)}
    return out


CLAIM_ROUNDS = 3


def _alternating_costs(impl: Impl, queues: dict[int, Path], plan: Plan) -> dict[str, Any]:
    samples: dict[int, dict[str, list[float]]] = {n: {} for n in queues}
    errors: dict[int, dict[str, str]] = {n: {} for n in queues}
    verbs = {
        "status": ("status", "--json"),
        "list": ("list", "--json", "--limit", "50"),
    }
    for rep in range(-1, plan.read_reps):  # rep -1 warms the page cache, unrecorded
        for size, d in queues.items():
            for label, (verb, *rest) in verbs.items():
                if label in errors[size]:
                    continue
                try:
                    wall, _ = run_cli(impl, verb, "--db", str(d / "q.db"), *rest, cwd=d)
                except BenchError as exc:
                    errors[size][label] = str(exc)
                    continue
                if rep >= 0:
                    samples[size].setdefault(label, []).append(wall)
    for _ in range(CLAIM_ROUNDS):
        for size, d in queues.items():
            if "claim" in errors[size]:
                continue
            try:
                chunk = _claim_samples(impl, d / "q.db", d, plan.claim_reps // CLAIM_ROUNDS)
            except BenchError as exc:
                errors[size]["claim"] = str(exc)
                continue
            samples[size].setdefault("claim", []).extend(chunk)
    return {str(size): _summaries(samples[size], errors[size]) for size in queues}


def _summaries(samples: dict[str, list[float]], errors: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {label: {"error": text} for label, text in errors.items()}
    for label, walls in samples.items():
        if label not in errors:
            out[label] = {
                "median_s": median(walls),
                "p95_s": percentile(walls, 95),
                "samples_s": walls,
            }
    if "claim" in out and "error" not in out["claim"]:
        out["claim"]["method"] = (
            "in-process claim transaction incl. COMMIT, undone untimed (bench/claimcost.py)"
        )
    return out


def _claim_samples(impl: Impl, db: Path, d: Path, reps: int) -> list[float]:
    warmup = 20
    proc = subprocess.run(
        [str(impl.python), str(BENCH / "claimcost.py"), impl.name, str(db), str(reps + warmup)],
        cwd=d,
        env=impl.environ(clean_env()),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if proc.returncode != 0:
        raise BenchError(f"{impl.name}: claimcost failed: {proc.stderr[-800:]}")
    samples: list[float] = json.loads(proc.stdout)[warmup:]
    return samples


def _ratios(sizes: dict[str, Any], plan: Plan) -> dict[str, float | None]:
    small, big = sizes[str(plan.small_table)], sizes[str(plan.big_table)]
    return {
        k: big[k]["median_s"] / small[k]["median_s"]
        if "median_s" in big.get(k, {}) and "median_s" in small.get(k, {})
        else None
        for k in ("claim", "status", "list")
    }
