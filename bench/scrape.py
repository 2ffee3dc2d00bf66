"""The metrics scenario: one scrape with a small and a big jobs table
(the target: flat as the table grows, under 50 ms at 100,000 jobs).

Ours only (the reference has no metrics). For each size: in-process scrapes
(bench/scrapecost.py) warm, as the web's /metrics serves them, and cold, as
one `spoolctl metrics` process counts; and `spoolctl metrics --json` as a
fresh process (start-up included). The two sizes are measured in
alternating rounds, so load from elsewhere hits both alike."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import bigtable
from filesystems import Target
from fixtures import BENCH, OURS, BenchError, clean_env, median, percentile, run_cli, workdir
from plan import Plan

TARGET_S = 0.05
ROUNDS = 3


def scrape_growth(plan: Plan, target: Target) -> dict[str, Any]:
    out: dict[str, Any] = {"filesystem": target.facts(), "target_s": TARGET_S}
    with (
        workdir("metrics-small", target.root) as small,
        workdir("metrics-big", target.root) as big,
    ):
        queues = {plan.small_table: small, plan.big_table: big}
        for size, d in queues.items():
            bigtable.build(OURS, d / "q.db", d, size)
        samples: dict[int, dict[str, list[float]]] = {n: {} for n in queues}
        for _ in range(ROUNDS):
            for size, d in queues.items():
                found = _in_process(d / "q.db", d, max(3, plan.claim_reps // 30))
                for label in ("warm_s", "cold_s"):
                    samples[size].setdefault(label, []).extend(found[label])
                for _ in range(max(1, plan.read_reps // ROUNDS)):
                    wall, _ = run_cli(OURS, "metrics", "--db", str(d / "q.db"), "--json", cwd=d)
                    samples[size].setdefault("process_s", []).append(wall)
    sizes = {str(n): {k: _summary(v) for k, v in s.items()} for n, s in samples.items()}
    out["sizes"] = sizes
    small_s, big_s = sizes[str(plan.small_table)], sizes[str(plan.big_table)]
    out["ratios_big_to_small"] = {
        k: big_s[k]["median_s"] / small_s[k]["median_s"] for k in ("warm_s", "cold_s", "process_s")
    }
    out["big_warm_p95_under_target"] = big_s["warm_s"]["p95_s"] < TARGET_S
    return out


def _in_process(db: Path, cwd: Path, reps: int) -> dict[str, list[float]]:
    proc = subprocess.run(
        [str(OURS.python), str(BENCH / "scrapecost.py"), str(db), str(reps)],
        cwd=cwd,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if proc.returncode != 0:
        raise BenchError(f"scrapecost failed: {proc.stderr[-800:]}")
    found: dict[str, list[float]] = json.loads(proc.stdout)
    return found


def _summary(walls: list[float]) -> dict[str, Any]:
    return {"median_s": median(walls), "p95_s": percentile(walls, 95), "samples_s": walls}
