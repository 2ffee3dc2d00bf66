"""The contract describes itself truthfully: capabilities, schema, brief, the
guide and docs/verbs.md come from the click tree. That every verb's --json
output matches the schema it publishes is run for real in
tests/process/test_contract.py."""

from __future__ import annotations

import json
import re

import click

from spoolctl import validate
from spoolctl.cli.brief import SHARED_LINES
from spoolctl.cli.capabilities import capabilities_data
from spoolctl.cli.contract import contract_problems, verb_commands
from spoolctl.cli.docgen import verbs_markdown, with_env_table
from spoolctl.cli.verbs import available_verbs
from spoolctl.config import ENV_VARS
from spoolctl.errors import ERROR_CODES, EXIT_CODES, WARNING_CODES
from spoolctl.states import AttemptState, EventKind, FailureReason, JobState
from tests.helpers import REPO
from tests.populated import run_json


def test_docs_verbs_md_is_generated_from_the_click_tree() -> None:
    on_disk = (REPO / "docs" / "verbs.md").read_text(encoding="utf-8")
    assert on_disk == verbs_markdown(), "docs/verbs.md is stale: run python scripts/gen_docs.py"


def test_the_environment_table_is_generated_from_env_vars() -> None:
    page = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert page == with_env_table(page), "stale table: run python scripts/gen_docs.py"
    assert all(f"`{name}`" in page for name in ENV_VARS)


def test_every_verb_loads_and_has_a_data_schema() -> None:
    assert contract_problems() == []
    assert list(verb_commands()) and set(verb_commands()) == set(available_verbs())


def test_capabilities_publish_every_fact_from_its_single_source() -> None:
    caps = run_json("capabilities").envelope["data"]
    assert caps["job_states"] == [s.value for s in JobState]
    assert caps["attempt_states"] == [s.value for s in AttemptState]
    assert caps["failure_reasons"] == [s.value for s in FailureReason]
    assert caps["events"] == [s.value for s in EventKind]
    assert caps["error_codes"] == list(ERROR_CODES)
    registry = caps["code_registry"]
    assert {c: registry[c]["exit_code"] for c in caps["error_codes"]} == ERROR_CODES
    assert [w["code"] for w in caps["warning_codes"]] == list(WARNING_CODES)
    assert all(registry[w]["appears_in"] == ["warnings"] for w in WARNING_CODES)
    assert {k: v["meaning"] for k, v in caps["exit_codes"].items()} == {
        str(k): v for k, v in EXIT_CODES.items()
    }
    for name, limit in validate.LIMITS.items():
        assert json.loads(json.dumps(limit)).items() <= caps["limits"][name].items(), name
    assert caps["limits"]["id"]["maximum"] == 2**63 - 1
    assert caps["env"] == {name: var["description"] for name, var in ENV_VARS.items()}
    for name, var in ENV_VARS.items():  # "type" in 0.4.11's words: seconds -> float
        facts = {k: v for k, v in json.loads(json.dumps(var)).items() if k != "type"}
        assert facts.items() <= caps["env_vars"][name].items(), name
    for knob in ("SPOOLCTL_TEST_HEARTBEAT_INTERVAL", "SPOOLCTL_TEST_REAP_THRESHOLD"):
        assert {"default", "min_exclusive", "max"} <= set(caps["env_vars"][knob])
    assert caps["scheduling"]["backoff"]["first_delays_s"] == [2, 4, 8, 16, 32, 60, 60]
    assert caps["contract_version"] == "2"


def test_capabilities_verbs_mirror_every_click_parameter() -> None:
    published = capabilities_data()["verbs"]
    assert list(published) == list(verb_commands())
    for name, command in verb_commands().items():
        names = {p["param"] for p in published[name]["flags"] + published[name]["positionals"]}
        assert names == {p.name for p in command.params}, name
        options = {p["name"] for p in published[name]["options"]}
        assert options == {p.name for p in command.params if isinstance(p, click.Option)}, name
        flags = {f["name"]: f for f in published[name]["flags"]}
        assert flags["--json"]["type"] == "boolean"
        for flag in flags.values():  # every integer flag is bounded on both ends
            if flag["type"] == "integer":
                assert None not in (flag["minimum"], flag["maximum"]), (name, flag["name"])
    wait = {o["name"]: o for o in published["wait"]["options"]}
    assert wait["timeout"]["max"] == 86_400
    listing = {o["name"]: o for o in published["list"]["options"]}
    # the states, then `suspended` (running ones suspended), added at the end
    assert listing["state"]["choices"] == [*(s.value for s in JobState), "suspended"]
    assert published["add"]["flags"][0]["name"] == "--after", "0.4.11's order: by flag name"
    assert [a["name"] for a in published["show"]["args"]] == ["id"]
    assert listing["tags"]["repeatable"] is True
    assert (listing["limit"]["min"], listing["limit"]["max"]) == (0, 1000)
    assert ["--wait", "--follow"] in published["events"]["exclusive"]
    assert published["prune"]["traits"]["destructive"] is True
    assert published["status"]["traits"]["mutates"] is False


def test_brief_fits_its_budget_and_names_every_verb() -> None:
    data = run_json("brief").envelope["data"]
    assert data["approx_tokens"] < data["budget_tokens"] == 700
    assert len(data["text"]) < 700 * 3.5
    for name in verb_commands():
        if " " in name:  # a group's sub-verbs on one line: `- schedule {add,list,...}`
            group, sub = name.split(" ", 1)
            line = next(x for x in data["text"].splitlines() if x.startswith(f"- {group} {{"))
            assert sub in line.split("{", 1)[1].rstrip("}").split(",")
            continue
        shared = [n for n, others in SHARED_LINES.items() if name in others]
        listed = "|".join([shared[0], *SHARED_LINES[shared[0]]]) if shared else name
        assert f"- {listed}" in data["text"]


def test_guide_mentions_only_verbs_and_flags_that_exist() -> None:
    data = run_json("robot-docs", "guide").envelope["data"]
    assert [s["title"] for s in data["sections"]][:2] == [
        "Discover the contract",
        "Check local readiness",
    ]
    flags = {"--json", "--help", "--version"}
    for command in verb_commands().values():
        flags |= {f for p in command.params if isinstance(p, click.Option) for f in p.opts}
    assert set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", data["text"])) <= flags
    for name in re.findall(r"spoolctl ([a-z][a-z-]+)", data["text"]):
        assert name in verb_commands(), name


def test_schema_of_one_verb() -> None:
    data = run_json("schema", "--verb", "list").envelope["data"]
    assert list(data["verbs"]) == ["list"]
    assert data["dialect"].startswith("https://json-schema.org/")
    bad = run_json("schema", "--verb", "nope")
    assert bad.exit_code == 1 and bad.envelope["errors"][0]["code"] == "INVALID_INPUT"
