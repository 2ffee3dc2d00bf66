"""`brief` and `robot-docs`: the contract in prose for a program, the brief
within a token budget (one line per verb, generated from the click tree), the
guide from `guide.py`."""

from __future__ import annotations

import math
import re

import click

from spoolctl.cli.contract import verb_commands
from spoolctl.cli.contract_flags import flag_of
from spoolctl.cli.options import SpoolCommand, json_option, verb
from spoolctl.cli.reply import Reply, emit
from spoolctl.errors import EXIT_CODES, EXIT_WORDS

BRIEF_BUDGET_TOKENS = 700
CHARS_PER_TOKEN = 3.5
COMMON_FLAGS = ("as_json", "db")
OPERATORS_VERBS = frozenset({"migrate", "copy-to", "web", "metrics", "prune", "schema"})
"""Verbs an operator runs by hand, rarely a program's loop: the brief lists
them without their flags (`schema --verb` and `--help` give every verb's),
so the loop's verbs keep theirs within the budget."""
WORKER_SETUP_FLAGS = frozenset({"gpu_spec", "memory_budget"})
"""A worker's inventory (`work --gpus`, `work --memory`): set once where a
worker is started, not in a program's loop; the brief leaves them out to
stay within its budget, `work --help` and `schema --verb work` give them."""
REQUEST_FLAGS = frozenset({"weight", "gpus", "gpu_memory_bytes", "gpu_model"})
"""The flags of a job's request (slots and GPUs): the brief leaves them out
to stay within its budget; `add --help` and `schema --verb add` give them."""
SHARED_LINES = {"signal": ("suspend", "continue")}
"""Verbs the brief lists on one line, the first's: they take the same
arguments, and the line's flags are the first's (the others take fewer)."""


def approx_tokens(text: str) -> int:
    """A conservative estimate: the larger of chars/3.5 and words-plus-punctuation."""
    pieces = len(re.findall(r"\w+|[^\w\s]", text))
    return max(math.ceil(len(text) / CHARS_PER_TOKEN), pieces)


def usage(name: str, command: SpoolCommand) -> str:
    parts = [name]
    for param in command.params:
        if isinstance(param, click.Argument) and isinstance(param.type, click.Choice):
            parts.append("|".join(map(str, param.type.choices)))  # the words it takes
        elif isinstance(param, click.Argument):
            parts.append(f"{(param.name or '').upper()}{'...' if param.nargs == -1 else ''}")
    flags = [
        flag_of(command, p.name or "")
        for p in command.params
        if isinstance(p, click.Option)
        and p.name not in COMMON_FLAGS
        and p.name not in REQUEST_FLAGS
        and p.name not in command.for_people
        and name not in OPERATORS_VERBS
        and p.name not in WORKER_SETUP_FLAGS
    ]
    if len(flags) == 1:
        parts.append(f"[{flags[0]}]")
    elif flags:  # brace form: one "--" for all, to stay within the brief's budget
        parts.append("[--{" + ",".join(f.removeprefix("--") for f in flags) + "}]")
    return " ".join(parts)


def short(text: str) -> str:
    """The first clause of a help line or code description."""
    first = text.split("\n")[0]
    for mark in (":", ";", " ("):
        first = first.split(mark)[0]
    return first.rstrip(".")


def brief_text() -> str:
    lines = [
        "spoolctl: durable queue of shell commands (SQLite or PostgreSQL).",
        "--json: stdout is one envelope {ok,data,errors[{code,message}],warnings,meta}. "
        "Exit: " + ", ".join(f"{k} {EXIT_WORDS[k]}" for k in EXIT_CODES) + ".",
        "--db PATH|postgresql://URL picks the queue. Verbs:",
    ]
    groups: dict[str, list[str]] = {}
    shared = {other for others in SHARED_LINES.values() for other in others}
    for name, command in verb_commands().items():
        if " " in name:  # a group's sub-verbs share one line: `- schedule {add,list}`
            group, sub = name.split(" ", 1)
            groups.setdefault(group, []).append(sub)
            continue
        if name in shared:
            continue
        names = "|".join([name, *SHARED_LINES.get(name, ())])
        lines.append(f"- {usage(names, command)}: {short(command.help or '')}")
    lines += [f"- {group} {{{','.join(subs)}}}" for group, subs in groups.items()]
    lines.append("Loop: add, work --drain, wait IDS, feedback ID.")
    lines.append("Any verb's flags: schema --verb VERB.")
    return "\n".join(lines)


@verb("brief", examples=("spoolctl brief", "spoolctl brief --json"))
@json_option
def brief(as_json: bool) -> int:
    """This summary, for programs: one line per verb (under 700 tokens)."""
    text = brief_text()
    data = {
        "text": text,
        "approx_tokens": approx_tokens(text),
        "budget_tokens": BRIEF_BUDGET_TOKENS,
    }
    return emit(Reply(data, text=text), as_json)


@verb("robot-docs", examples=("spoolctl robot-docs guide", "spoolctl robot-docs guide --json"))
@click.argument("topic", type=click.Choice(["guide"]))
@json_option
def robot_docs(topic: str, as_json: bool) -> int:
    """A longer guide for programs: workflows (topic guide)."""
    from spoolctl.cli.guide import guide_sections

    sections = guide_sections()
    text = "\n\n".join(
        s["title"] + "\n" + "\n".join(f"- {b}" for b in s["bullets"]) for s in sections
    )
    data = {"text": text, "approx_tokens": approx_tokens(text), "sections": sections}
    return emit(Reply(data, text=text), as_json)
