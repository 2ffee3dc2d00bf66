"""The contract describes itself truthfully: capabilities, schema, brief, the
guide and docs/verbs.md come from the click tree, and every verb's --json
output matches the schema it publishes."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import click
import pytest

from spoolctl import validate
from spoolctl.cli import available_verbs
from spoolctl.cli.capabilities import capabilities_data
from spoolctl.cli.contract import contract_problems, schema_data, verb_commands
from spoolctl.cli.docgen import verbs_markdown, with_env_table
from spoolctl.config import ENV_VARS
from spoolctl.errors import ERROR_CODES, EXIT_CODES, WARNING_CODES
from spoolctl.states import AttemptState, EventKind, FailureReason, JobState
from tests.helpers import REPO
from tests.populated import Populated, populate, run_json, run_quiet
from tests.schema_check import errors as schema_errors


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
    assert listing["state"]["choices"] == [s.value for s in JobState]
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
        assert f"- {name}" in data["text"]


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


def valid_envelope(result: Any, verb: str) -> dict[str, Any]:
    envelope = json.loads(result.stdout)
    published = schema_data()
    assert schema_errors(envelope, published["envelope_schema"]) == []
    if envelope["ok"]:
        assert schema_errors(envelope["data"], published["verbs"][verb]) == [], verb
    return envelope


def script(q: Populated, tmp: Path, pg_url: str) -> list[tuple[str, list[str], int]]:
    """A run of every verb (several shapes each), in an order that keeps state sane."""
    batch = tmp / "jobs.ndjson"
    batch.write_text('{"argv": ["true"]}\n{"cmd": "echo hi", "queue": "other"}\n')
    d = str(q.done)
    return [
        ("add", ["add", "--key", "k1", "--", "true"], 0),
        ("add", ["add", "--batch", str(batch)], 0),
        ("add", ["add", "--after-job", str(q.scheduled), "--", "true"], 0),
        ("add", ["add", "--after-job", d, "--after-job", str(q.dead), "--", "true"], 0),
        ("add", ["add", "--after-job-any", str(q.dead), "--", "true"], 0),
        (
            "schedule add",
            [
                "schedule add",
                "nightly",
                "--cron",
                "0 3 * * *",
                "--timezone",
                "UTC",
                "--tag",
                "team=ops",
                "--",
                "true",
            ],
            0,
        ),
        ("schedule add", ["schedule add", "ping", "--every", "1h", "-c", "true"], 0),
        ("schedule run", ["schedule run", "ping"], 0),
        ("schedule pause", ["schedule pause", "nightly", "--reason", "x"], 0),
        ("schedule list", ["schedule list"], 0),
        ("schedule show", ["schedule show", "ping"], 0),
        ("schedule resume", ["schedule resume", "nightly"], 0),
        ("schedule remove", ["schedule remove", "nightly"], 0),
        ("pause", ["pause", "other", "--reason", "deploy"], 0),
        ("pause", ["pause", "--all"], 0),
        ("work", ["work", "--drain", "--queue", "other"], 0),
        ("status", ["status"], 0),
        ("workers", ["workers"], 0),
        ("list", ["list", "--waiting"], 0),
        ("show", ["show", str(q.scheduled)], 0),
        ("feedback", ["feedback", str(q.scheduled)], 0),
        ("events", ["events"], 0),
        ("resume", ["resume", "other"], 0),
        ("resume", ["resume", "--all"], 0),
        ("work", ["work", "--once", "--queue", "nothing-here"], 0),
        ("wait", ["wait", d], 0),
        ("wait", ["wait", d, str(q.dead)], 6),
        ("status", ["status"], 0),
        ("metrics", ["metrics"], 0),
        ("list", ["list", "--tag", "team=ml"], 0),
        ("show", ["show", d], 0),
        ("output", ["output", d], 0),
        ("output", ["output", str(q.scheduled)], 0),
        ("feedback", ["feedback", str(q.dead)], 0),
        ("feedback", ["feedback", str(q.scheduled)], 0),
        ("events", ["events", "--limit", "3"], 0),
        ("events", ["events", "--since-id", "999", "--wait", "--wait-timeout", "0"], 0),
        ("workers", ["workers", "--all"], 0),
        ("retry", ["retry", str(q.dead)], 0),
        ("retry", ["retry", str(q.canceled), "--with-dependents"], 0),
        ("cancel", ["cancel", str(q.scheduled)], 0),
        ("prune", ["prune", "--older-than", "0", "--dry-run"], 0),
        ("prune", ["prune", "--older-than", "0", "--state", "canceled", "--yes"], 0),
        ("copy-to", ["copy-to", pg_url, "--dry-run"], 0),
        ("copy-to", ["copy-to", pg_url], 0),
        ("migrate", ["migrate", "--status"], 0),
        ("migrate", ["migrate", "--history"], 0),
        ("doctor", ["doctor"], 0),
        ("config-show", ["config-show"], 0),
        ("config-validate", ["config-validate"], 0),
        ("brief", ["brief"], 0),
        ("robot-docs", ["robot-docs", "guide"], 0),
        ("capabilities", ["capabilities"], 0),
        ("schema", ["schema"], 0),
    ]


@pytest.mark.subprocess
def test_every_verb_output_matches_its_published_schema(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pg_url: str
) -> None:
    monkeypatch.chdir(tmp_path)
    q = populate(tmp_path / "spool" / "queue.db")
    covered = set()
    for verb, args, expected in script(q, tmp_path, pg_url):
        result = run_quiet(*q.args(args[0], "--json", *args[1:]))
        assert result.exit_code == expected, (args, result.stdout, result.stderr)
        envelope = valid_envelope(result, verb)
        assert envelope["ok"], (args, envelope["errors"])
        covered.add(verb)
    # web serves until a signal: tests/test_web.py checks its frame and envelope against these
    assert covered == set(verb_commands()) - ({"migrate"} - set(available_verbs())) - {"web"}


@pytest.mark.subprocess
def test_follow_frames_match_the_published_stream_schemas(tmp_path: Path) -> None:
    q = populate(tmp_path / "queue.db")
    streams = schema_data()["streams"]
    for args, stream in (
        (["events", "--follow", "--since-id", "0", "--max-events", "2"], "events_follow"),
        (["events", "--follow", "--since-id", "999", "--idle-timeout", "0"], "events_follow"),
        (["output", str(q.done), "--follow"], "output_follow"),
    ):
        result = run_quiet(*q.args(args[0], "--json", *args[1:]))
        frames = [json.loads(line) for line in result.stdout.splitlines()]
        assert result.exit_code == 0 and frames[-1]["control"]["type"] == "end", result.stdout
        for frame in frames:
            assert schema_errors(frame, streams[stream]) == [], frame
