"""Shared test helpers: run the CLI in-process or as a real process, read the
database directly, and poll for conditions with a deadline (never a bare sleep)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spoolctl.cli import run as cli_run
from spoolctl.cli.queues import open_write
from spoolctl.services.submit import JobSpec, submit

REPO = Path(__file__).resolve().parents[1]
FAST_KNOBS = {
    "SPOOLCTL_TEST_HEARTBEAT_INTERVAL": "0.2",
    "SPOOLCTL_TEST_REAP_THRESHOLD": "1.0",
}


@dataclass
class Result:
    exit_code: int
    stdout: str
    stderr: str

    @property
    def envelope(self) -> dict[str, Any]:
        return json.loads(self.stdout)

    @property
    def data(self) -> Any:
        return self.envelope["data"]


def cli(
    *args: str, db: Path | None = None, env: dict[str, str] | None = None, json: bool = False
) -> Result:
    """Run spoolctl in a real subprocess (python -m spoolctl) and capture it.

    db and json insert `--db PATH` / `--json` right after the verb, where every
    verb accepts them (before any `--` or command argv)."""
    extra = (["--db", str(db)] if db is not None else []) + (["--json"] if json else [])
    argv = [sys.executable, "-m", "spoolctl", *args[:1], *extra, *args[1:]]
    proc = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        env=child_env(env),
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def cli_json(*args: str, db: Path | None = None, env: dict[str, str] | None = None) -> Result:
    return cli(*args, db=db, env=env, json=True)


def inproc(*args: str, capsys: Any) -> Result:
    """Run spoolctl in this process (fast) with pytest's capsys."""
    code = cli_run(list(args))
    out, err = capsys.readouterr()
    return Result(code, out, err)


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(FAST_KNOBS)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("SPOOLCTL_DB", None)
    if extra:
        env.update(extra)
    return env


STARTED_WORKERS: list[subprocess.Popen[str]] = []
"""Every worker start_worker() launched; tests/conftest.py kills leftovers."""


def start_worker(
    db: Path, *args: str, env: dict[str, str] | None = None, log: Path | None = None
) -> subprocess.Popen[str]:
    """A real `spoolctl work` process (loop mode unless args say otherwise)."""
    out = open(log, "w") if log is not None else subprocess.DEVNULL  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "spoolctl", "work", "--db", str(db), "--json", *args],
        stdout=subprocess.PIPE if log is None else out,
        stderr=subprocess.PIPE if log is None else subprocess.STDOUT,
        text=True,
        env=child_env(env),
        stdin=subprocess.DEVNULL,
    )
    STARTED_WORKERS.append(proc)
    return proc


def wait_for(
    condition: Callable[[], Any], timeout: float = 30.0, interval: float = 0.05, what: str = ""
) -> Any:
    """Poll until condition() is truthy; fail with `what` after the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or condition}")
        time.sleep(interval)


def rows(db: Path, sql: str, params: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
    """Read the queue directly (a plain reader: never takes the write lock)."""
    conn = sqlite3.connect(db, timeout=10)
    conn.row_factory = sqlite3.Row
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def job(db: Path, job_id: int) -> sqlite3.Row:
    return rows(db, "SELECT * FROM jobs WHERE id = ?", (job_id,))[0]


def attempts_of(db: Path, job_id: int) -> list[sqlite3.Row]:
    return rows(db, "SELECT * FROM attempts WHERE job_id = ? ORDER BY attempt_no", (job_id,))


def events_of(db: Path, job_id: int) -> list[str]:
    found = rows(db, "SELECT event FROM job_events WHERE job_id = ? ORDER BY id", (job_id,))
    return [r["event"] for r in found]


def add(db: Path, *argv: str, opts: tuple[str, ...] = ()) -> int:
    """Submit through the real CLI and return the new job id."""
    result = cli("add", *opts, "--", *argv, db=db, json=True)
    assert result.exit_code == 0, result.stderr + result.stdout
    return int(result.data["job_id"])


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ")[1].split()[0] != "Z"
    except OSError:
        return False


def add_job(db: Path, *argv: str, **spec: Any) -> int:
    """Submit in-process through the submit service: fast, no subprocess (the
    CLI's own checks of `add` are in tests/test_add.py)."""
    queue = open_write(str(db))
    try:
        spec_obj = JobSpec(argv=list(argv), **spec)
        return queue.write(lambda conn: submit(conn, spec_obj, time.time())).job_id
    finally:
        queue.engine.dispose()
