"""docs/verbs.md, generated from the same click tree and schemas as
`capabilities`; `scripts/gen_docs.py` writes it and a test keeps it current."""

from __future__ import annotations

import shlex
from typing import Any

from spoolctl.cli.contract import capabilities_data

HEADER = """# spoolctl verb reference

Generated from the click command tree by `python scripts/gen_docs.py`; do not
edit by hand. Every verb also takes `--json` (one envelope on stdout) and
`-h/--help`; verbs that touch the queue take `--db PATH`.
"""


def bounds(option: dict[str, Any]) -> str:
    parts = []
    if "choices" in option:
        parts.append("|".join(option["choices"]))
    if option.get("min") is not None:
        parts.append(f"≥ {option['min']}")
    if option.get("min_exclusive") is not None:
        parts.append(f"> {option['min_exclusive']}")
    if option.get("max") is not None:
        parts.append(f"≤ {option['max']}")
    if option.get("max_length") is not None:
        parts.append(f"{option.get('min_length', 0)}–{option['max_length']} chars")
    return ", ".join(parts)


def option_row(option: dict[str, Any]) -> str:
    flags = ", ".join(f"`{f}`" for f in option["flags"])
    kind = "flag" if option["is_flag"] else option["type"]["name"]
    value = option["default"]
    default = "" if value is None or value is False or value == [] else f"`{value}`"
    more = " (repeatable)" if option["repeatable"] and "repeatable" not in option["help"] else ""
    more += " (required)" if option["required"] else ""
    cells = [flags, kind, default, bounds(option), option["help"] + more]
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def verb_section(verb: dict[str, Any]) -> list[str]:
    lines = [f"## {verb['name']}", "", verb["summary"], ""]
    positionals = " ".join(
        p["metavar"] + ("..." if p["repeatable"] else "") for p in verb["positionals"]
    )
    lines += [
        f"Usage: `spoolctl {verb['name']}{' ' + positionals if positionals else ''} [OPTIONS]`",
        "",
    ]
    options = [o for o in verb["options"] if o["name"] not in ("as_json", "db")]
    if options:
        lines += ["| flag | type | default | bounds | meaning |", "|---|---|---|---|---|"]
        lines += [option_row(o) for o in options]
        lines.append("")
    traits = (
        ", ".join(k if v is True else f"{k} {v}" for k, v in verb["traits"].items() if v)
        or "read-only"
    )
    lines.append(f"Traits: {traits}. Exit codes: {', '.join(map(str, verb['exit_codes']))}.")
    if verb["exclusive"]:
        pairs = "; ".join(f"`{a}` / `{b}`" for a, b in verb["exclusive"])
        lines.append(f"Mutually exclusive: {pairs}.")
    lines += ["", f"JSON data: `{verb['data_schema']}`", ""]
    if verb["examples"]:
        lines += ["```", *(shlex.join(e) for e in verb["examples"]), "```", ""]
    return lines


def verbs_markdown() -> str:
    caps = capabilities_data()
    lines = [HEADER]
    for verb in caps["verbs"].values():
        lines += verb_section(verb)
    return "\n".join(lines).rstrip("\n") + "\n"
