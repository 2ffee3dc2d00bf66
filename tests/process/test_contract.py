"""Every verb's --json output, run for real, matches the schema it publishes,
and so does every frame of a --follow stream. That the contract itself comes
from the click tree is in tests/unit/test_contract.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from spoolctl.cli.contract import schema_data, verb_commands
from spoolctl.cli.verbs import available_verbs
from tests.helpers import add_job, run_as_worker
from tests.populated import Populated, populate, run_quiet
from tests.schema_check import errors as schema_errors


def valid_envelope(result: Any, verb: str) -> dict[str, Any]:
    envelope = json.loads(result.stdout)
    published = schema_data()
    assert schema_errors(envelope, published["envelope_schema"]) == []
    if envelope["ok"]:
        assert schema_errors(envelope["data"], published["verbs"][verb]) == [], verb
    return envelope


def script(q: Populated, tmp: Path, pg_url: str) -> list[tuple[str, list[str], int]]:
    """A run of every verb (several shapes each), in an order that keeps state sane.
    Two jobs are made running as a claim leaves them (one suspended), for the
    requests to a running job (`--no-wait`: no worker delivers them)."""
    running = add_job(q.db, "sleep", "100", lane="steered")
    suspended = add_job(q.db, "sleep", "101", lane="steered")
    run_as_worker(q.db, running, suspended=False)
    run_as_worker(q.db, suspended, suspended=True)
    batch = tmp / "jobs.ndjson"
    batch.write_text('{"argv": ["true"]}\n{"cmd": "echo hi", "queue": "other"}\n')
    d = str(q.done)
    return [
        ("add", ["add", "--key", "k1", "--", "true"], 0),
        ("signal", ["signal", str(running), "--signal", "USR1", "--no-wait"], 0),
        ("suspend", ["suspend", str(running), "--no-wait"], 0),
        ("continue", ["continue", str(suspended), "--no-wait"], 0),
        ("cancel", ["cancel", str(running), "--running", "--yes"], 0),
        ("cancel", ["cancel", str(suspended), "--running", "--yes", "--now"], 0),
        ("update", ["update", str(q.scheduled), "--priority", "7", "--tag", "k=v"], 0),
        ("update", ["update", "--in-queue", "nowhere", "--priority", "1"], 0),
        ("remove", ["remove", str(suspended + 1)], 0),  # the job just added
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
    # web serves until a signal: tests/process/test_web.py checks its frame and
    # envelope against these
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
