"""spoolctl is a drop-in successor of spoolctl 0.4.11: the same scenarios run
against both, each on a fresh queue of its own, and for every command line
ours gives the same exit code, the same error and warning codes, and every key
path of the original's data, meta, errors and warnings with the same JSON type
(see shapes.py), except the differences listed with their reasons in
allowed_differences.toml, which docs/json-contract.md renders.

The original is installed from the package registry into a cached virtual
environment of its own (reference.py); the scenarios are in scenarios.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from spoolctl import __version__
from tests.compat import allowed, runner
from tests.compat.reference import REFERENCE_VERSION, reference_python
from tests.compat.scenarios import SCENARIOS, Scenario, Step
from tests.compat.shapes import Answer, Difference, compare

# the first run builds the reference (a pip install)
pytestmark = [pytest.mark.timeout(600), pytest.mark.subprocess, pytest.mark.slow]

Found = tuple[str, str, Difference]  # (scenario, command, difference)


@pytest.fixture(scope="module")
def results() -> dict[str, list[list[dict[str, Any]]]]:
    implementations = (runner.reference(reference_python()), runner.ours())
    return runner.run_both(implementations)


@pytest.fixture(scope="module")
def found(results: dict[str, list[list[dict[str, Any]]]]) -> list[Found]:
    return [
        (scenario.name, runner.command_label(step), difference)
        for scenario in SCENARIOS
        for step, pair in zip(scenario.steps, results[scenario.name], strict=True)
        for difference in step_differences(step, *pair)
    ]


def step_differences(
    step: Step, original: dict[str, Any], ours: dict[str, Any]
) -> list[Difference]:
    if step.setup is None:
        return compare(
            runner.answer(original), runner.answer(ours), as_json=step.as_json, pins=step.pins
        )
    if original != ours:  # a stat step: the permission bits of a path
        path = str(step.setup["path"])
        return [Difference("mode", path, _mode(original), _mode(ours))]
    return []


def _mode(result: dict[str, Any]) -> str:
    mode = result.get("mode")
    return "absent" if mode is None else oct(mode)


def unexplained(found: list[Found], scenario: str) -> Iterator[str]:
    entries = allowed.load()
    for name, command, difference in found:
        if name == scenario and not any(e.covers(name, command, difference) for e in entries):
            yield f"{command}\n    {difference}"


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_same_contract_as_the_original(scenario: Scenario, found: list[Found]) -> None:
    problems = list(unexplained(found, scenario.name))
    assert not problems, (
        f"{len(problems)} difference(s) from {REFERENCE_VERSION} not in "
        "tests/compat/allowed_differences.toml (fix ours, or list it with its reason):\n"
        + "\n".join(problems)
    )


def test_every_allowed_difference_is_still_needed(found: list[Found]) -> None:
    """An entry that no scenario needs any more is removed, so the list stays
    the true list (and stays short)."""
    unused = [e.id for e in allowed.load() if not any(e.covers(s, c, d) for s, c, d in found)]
    assert unused == []


def test_both_sides_really_ran(results: dict[str, list[list[dict[str, Any]]]]) -> None:
    """The comparison is not vacuous: the reference is 0.4.11, ours is this
    checkout, every command line finished in time, and JSON steps answered JSON."""
    versions = set()
    for scenario in SCENARIOS:
        for step, pair in zip(scenario.steps, results[scenario.name], strict=True):
            if step.setup is not None:
                continue
            for result in pair:
                assert not result["timed_out"], (scenario.name, step.label)
                answer = Answer(result["exit"], result["stdout"], result["stderr"])
                if step.as_json:
                    envelope = answer.envelope()
                    if envelope is None:  # NDJSON frames
                        assert answer.frames(), (scenario.name, step.label, result)
                        continue
                    versions.add(envelope["tool_version"])
    assert versions == {REFERENCE_VERSION, __version__}


def test_every_verb_of_the_original_is_exercised() -> None:
    original_verbs = {
        "add",
        "work",
        "wait",
        "status",
        "list",
        "show",
        "retry",
        "cancel",
        "prune",
        "output",
        "feedback",
        "events",
        "config-show",
        "config-validate",
        "doctor",
        "brief",
        "schema",
        "capabilities",
        "robot-docs",
    }
    used = {step.argv[0] for s in SCENARIOS for step in s.steps if step.argv}
    assert original_verbs <= used


def test_the_docs_render_the_allowed_list() -> None:
    text = allowed.DOC.read_text(encoding="utf-8")
    assert allowed.rendered_section(text) == allowed.render(allowed.load()), (
        "docs/json-contract.md is stale: run .venv/bin/python -m tests.compat.allowed --write"
    )


def test_the_comparison_catches_what_it_promises() -> None:
    """shapes.compare itself: a removed key, a retyped value, another exit code,
    another error code and a changed pinned count are each reported."""
    original = {
        "ok": True,
        "data": {"n": 1, "ids": [1], "at": 1.5, "k": {"a": "x"}},
        "meta": {"elapsed_ms": 3},
        "errors": [],
        "warnings": [],
    }
    same = json.loads(json.dumps(original))
    same["data"]["extra"] = True  # more keys are fine
    same["data"]["at"] = 2  # an integer where the original had a float is fine
    ok = Answer(0, json.dumps(original), "")
    assert compare(ok, Answer(0, json.dumps(same), ""), as_json=True, pins=("data.n",)) == []

    broken = json.loads(json.dumps(original))
    del broken["data"]["k"]["a"]
    broken["data"]["n"] = "1"
    broken["meta"]["elapsed_ms"] = 3.5
    kinds = {
        (d.kind, d.where)
        for d in compare(ok, Answer(0, json.dumps(broken), ""), as_json=True, pins=("data.n",))
    }
    assert kinds == {
        ("missing", "data.k.a"),
        ("type", "data.n"),
        ("type", "meta.elapsed_ms"),
        ("value", "data.n"),
    }

    failed = {
        "ok": False,
        "data": None,
        "meta": {},
        "errors": [{"code": "CONFLICT"}],
        "warnings": [],
    }
    kinds = {d.kind for d in compare(ok, Answer(5, json.dumps(failed), ""), as_json=True)}
    assert {"exit", "error_code"} <= kinds


def test_pins_reach_into_lists_and_frames() -> None:
    """A pin names a list element (a null exit code in 0.4.11 is not "anything"
    in ours there) or an NDJSON frame (a follow that ends at once)."""
    original = {
        "ok": True,
        "data": {"attempts": [{"exit_code": None}]},
        "meta": {},
        "errors": [],
        "warnings": [],
    }
    signalled = json.loads(json.dumps(original))
    signalled["data"]["attempts"][0]["exit_code"] = -15
    pins = ("data.attempts[0].exit_code",)
    found = compare(
        Answer(0, json.dumps(original), ""),
        Answer(0, json.dumps(signalled), ""),
        as_json=True,
        pins=pins,
    )
    assert [(d.kind, d.where) for d in found] == [("value", "data.attempts[0].exit_code")]

    ended = Answer(0, json.dumps({"control": {"type": "end", "reason": "idle_timeout"}}), "")
    replayed = Answer(0, json.dumps({"id": 1, "event": "added"}) + "\n" + ended.stdout, "")
    pins = ("frames[[]*[]].control.reason",)
    found = compare(ended, replayed, as_json=True, pins=pins)
    assert ("value", "frames[0].control.reason") in {(d.kind, d.where) for d in found}
    assert compare(ended, ended, as_json=True, pins=pins) == []
