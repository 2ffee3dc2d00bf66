"""How one click parameter is published in the contract: its type word, bounds,
default and what a malformed value of it gets back, read from the parameter
itself (and its ParamType's `contract_info`), so no flag is described twice."""

from __future__ import annotations

import math
from typing import Any

import click

from spoolctl.cli.contract_policy import ARG_NAMES, EXPECT_INPUT, EXPECT_MISSING
from spoolctl.cli.options import SpoolCommand


def jsonable(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def param_info(param: click.Parameter) -> dict[str, Any]:
    """One flag or positional as the contract publishes it."""
    describe = getattr(param.type, "contract_info", param.type.to_info_dict)
    type_info = {k: jsonable(v) for k, v in describe().items()}
    declared = param.to_info_dict()
    info: dict[str, Any] = {
        "name": param.name,
        "kind": "option" if isinstance(param, click.Option) else "argument",
        "type": type_info,
        "required": param.required,
        "repeatable": bool(getattr(param, "multiple", False)) or param.nargs == -1,
        "default": jsonable(declared.get("default")),
    }
    if isinstance(param, click.Option):
        info["flags"] = list(param.opts) + list(param.secondary_opts)
        info["is_flag"] = param.is_flag
        info["help"] = param.help or ""
    else:
        info["metavar"] = (param.name or "").upper()
    for key in ("min", "max", "min_exclusive", "min_length", "max_length", "choices"):
        if key in type_info:
            info[key] = type_info[key]
    return info


# click's type names -> the type vocabulary of 0.4.11's contract
TYPE_WORDS = {
    "integer": "integer",
    "id": "integer",
    "seconds": "float",
    "duration": "duration",
    "timestamp": "timestamp",
    "queue": "queue",
    "key=value": "key_value",
    "states": "enum_csv",
    "choice": "enum",
    "boolean": "boolean",
    "timeout": "integer",
    "path": "path",
}
EXTRA_TYPE_KEYS = ("grammar", "key_maximum", "value_maximum", "maximum_items", "charset")


def type_word(param: click.Parameter, info: dict[str, Any]) -> str:
    if isinstance(param, click.Option) and param.is_flag:
        return "boolean"
    if param.name == "db":
        return "path"
    name = str(info["type"].get("name") or info["type"].get("param_type", "")).lower()
    if name == "path" and param.name != "db":
        return "string"
    return TYPE_WORDS.get(name, "string")


def malformed(word: str, param: click.Parameter) -> dict[str, Any]:
    """What a probe of each kind gets back (the contract's failure table): every
    malformed value is INVALID_INPUT, a missing required positional
    MISSING_REQUIRED."""
    if word == "boolean":
        return {}
    missing = (
        EXPECT_MISSING if isinstance(param, click.Argument) and param.required else (EXPECT_INPUT)
    )
    found = {
        "missing_value": missing,
        "bad_type": EXPECT_INPUT,
        "out_of_range": EXPECT_INPUT,
        "empty_string": EXPECT_INPUT,
        "too_long": EXPECT_INPUT,
    }
    if isinstance(param, click.Option):
        found["value_is_another_flag"] = EXPECT_INPUT
    if word == "path":
        found["bad_path"] = EXPECT_INPUT
    return found


def published_default(param: click.Parameter, info: dict[str, Any]) -> Any:
    """The default as the verb sees it (a string default parsed by its type)."""
    value = info["default"]
    if info["repeatable"] and value is None:
        return []
    check = getattr(param.type, "check", None)
    if isinstance(value, str) and check is not None:
        parsed = check(value)
        return parsed if isinstance(parsed, int | float | str) else value
    return value


def flag_entry(param: click.Parameter) -> dict[str, Any]:
    """A parameter in 0.4.11's shape (name is the flag as typed), plus ours."""
    info = param_info(param)
    word = type_word(param, info)
    low = info.get("min", info.get("min_exclusive", info.get("min_length")))
    high = info.get("max", info.get("max_length"))
    opts = info.get("flags", [param.name or ""])
    if low is None and word in ("string", "path"):
        low = 1 if param.required else 0
    entry = {
        **info,
        "param": param.name,
        "default": published_default(param, info),
        "name": ARG_NAMES.get(param.name or "", opts[0])
        if isinstance(param, click.Argument)
        else opts[0],
        "flag": opts[0],
        "aliases": sorted(opts),
        "type": word,
        "type_info": info["type"],
        "choices": info.get("choices"),
        "minimum": None if word == "boolean" else low,
        "maximum": None if word == "boolean" else high,
        "unbounded": word not in ("boolean", "enum", "enum_csv") and high is None,
        "value_required": not info.get("is_flag", False),
        "malformed_expectations": malformed(word, param),
    }
    entry.update({k: info["type"][k] for k in EXTRA_TYPE_KEYS if k in info["type"]})
    if word in ("string", "path"):
        entry["unbounded_reason"] = (
            "bounded by the operating system and SQLite only"
            if high is None
            else f"bounded: at most {high} characters"
        )
    if isinstance(param, click.Argument):
        entry["nargs"] = "remainder" if param.nargs == -1 else str(param.nargs)
    return entry


def flag_of(command: SpoolCommand, name: str) -> str:
    for param in command.params:
        if param.name == name and isinstance(param, click.Option):
            return max(param.opts, key=len)
    return name
