"""Turn the raw results into the summary table (also stored in the JSON),
with each target (bench/README.md, "What each number means") checked
against our numbers.

Cells read "median [min-max]" over the samples of one side; the ours/ref
column is the median [min-max] of the ratios of interleaved pairs (for times
lower is better, for jobs/s higher is better)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import report_light
import report_long
from cells import COLUMNS, Row
from cells import cell as _cell
from cells import ratio as _ratio
from cells import row as _row
from cells import verdict as _verdict

DRAIN_TARGET = {"disk": 1.5, "tmpfs": 2.0}
"""The 1,000-job drains' throughput over the reference's, per file system."""
DRAIN_LABELS = ("1 worker", "2 workers", "1 worker --concurrency 4")


def rows(results: dict[str, Any]) -> list[Row]:
    out: list[Row] = []
    builders: list[Callable[[dict[str, Any]], list[Row]]] = [
        _fresh_rows,
        _import_rows,
        _batch_rows,
        *report_light.builders(results),
        *(_drain_builder(name) for name in results if name.startswith("drain:")),
        _slow_rows,
        *(_pickup_builder(name) for name in results if name.startswith("pickup:")),
        _table_rows,
        _scrape_rows,
    ]
    for build in builders:
        try:
            out.extend(build(results))
        except (KeyError, TypeError, ZeroDivisionError, ValueError) as exc:
            out.append(_row(f"({build.__name__}: no result: {exc!r})", "ERROR"))
    return out


def _failed(results: dict[str, Any], name: str) -> list[Row]:
    if name not in results:
        return []
    return [_row(f"{name}: {results[name]['error'][:90]}", "ERROR")]


def _arm_errors(results: dict[str, Any], name: str) -> list[Row]:
    errors = results[name].get("errors") or {}
    return [_row(f"{name} / {arm}: {text[:90]}", "ERROR") for arm, text in errors.items()]


def _fs(result: dict[str, Any]) -> str:
    fs = result["filesystem"]
    return f"{fs['label']}: {fs['fstype']} {fs['mount_point']}"


def _fresh_rows(results: dict[str, Any]) -> list[Row]:
    fresh = results.get("fresh_process")
    if fresh is None or "error" in fresh:
        return _failed(results, "fresh_process")
    arms, ratios, over = fresh["arms"], fresh["ratios_ours_to_ref"], fresh["over_floor_s"]
    out = [
        _row(f"== fresh processes on {_fs(fresh)}"),
        _row("import floor: python -c 'import sqlalchemy, click': ms", _cell(arms["floor"], 1000)),
    ]
    for verb, label in (
        ("add", "add, fresh process: ms"),
        ("status", f"status --json, {fresh['read_queue_jobs']:,} jobs: ms"),
        ("list", f"list --limit 50, {fresh['read_queue_jobs']:,} jobs: ms"),
    ):
        ratio = ratios[verb].get("median")
        out.append(
            _row(
                label,
                _cell(arms[f"ours {verb}"], 1000),
                _cell(arms[f"ref {verb}"], 1000),
                _ratio(ratios[verb]),
                **_fresh_target(verb, ratio, over[f"ours {verb}"].get("median")),
            )
        )
        if verb != "add":
            out.append(
                _row(
                    f"  {verb}: ours - import floor, per pair: ms",
                    _cell(over[f"ours {verb}"], 1000),
                )
            )
    return out + _arm_errors(results, "fresh_process")


def _fresh_target(verb: str, ratio: float | None, over_floor: float | None) -> dict[str, str]:
    if ratio is None:
        return {}
    if verb == "add":
        return {"target": "<= 3.5x ref", "verdict": _verdict(ratio <= 3.5)}
    ok = ratio <= 2.5 or (over_floor is not None and over_floor <= 0.050)
    return {"target": "<= 2.5x ref or floor + 50 ms", "verdict": _verdict(ok)}


def _import_rows(results: dict[str, Any]) -> list[Row]:
    imp = results.get("import_time")
    if imp is None or "error" in imp:
        return _failed(results, "import_time")
    ours, ref = imp["ours"], imp["ref"]
    return [
        _row(
            "add: -X importtime total ms (one run)",
            f"{ours['total_ms']:.0f}",
            f"{ref['total_ms']:.0f}",
            f"{ours['total_ms'] / ref['total_ms']:.1f}x",
        ),
        _row(
            "add: alembic imported?",
            "yes" if ours["alembic_imported"] else "no",
            "-",
            target="no",
            verdict=_verdict(not ours["alembic_imported"]),
        ),
    ]


def _batch_rows(results: dict[str, Any]) -> list[Row]:
    batch = results.get("batch")
    if batch is None or "error" in batch:
        return _failed(results, "batch")
    ours = batch["ours"]["median_s"]
    ref = batch.get("ref_estimate_s")
    return [
        _row(
            f"add --batch {batch['jobs']:,} jobs: wall s",
            f"{ours:.2f}",
            f"~{ref:.0f} (estimate)" if ref is not None else "-",
            target="< 2 s",
            verdict=_verdict(ours < 2.0),
        )
    ]


def _drain_builder(name: str) -> Callable[[dict[str, Any]], list[Row]]:
    def _drain_rows(results: dict[str, Any]) -> list[Row]:
        drain = results[name]
        if "error" in drain:
            return _failed(results, name)
        head = [_row(f"== drain on {_fs(drain)}")]
        setups = _ceiling_rows(drain) + _drain_setup_rows(drain) + report_long.rows(drain)
        return head + setups + _arm_errors(results, name)

    return _drain_rows


def _ceiling_rows(drain: dict[str, Any]) -> list[Row]:
    lay, arms = drain["ceiling_layout"], drain["arms"]
    per_job = [d for d in lay["dirs"] if "{job}" in d]  # the others are shared
    files = (f"{len(per_job)} dirs + " if per_job else "") + f"{len(lay['files'])} files"
    return [
        _row(f"ceiling: {what}: /s", _cell(arms[arm]))
        for what, arm in (
            ("spawn `true` alone", "ceiling: spawn"),
            (f"spawn + {files} per job", "ceiling: spawn + files, 1 loop"),
            (f"spawn + {files}, 2 loops", "ceiling: spawn + files, 2 loops"),
        )
    ]


def _drain_setup_rows(drain: dict[str, Any]) -> list[Row]:
    out = []
    need = DRAIN_TARGET.get(drain["filesystem"]["label"], 1.5)
    for label in DRAIN_LABELS:
        ours = drain["arms"].get(f"ours {label}")
        if ours is None:
            continue
        ratio = drain["ratios_ours_to_ref"].get(label, {})
        target = {}
        if ratio.get("n"):
            target = {"target": f">= {need}x ref", "verdict": _verdict(ratio["median"] >= need)}
        out.append(
            _row(
                f"work --drain {drain['jobs']:,} true, {label}: jobs/s",
                _cell(ours),
                _cell(drain["arms"].get(f"ref {label}", {})),
                _ratio(ratio),
                ceiling=_fractions(drain, label),
                **target,
            )
        )
    rss = drain["peak_rss_mb"]
    out.append(
        _row(
            "worker peak RSS while draining: MB",
            f"{rss['ours']:.1f}",
            f"{rss['ref']:.1f}",
            target="< 60 MB",
            verdict=_verdict(0 < rss["ours"] < 60),
        )
    )
    return out


def _fractions(drain: dict[str, Any], label: str) -> str:
    cells = [drain["fraction_of_ceiling"].get(f"{impl} {label}", {}) for impl in ("ours", "ref")]
    if not all(c.get("n") for c in cells):
        return ""
    return " / ".join(f"{c['median']:.2f}" for c in cells)


def _slow_rows(results: dict[str, Any]) -> list[Row]:
    slow = results.get("slow")
    if slow is None:
        return []
    if "error" in slow:
        return _failed(results, "slow")
    jobs, slots, one, many = slow["jobs"], slow["slots"], "--concurrency 1", "--concurrency 8"
    speedup = slow["speedup"]
    head = f"== {jobs} jobs of `sleep 0.1`, one worker, on {_fs(slow)}"
    return [
        _row(head),
        *(
            _row(f"work --drain {arm}: wall s", _cell(slow["arms"][arm], fmt=".2f"))
            for arm in (one, many)
        ),
        _row(
            f"speedup of {slots} slots over 1 (ideal {slots}x): per pair",
            _ratio(speedup),
            target=f"about {slots}x",
            verdict=_verdict(bool(speedup.get("n")) and speedup["median"] >= 0.75 * slots),
        ),
        *_arm_errors(results, "slow"),
    ]


def _pickup_builder(name: str) -> Callable[[dict[str, Any]], list[Row]]:
    def _pickup_rows(results: dict[str, Any]) -> list[Row]:
        pick = results[name]
        if "error" in pick:
            return _failed(results, name)
        head = [_row(f"== idle worker on {_fs(pick)}")]
        return head + _latency_rows(pick) + _arm_errors(results, name)

    return _pickup_rows


def _latency_rows(pick: dict[str, Any]) -> list[Row]:
    ours, ref = pick["arms"]["ours"], pick["arms"]["ref"]
    checks: list[tuple[str, str, str, Callable[[float], bool] | None]] = [
        ("pickup latency p50: ms", "p50_ms", "<= 25 ms", lambda v: v <= 25),
        ("pickup latency p95: ms", "p95_ms", "<= 100 ms", lambda v: v <= 100),
        ("job start - submit time, p50: ms", "from_submit_p50_ms", "", None),
        ("job start - submit time, p95: ms", "from_submit_p95_ms", "", None),
    ]
    out = [
        _row(
            metric,
            f"{ours[key]:.1f}",
            f"{ref[key]:.1f}",
            _ratio(pick["ratios_ours_to_ref"]) if key == "p50_ms" else "",
            target=target,
            verdict="" if ok is None else _verdict(ok(ours[key])),
        )
        for metric, key, target, ok in checks
    ]
    idle = pick["idle_cpu_pct_of_core"]
    out.append(
        _row(
            f"idle worker CPU, same {pick['idle_window_s']:.0f} s window: % of a core",
            f"{idle['ours']:.2f}",
            f"{idle['ref']:.2f}",
            target="< 1 %",
            verdict=_verdict(idle["ours"] < 1),
        )
    )
    return out


def _table_rows(results: dict[str, Any]) -> list[Row]:
    growth = results.get("table_growth")
    if growth is None or "error" in growth:
        return _failed(results, "table_growth")
    out = [_row(f"== jobs table growth on {_fs(growth)} (ours / ref columns: 1k -> 100k)")]
    label = {"claim": "claim (in-process)", "status": "status --json", "list": "list --limit 50"}
    for key, unit, scale in (("claim", "us", 1e6), ("status", "ms", 1e3), ("list", "ms", 1e3)):
        cells = [_growth_cell(growth[impl], key, scale) for impl in ("ours", "ref")]
        ratio = growth["ours"]["ratios_big_to_small"][key]
        out.append(
            _row(
                f"{label[key]}: {unit}, 1k -> 100k jobs (100k/1k)",
                *cells,
                target="100k <= 1.3x 1k",
                verdict="ERROR" if ratio is None else _verdict(ratio <= 1.3),
            )
        )
    return out


def _scrape_rows(results: dict[str, Any]) -> list[Row]:
    """A metrics scrape at 1k and 100k jobs (bench/scrape.py): ours only."""
    found = results.get("metrics_scrape")
    if found is None or "error" in found:
        return _failed(results, "metrics_scrape")
    out = [_row(f"== metrics scrape on {_fs(found)} (1k -> 100k jobs, ms, median; ours only)")]
    sizes = found["sizes"]
    small, big = (sizes[s] for s in sorted(sizes, key=int))
    labels = {
        "warm_s": "scrape as /metrics serves it (in-process, kept totals)",
        "cold_s": "scrape by a fresh scraper (in-process, full count)",
        "process_s": "spoolctl metrics --json (fresh process)",
    }
    for key, label in labels.items():
        ratio = found["ratios_big_to_small"][key]
        cell = (
            f"{small[key]['median_s'] * 1e3:.1f} -> {big[key]['median_s'] * 1e3:.1f} ({ratio:.2f}x)"
        )
        if key == "warm_s":
            p95 = big[key]["p95_s"]
            out.append(
                _row(
                    f"{label}; p95 at 100k {p95 * 1e3:.1f} ms",
                    cell,
                    target="100k p95 < 50 ms",
                    verdict=_verdict(p95 < 0.05),
                )
            )
        else:
            out.append(_row(label, cell))
    return out


def _growth_cell(impl_result: dict[str, Any], key: str, scale: float) -> str:
    sizes = impl_result["sizes"]
    small, big = (sizes[s][key] for s in sorted(sizes, key=int))
    if "median_s" not in small or "median_s" not in big:
        return "ERROR"
    ratio = impl_result["ratios_big_to_small"][key]
    return f"{small['median_s'] * scale:.0f} -> {big['median_s'] * scale:.0f} ({ratio:.2f}x)"


def render(
    table: list[Row],
    machine: dict[str, Any],
    foreign: dict[str, float | None],
    filesystems: list[dict[str, str]],
    skipped: dict[str, str],
) -> str:
    widths = {k: max([len(COLUMNS[k]), *(len(r[k]) for r in table)]) for k in COLUMNS}
    line = "  ".join("{:" + str(widths[k]) + "}" for k in COLUMNS)
    text = [line.format(*COLUMNS.values()), line.format(*("-" * widths[k] for k in COLUMNS))]
    text += [line.format(*(r[k] for k in COLUMNS)).rstrip() for r in table]
    text.append("")
    text.append(
        "cells: median [min..max]; ours/ref: median [min..max] of the ratios of interleaved "
        "pairs; of ceiling: drain jobs/s over the spawn + files ceiling measured beside it "
        "(ours / ref); ours per job (long drains): wall = 1000 / jobs/s, and the workers' "
        "time (wall x workers) split by their own timings into database + spawn + the rest"
    )
    text.append(
        f"machine: {machine['cpu_model']}, {machine['cpu_count']} CPUs, "
        f"{machine['memory_total_mb']} MB, kernel {machine['kernel']}, "
        f"python {machine['python']}, sqlite {machine['sqlite']}"
    )
    text.append(
        "file systems: "
        + "; ".join(
            f"{f['label']} = {f['fstype']} on {f['mount_point']} ({f['root']})" for f in filesystems
        )
        + "".join(f"; {k} skipped: {v}" for k, v in skipped.items())
    )
    if foreign:
        text.append(
            "cores busy with other work than this benchmark, per scenario (noise): "
            + ", ".join(f"{k} {v:.2f}" for k, v in foreign.items() if v is not None)
        )
    return "\n".join(text)


def import_summary(results: dict[str, Any]) -> str:
    """What `add` imports (python -X importtime), for the people optimising it."""
    imp = results.get("import_time")
    if imp is None or "error" in imp:
        return ""
    lines = []
    for name in ("ours", "ref"):
        s = imp[name]
        lines.append(
            f"add imports, {name}: {s['total_ms']:.0f} ms under -X importtime, "
            f"{s['module_count']} modules ({s['sqlalchemy_modules']} sqlalchemy), "
            f"flagged: {', '.join(s['flagged_imports']) or 'none'}"
        )
    top = imp["ours"]["top10_self"]
    lines.append(
        "  ours, top 10 by own time: " + ", ".join(f"{m['module']} {m['self_ms']:.1f}" for m in top)
    )
    top = imp["ours"]["top10_toplevel_cumulative"]
    lines.append(
        "  ours, top-level imports by cumulative ms: "
        + ", ".join(f"{m['module']} {m['cumulative_ms']:.0f}" for m in top)
    )
    return "\n".join(lines)
