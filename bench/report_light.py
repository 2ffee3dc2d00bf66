"""The table's rows for what a single process and a contained worker cost
(`submit`, `coldstart`, `idle`, `contained`), each checked against its
target (bench/README.md, "What each number means"): ratios are the median
of the per-pair ratios, ours over the reference; lower is better for time,
CPU and memory, higher for jobs/s."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import contained as contained_scenario
from cells import Row, cell, ratio, row, verdict

CPU_TARGETS = {"add": 0.5, "status": 0.8, "list": 0.8, "show": 0.8}
"""A verb's CPU as a fresh process, at most this times the reference's."""
LOOP_TARGET = 0.5
"""The submission loop's wall time, at most this times the reference's."""
EMPTY_DRAIN_TARGET = 1.0
CONTAINED_TO_REF = 1.0
CONTAINED_TO_OFF = 0.9
WORKER_CPU_TARGET = 0.6


def builders(results: dict[str, Any]) -> list[Callable[[dict[str, Any]], list[Row]]]:
    return [
        _submit_rows,
        _coldstart_rows,
        _idle_rows,
        *(_contained_builder(name) for name in results if name.startswith("contained:")),
    ]


def _fs(result: dict[str, Any]) -> str:
    fs = result["filesystem"]
    return f"{fs['label']}: {fs['fstype']} {fs['mount_point']}"


def _failed(results: dict[str, Any], name: str) -> list[Row]:
    return [row(f"{name}: {results[name]['error'][:90]}", "ERROR")]


def _arm_errors(results: dict[str, Any], name: str) -> list[Row]:
    errors = results[name].get("errors") or {}
    return [row(f"{name} / {arm}: {text[:90]}", "ERROR") for arm, text in errors.items()]


def _at_most(spread: dict[str, Any], limit: float, what: str = "ref") -> dict[str, str]:
    if not spread.get("n"):
        return {}
    return {"target": f"<= {limit}x {what}", "verdict": verdict(spread["median"] <= limit)}


def _at_least(spread: dict[str, Any], limit: float, what: str = "ref") -> dict[str, str]:
    if not spread.get("n"):
        return {}
    return {"target": f">= {limit}x {what}", "verdict": verdict(spread["median"] >= limit)}


def _submit_rows(results: dict[str, Any]) -> list[Row]:
    found = results.get("submit")
    if found is None:
        return []
    if "error" in found:
        return _failed(results, "submit")
    calls, arms, ratios = found["calls"], found["arms"], found["ratios_ours_to_ref"]
    ours, ref = arms["ours"], arms["ref"]
    out = [
        row(
            f"== submission loop: {calls} x `add -- true`, one process each, sh loop, {_fs(found)}"
        ),
        row(
            f"loop of {calls} add: wall s",
            cell(ours["loop_s"], fmt=".2f"),
            cell(ref["loop_s"], fmt=".2f"),
            ratio(ratios["loop_s"]),
            **_at_most(ratios["loop_s"], LOOP_TARGET),
        ),
        row(
            "  per call: wall ms",
            cell(ours["wall_ms_per_call"], fmt=".1f"),
            cell(ref["wall_ms_per_call"], fmt=".1f"),
        ),
        row(
            "  per call: CPU ms (the call and its share of the shell)",
            cell(ours["cpu_ms_per_call"], fmt=".1f"),
            cell(ref["cpu_ms_per_call"], fmt=".1f"),
            ratio(ratios["cpu_ms_per_call"]),
        ),
    ]
    for name, tool in arms.items():
        if name in ("ours", "ref") or not tool["loop_s"].get("n"):
            continue
        behind = [
            s["background_cpu_ms_per_call"]
            for s in found["samples"]
            if s["arm"] == name and "background_cpu_ms_per_call" in s
        ]
        extra = (
            f" (+ {sorted(behind)[len(behind) // 2]:.2f} ms in the background)" if behind else ""
        )
        out.append(
            row(
                f"context: {name}, {calls} calls: loop {tool['loop_s']['median']:.2f} s, "
                f"CPU {tool['cpu_ms_per_call']['median']:.2f} ms a call{extra}"
            )
        )
    out += [row(f"context: {name} skipped: {why}") for name, why in found["skipped"].items()]
    return out + _arm_errors(results, "submit")


def _coldstart_rows(results: dict[str, Any]) -> list[Row]:
    found = results.get("coldstart")
    if found is None:
        return []
    if "error" in found:
        return _failed(results, "coldstart")
    arms, ratios, over = (
        found["arms"],
        found["ratios_ours_to_ref"],
        found["over_python_start_cpu_s"],
    )
    out = [row(f"== cold start: one fresh process, CPU = user + system (wait4), {_fs(found)}")]
    for start in ("python -S -c pass", "python -c pass"):
        out.append(
            row(
                f"{start} (each venv's interpreter): CPU ms",
                cell(arms[f"ours {start}"]["cpu_s"], 1000, ".1f"),
                cell(arms[f"ref {start}"]["cpu_s"], 1000, ".1f"),
                ratio(ratios[start]["cpu"]),
            )
        )
    jobs = found["read_queue_jobs"]
    for verb, limit in CPU_TARGETS.items():
        where = "" if verb == "add" else f", {jobs:,} jobs"
        out += [
            row(
                f"{' '.join(found['commands'][verb])}{where}: CPU ms",
                cell(arms[f"ours {verb}"]["cpu_s"], 1000, ".1f"),
                cell(arms[f"ref {verb}"]["cpu_s"], 1000, ".1f"),
                ratio(ratios[verb]["cpu"]),
                **_at_most(ratios[verb]["cpu"], limit),
            ),
            row(
                "  wall ms",
                cell(arms[f"ours {verb}"]["wall_s"], 1000, ".1f"),
                cell(arms[f"ref {verb}"]["wall_s"], 1000, ".1f"),
                ratio(ratios[verb]["wall"]),
            ),
            row(
                "  CPU above its python -c pass, per pair: ms",
                cell(over[f"ours {verb}"], 1000, ".1f"),
                cell(over[f"ref {verb}"], 1000, ".1f"),
            ),
        ]
    return out + _arm_errors(results, "coldstart")


def _idle_rows(results: dict[str, Any]) -> list[Row]:
    found = results.get("idle")
    if found is None:
        return []
    if "error" in found:
        return _failed(results, "idle")
    drain, idle = found["empty_drain"], found["idle_worker"]
    d_arms, w_arms = drain["arms"], idle["arms"]
    unsettled = len(idle["unsettled"])
    note = f" ({unsettled} read at the deadline, unsettled)" if unsettled else ""
    return [
        row(f"== an empty queue, {_fs(found)}"),
        row(
            "work --drain, nothing to run: CPU ms",
            cell(d_arms["ours empty drain"]["cpu_s"], 1000, ".1f"),
            cell(d_arms["ref empty drain"]["cpu_s"], 1000, ".1f"),
            ratio(drain["ratios_ours_to_ref"]["cpu"]),
            **_at_most(drain["ratios_ours_to_ref"]["cpu"], EMPTY_DRAIN_TARGET),
        ),
        row(
            "  wall ms",
            cell(d_arms["ours empty drain"]["wall_s"], 1000, ".1f"),
            cell(d_arms["ref empty drain"]["wall_s"], 1000, ".1f"),
            ratio(drain["ratios_ours_to_ref"]["wall"]),
        ),
        row(
            f"idle worker (work, empty queue), VmRSS: MB{note}",
            cell(w_arms["ours idle worker"]["rss_mb"], fmt=".1f"),
            cell(w_arms["ref idle worker"]["rss_mb"], fmt=".1f"),
            ratio(idle["ratios_ours_to_ref"]),
            target="shown beside ref",
        ),
        *_arm_errors(results, "idle"),
    ]


def _contained_builder(name: str) -> Callable[[dict[str, Any]], list[Row]]:
    def _contained_rows(results: dict[str, Any]) -> list[Row]:
        found = results[name]
        if "error" in found:
            return _failed(results, name)
        return _contained(found) + _arm_errors(results, name)

    return _contained_rows


def _contained(found: dict[str, Any]) -> list[Row]:
    s = contained_scenario
    jobs, arms, ratios = found["jobs"], found["arms"], found["ratios"]
    on = s.contained(found)
    how = "a cgroup per attempt" if on else "NOT contained: " + _said(found, s.ON)
    out = [
        row(f"== contained drain, 1 worker, {jobs:,} true, {_fs(found)} (cgroups on: {how})"),
        row(
            "work --drain, cgroups on (default): jobs/s",
            cell(arms[s.ON]["jobs_per_s"]),
            cell(arms[s.REF_ARM]["jobs_per_s"]),
            ratio(ratios["on_to_ref"]),
            **_at_least(ratios["on_to_ref"], CONTAINED_TO_REF),
        ),
        row("work --drain, SPOOLCTL_CGROUP=off: jobs/s", cell(arms[s.OFF]["jobs_per_s"])),
        row(
            "  cgroups on / off, same worker, per pair",
            ratio=ratio(ratios["on_to_off"]),
            **(_at_least(ratios["on_to_off"], CONTAINED_TO_OFF, "off") if on else {}),
        ),
    ]
    if s.TWO_SLOTS in arms:
        out += [
            row("work --drain --concurrency 2: jobs/s", cell(arms[s.TWO_SLOTS]["jobs_per_s"])),
            row(
                "  2 slots / 1 slot (both contained), per pair",
                ratio=ratio(ratios["two_slots_to_one"]),
                **_gains(ratios["two_slots_to_one"]),
            ),
        ]
    out.append(
        row(
            "  worker's own CPU per job, cgroups on: ms",
            cell(arms[s.ON]["worker_own_cpu_ms_per_job"], fmt=".3f"),
            cell(arms[s.REF_ARM]["worker_own_cpu_ms_per_job"], fmt=".3f"),
            ratio(ratios["cpu_own_on_to_ref"]),
        )
    )
    out.append(
        row(
            "  worker's own CPU per job, SPOOLCTL_CGROUP=off: ms",
            cell(arms[s.OFF]["worker_own_cpu_ms_per_job"], fmt=".3f"),
        )
    )
    if found.get("cpu_drain_jobs"):
        cpu_jobs = found["cpu_drain_jobs"]
        out += [
            row(
                f"worker's own CPU per job, draining {cpu_jobs:,} true: ms",
                cell(arms[s.CPU_OURS]["worker_own_cpu_ms_per_job"], fmt=".3f"),
                cell(arms[s.CPU_REF]["worker_own_cpu_ms_per_job"], fmt=".3f"),
                ratio(ratios["cpu_own_ours_to_ref"]),
                **_at_most(ratios["cpu_own_ours_to_ref"], WORKER_CPU_TARGET),
            ),
            row(
                "  with the jobs it ran and reaped: ms",
                cell(arms[s.CPU_OURS]["workers_cpu_ms_per_job"], fmt=".3f"),
                cell(arms[s.CPU_REF]["workers_cpu_ms_per_job"], fmt=".3f"),
                ratio(ratios["cpu_with_jobs_ours_to_ref"]),
            ),
        ]
    return out


def _gains(spread: dict[str, Any]) -> dict[str, str]:
    if not spread.get("n"):
        return {}
    return {"target": "> 1x one slot", "verdict": verdict(spread["median"] > 1.0)}


def _said(found: dict[str, Any], arm: str) -> str:
    facts = found.get("containment", {}).get(arm, {})
    return str(facts.get("message", "unknown"))[:80]
