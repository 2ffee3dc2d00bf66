"""Turn the raw results into the summary table (also stored in the JSON),
with each SPEC section 6 target checked against our numbers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Row = dict[str, str]


def rows(results: dict[str, Any]) -> list[Row]:
    out: list[Row] = []
    for build in (_add_rows, _batch_rows, _drain_rows, _pickup_rows, _table_rows, _spawn_rows):
        try:
            out.extend(build(results))
        except (KeyError, TypeError, ZeroDivisionError) as exc:
            out.append(_row(f"({build.__name__[1:]}: no result: {exc!r})", "ERROR", "", "", "", ""))
    return out


def _row(metric: str, ours: str, ref: str, ratio: str, target: str, verdict: str) -> Row:
    return {
        "metric": metric,
        "ours": ours,
        "ref": ref,
        "ratio": ratio,
        "target": target,
        "verdict": verdict,
    }


def _verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def _failed(results: dict[str, Any], name: str) -> list[Row]:
    if name not in results:
        return []
    return [_row(f"{name}: {results[name]['error'][:90]}", "ERROR", "", "", "", "")]


def _add_rows(results: dict[str, Any]) -> list[Row]:
    out: list[Row] = []
    add = results.get("add_process")
    if add is not None and "error" not in add:
        ratio = add["ratio_ours_to_ref"]
        out.append(
            _row(
                "add, fresh process: wall ms (median)",
                _ms(add["ours"]["median_s"]),
                _ms(add["ref"]["median_s"]),
                f"{ratio:.2f}x",
                "<= 3.5x ref",
                _verdict(ratio <= 3.5),
            )
        )
    else:
        out += _failed(results, "add_process")
    imp = results.get("import_time")
    if imp is not None and "error" not in imp:
        ours, ref = imp["ours"], imp["ref"]
        out.append(
            _row(
                "add: -X importtime total ms",
                f"{ours['total_ms']:.0f}",
                f"{ref['total_ms']:.0f}",
                f"{ours['total_ms'] / ref['total_ms']:.1f}x",
                "",
                "",
            )
        )
        out.append(
            _row(
                "add: alembic imported?",
                "yes" if ours["alembic_imported"] else "no",
                "-",
                "",
                "no",
                _verdict(not ours["alembic_imported"]),
            )
        )
    else:
        out += _failed(results, "import_time")
    return out


def _batch_rows(results: dict[str, Any]) -> list[Row]:
    batch = results.get("batch")
    if batch is None or "error" in batch:
        return _failed(results, "batch")
    ours = batch["ours"]["median_s"]
    ref = batch.get("ref_estimate_s")
    ref_text = f"~{ref:.0f} (estimate)" if ref is not None else "-"
    return [
        _row(
            f"add --batch {batch['jobs']:,} jobs: wall s",
            f"{ours:.2f}",
            ref_text,
            "",
            "< 2 s",
            _verdict(ours < 2.0),
        )
    ]


def _drain_rows(results: dict[str, Any]) -> list[Row]:
    drain = results.get("drain")
    if drain is None or "error" in drain:
        return _failed(results, "drain")
    out = []
    ratios = drain.get("ratios_ours_to_ref", {})
    for label in ("1 worker", "2 workers", "1 worker --concurrency 4"):
        ours, ref = drain["ours"].get(label, {}), drain["ref"].get(label, {})
        ratio = ratios.get(label)
        target = "" if label.endswith("4") else ">= 1.5x ref"
        verdict = "" if ratio is None or not target else _verdict(ratio >= 1.5)
        out.append(
            _row(
                f"work --drain, {label}: jobs/s",
                _rate(ours),
                _rate(ref),
                "" if ratio is None else f"{ratio:.2f}x",
                target,
                verdict,
            )
        )
    rss_ours, rss_ref = drain["ours"]["peak_rss_mb"], drain["ref"]["peak_rss_mb"]
    out.append(
        _row(
            "worker peak RSS while draining: MB",
            f"{rss_ours:.1f}",
            f"{rss_ref:.1f}",
            "",
            "< 60 MB",
            _verdict(rss_ours < 60),
        )
    )
    return out


def _pickup_rows(results: dict[str, Any]) -> list[Row]:
    pick = results.get("pickup_idle")
    if pick is None or "error" in pick:
        return _failed(results, "pickup_idle")
    ours, ref = pick["ours"], pick["ref"]
    checks: list[tuple[str, str, str, Callable[[float], bool] | None]] = [
        ("pickup latency p50: ms", "pickup_p50_ms", "<= 25 ms", lambda v: v <= 25),
        ("pickup latency p95: ms", "pickup_p95_ms", "<= 100 ms", lambda v: v <= 100),
        ("job start - submit time, p50: ms", "from_submit_p50_ms", "", None),
        ("job start - submit time, p95: ms", "from_submit_p95_ms", "", None),
        ("idle worker CPU: % of one core", "idle_cpu_pct_of_core", "< 1 %", lambda v: v < 1),
    ]
    return [
        _row(
            metric,
            f"{ours[key]:.1f}",
            f"{ref[key]:.1f}",
            "",
            target,
            "" if ok is None else _verdict(ok(ours[key])),
        )
        for metric, key, target, ok in checks
    ]


def _table_rows(results: dict[str, Any]) -> list[Row]:
    growth = results.get("table_growth")
    if growth is None or "error" in growth:
        return _failed(results, "table_growth")
    out = []
    label = {"claim": "claim (in-process)", "status": "status --json", "list": "list --limit 50"}
    for key, unit, scale in (("claim", "us", 1e6), ("status", "ms", 1e3), ("list", "ms", 1e3)):
        cells = [_growth_cell(growth[impl], key, scale) for impl in ("ours", "ref")]
        ratio = growth["ours"]["ratios_big_to_small"][key]
        out.append(
            _row(
                f"{label[key]}: {unit}, 1k -> 100k jobs",
                *cells,
                "" if ratio is None else f"{ratio:.2f}x",
                "100k <= 1.3x 1k",
                "ERROR" if ratio is None else _verdict(ratio <= 1.3),
            )
        )
    return out


def _growth_cell(impl_result: dict[str, Any], key: str, scale: float) -> str:
    sizes = impl_result["sizes"]
    small, big = (sizes[s][key] for s in sorted(sizes, key=int))
    if "median_s" not in small or "median_s" not in big:
        return "ERROR"
    ratio = impl_result["ratios_big_to_small"][key]
    return f"{small['median_s'] * scale:.0f} -> {big['median_s'] * scale:.0f} ({ratio:.2f}x)"


def _spawn_rows(results: dict[str, Any]) -> list[Row]:
    spawn = results.get("spawn_baseline")
    if spawn is None or "error" in spawn:
        return _failed(results, "spawn_baseline")
    return [
        _row(
            "bare subprocess.run(['true']) per s (context)",
            f"{spawn['spawns_per_s']:.0f}",
            "",
            "",
            "",
            "",
        )
    ]


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f}"


def _rate(cell: dict[str, Any]) -> str:
    if "median_jobs_per_s" in cell:
        return f"{cell['median_jobs_per_s']:.0f}"
    return "n/a" if "unsupported" in cell else "-"


def render(table: list[Row], machine: dict[str, Any], foreign: dict[str, float | None]) -> str:
    heads = {
        "metric": "metric",
        "ours": "ours",
        "ref": "ref 0.4.11",
        "ratio": "ours/ref",
        "target": "target",
        "verdict": "",
    }
    widths = {k: max(len(heads[k]), *(len(r[k]) for r in table)) for k in heads}
    line = "  ".join("{:" + str(widths[k]) + "}" for k in heads)
    text = [line.format(*heads.values()), line.format(*("-" * widths[k] for k in heads))]
    text += [line.format(*(r[k] for k in heads)) for r in table]
    text.append("")
    text.append(
        f"machine: {machine['cpu_model']}, {machine['cpu_count']} CPUs, "
        f"{machine['memory_total_mb']} MB, kernel {machine['kernel']}, "
        f"python {machine['python']}, sqlite {machine['sqlite']}, {machine['filesystem_of_tmp']}"
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
