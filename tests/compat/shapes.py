"""How one command's answer from the original is compared with ours.

The floor (docs/design.md, The contract and how it grows): the same exit
code, the same error codes and warning codes, and every key path of the
original's `data` and `meta` present in ours with the same JSON type. Values
are not compared (ids, timestamps, paths and pids differ between two runs),
except under paths a scenario pins, where the values are the point (a count
of done jobs must be the same count).

An integer in the original must stay an integer in ours; a float in the
original may be any number in ours; where the original says null (a nullable
field with nothing to say this time), ours may say null or more. Lists are
compared element by element: lists of objects that carry a string `name` or
`id` (flags, checks) are matched by it, other lists by position; ours may hold
more elements. A list of plain values (strings, numbers) may be shorter in ours:
how many there are is a value, not a shape; their types still must match.
Pins reach into lists by index (`data.attempts[0].exit_code`) and into NDJSON
frames (`frames[0].control.reason`).
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass
from typing import Any

IDENTITY_KEYS = ("name", "id")


@dataclass(frozen=True)
class Difference:
    """One way ours answers differently; `where` is a key path or an aspect."""

    kind: str  # exit | error_code | warning_code | missing | type | value | envelope | mode
    where: str
    original: str
    ours: str

    def __str__(self) -> str:
        return f"{self.kind} at {self.where}: 0.4.11 gives {self.original}, ours {self.ours}"


def json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def same_kind(original: Any, ours: Any) -> bool:
    want, got = json_kind(original), json_kind(ours)
    return want == got or want == "null" or (want == "number" and got == "integer")


def shape_differences(original: Any, ours: Any, path: str) -> list[Difference]:
    if not same_kind(original, ours):
        return [Difference("type", path, json_kind(original), json_kind(ours))]
    if isinstance(original, dict):
        found: list[Difference] = []
        for key, value in original.items():
            if key not in ours:
                found.append(Difference("missing", f"{path}.{key}", json_kind(value), "absent"))
            else:
                found += shape_differences(value, ours[key], f"{path}.{key}")
        return found
    if isinstance(original, list):
        return list_differences(original, ours, path)
    return []


def identity(items: list[Any]) -> str | None:
    """The key that names each object of a list (`name`, or a string `id`)."""
    for key in IDENTITY_KEYS:
        if items and all(isinstance(i, dict) and isinstance(i.get(key), str) for i in items):
            return key
    return None


def list_differences(original: list[Any], ours: list[Any], path: str) -> list[Difference]:
    key = identity(original)
    if key is not None:
        by_name = {i[key]: i for i in ours if isinstance(i, dict) and key in i}
        found = []
        for item in original:
            name = item[key]
            where = f"{path}[{key}={name}]"
            if name not in by_name:
                found.append(Difference("missing", where, "object", "absent"))
            else:
                found += shape_differences(item, by_name[name], where)
        return found
    found = []
    for index, item in enumerate(original):
        if index >= len(ours) and not isinstance(item, dict | list):
            break  # a list of values: how many is a value, their type is the shape
        if index >= len(ours):
            found.append(
                Difference("missing", f"{path}[{index}]", json_kind(item), f"{len(ours)} items")
            )
        else:
            found += shape_differences(item, ours[index], f"{path}[{index}]")
    return found


def pinned_differences(original: Any, ours: Any, pins: tuple[str, ...]) -> list[Difference]:
    """Values that must be equal: every leaf of `original` under a pinned path."""
    found = []
    for path, value in leaves(original, ""):
        if any(path == p or path.startswith(p + ".") or fnmatch.fnmatch(path, p) for p in pins):
            theirs = lookup(ours, path)
            if theirs != value:
                found.append(Difference("value", path, json.dumps(value), json.dumps(theirs)))
    return found


def leaves(value: Any, path: str) -> list[tuple[str, Any]]:
    """(path, value) of every leaf; list elements are `path[i]`, so a pin can
    name one (`data.attempts[0].exit_code`), and an empty list is a leaf."""
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in leaves(v, f"{path}.{k}" if path else k)]
    if isinstance(value, list) and value:
        return [leaf for i, v in enumerate(value) for leaf in leaves(v, f"{path}[{i}]")]
    return [(path, value)]


def lookup(value: Any, path: str) -> Any:
    """The value at a path `leaves` names, or "<absent>"."""
    for part in path.split("."):
        key, *indexes = part.split("[")
        steps: list[str | int] = [key] if key else []
        steps += [int(i.rstrip("]")) for i in indexes]
        for step in steps:
            if isinstance(step, int):
                if not isinstance(value, list) or step >= len(value):
                    return "<absent>"
            elif not isinstance(value, dict) or step not in value:
                return "<absent>"
            value = value[step]
    return value


def codes(items: Any) -> list[str]:
    return sorted(i.get("code", "?") for i in items or [] if isinstance(i, dict))


@dataclass
class Answer:
    """One command's observable result under one implementation."""

    exit: int
    stdout: str
    stderr: str
    timed_out: bool = False

    def frames(self) -> list[Any] | None:
        try:
            return [json.loads(line) for line in self.stdout.splitlines() if line.strip()]
        except ValueError:
            return None

    def envelope(self) -> dict[str, Any] | None:
        try:
            parsed = json.loads(self.stdout)
        except ValueError:
            return None
        return parsed if isinstance(parsed, dict) and "ok" in parsed else None


def compare(
    original: Answer, ours: Answer, *, as_json: bool, pins: tuple[str, ...] = ()
) -> list[Difference]:
    found: list[Difference] = []
    if "Traceback (most recent call last)" in ours.stderr + ours.stdout:
        found.append(Difference("envelope", "stderr", "no traceback", "a traceback"))
    if ours.timed_out or original.exit != ours.exit:
        found.append(Difference("exit", "exit", str(original.exit), str(ours.exit)))
    if not as_json:
        return found  # text is for people (docs/design.md): only the exit code is contract
    theirs, mine = original.envelope(), ours.envelope()
    if theirs is None:  # NDJSON frames (events --follow): compared frame by frame
        frames = original.frames()
        if frames:
            mine_frames = ours.frames() or []
            found += shape_differences(frames, mine_frames, "frames")
            found += pinned_differences({"frames": frames}, {"frames": mine_frames}, pins)
        return found
    if mine is None:
        return [
            *found,
            Difference("envelope", "stdout", "one JSON object", repr(ours.stdout[:200])),
        ]
    if codes(theirs.get("errors")) != codes(mine.get("errors")):
        found.append(
            Difference(
                "error_code",
                "errors",
                str(codes(theirs.get("errors"))),
                str(codes(mine.get("errors"))),
            )
        )
    if codes(theirs.get("warnings")) != codes(mine.get("warnings")):
        found.append(
            Difference(
                "warning_code",
                "warnings",
                str(codes(theirs.get("warnings"))),
                str(codes(mine.get("warnings"))),
            )
        )
    for part in ("ok", "data", "meta", "errors", "warnings"):
        found += shape_differences(theirs.get(part), mine.get(part), part)
    found += pinned_differences({"data": theirs.get("data")}, {"data": mine.get("data")}, pins)
    return found
