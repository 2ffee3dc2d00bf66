"""A small queue with a job in each interesting state, built in-process (fast),
and a quiet in-process runner for tests that cannot use pytest's capsys
(module-scoped fixtures, hypothesis)."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spoolctl.cli import run
from tests.helpers import Db, Result, spool_dir


def takes_db(verb: str) -> bool:
    from spoolctl.cli.contract import verb_commands

    command = verb_commands().get(verb)
    return command is not None and any(p.name == "db" for p in command.params)


def run_quiet(*args: str) -> Result:
    """spoolctl in this process, stdout/stderr captured (with a binary .buffer)."""
    out_bytes, err_bytes = io.BytesIO(), io.BytesIO()
    out = io.TextIOWrapper(out_bytes, encoding="utf-8", write_through=True)
    err = io.TextIOWrapper(err_bytes, encoding="utf-8", write_through=True)
    with redirect_stdout(out), redirect_stderr(err):
        code = run(list(args))
        out.flush()
        err.flush()
    return Result(code, out_bytes.getvalue().decode(), err_bytes.getvalue().decode())


def run_json(*args: str) -> Result:
    result = run_quiet(args[0], "--json", *args[1:])
    assert result.stdout.count("\n") == 1, result.stdout + result.stderr
    return result


@dataclass(frozen=True)
class Populated:
    db: Db
    done: int
    dead: int
    scheduled: int
    canceled: int

    @property
    def spool(self) -> Path:
        """The spool folder: its output/ holds the attempts' output files."""
        return spool_dir(self.db)

    def args(self, *args: str) -> list[str]:
        """The verb, `--db` when it takes one, then the rest."""
        return [args[0], *(["--db", str(self.db)] if takes_db(args[0]) else []), *args[1:]]

    def json(self, *args: str) -> Result:
        return run_json(*self.args(*args))

    def outcome(self, *args: str) -> tuple[int, str | None]:
        """A verb's exit code and its first error's code (None where none)."""
        result = self.json(*args)
        errors = result.envelope["errors"]
        return result.exit_code, errors[0]["code"] if errors else None

    def jobs(self) -> Any:
        return json.loads(run_json("list", "--db", str(self.db), "--limit", "0").stdout)["data"]


def populate(db: Db) -> Populated:
    """done (tags, env, output), dead (stderr), scheduled (other queue), canceled."""
    ids = []
    for opts in (
        ("--tag", "team=ml", "--env", "SECRET=xyz", "--", "sh", "-c", "echo hello"),
        ("--max-retries", "0", "-c", "echo oops >&2; exit 3"),
        ("--after", "1h", "--queue", "other", "--priority", "5", "--", "true"),
        ("--", "true"),
    ):
        result = run_json("add", "--db", str(db), *opts)
        assert result.exit_code == 0, result.stdout
        ids.append(result.envelope["data"]["job_id"])
    assert run_json("cancel", "--db", str(db), str(ids[3])).exit_code == 0
    drained = run_json("work", "--db", str(db), "--drain")
    assert drained.exit_code == 0, drained.stdout
    return Populated(db, done=ids[0], dead=ids[1], scheduled=ids[2], canceled=ids[3])
