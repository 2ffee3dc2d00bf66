"""The terminal experience: progress lines only on a TTY, a live status view,
help with examples, and shell completion through click."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import add, child_env, cli

pytestmark = [pytest.mark.timeout(60), pytest.mark.subprocess]


def run_in_pty(argv: list[str], env: dict[str, str], until: bytes, timeout: float = 20) -> bytes:
    """Run argv with a pseudo-terminal as stdin/stdout/stderr; return what it drew."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        argv, stdin=follower, stdout=follower, stderr=follower, env=env, close_fds=True
    )
    os.close(follower)
    seen = b""
    deadline = time.monotonic() + timeout
    try:
        while until not in seen and time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.2)
            if ready:
                try:
                    seen += os.read(leader, 4096)
                except OSError:
                    break
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        proc.wait(timeout=10)
        os.close(leader)
    return seen


@pytest.mark.slow
def test_wait_draws_a_progress_line_on_a_tty_only(db: Path) -> None:
    job_id = add(db, "sleep", "30")
    argv = [
        sys.executable,
        "-m",
        "spoolctl",
        "wait",
        str(job_id),
        "--db",
        str(db),
        "--timeout",
        "3",
        "--poll-interval",
        "0.1",
    ]
    drawn = run_in_pty(argv, child_env(), until=b"TIMEOUT")
    assert b"\rwaiting for 1 jobs: 1 queued" in drawn
    piped = cli("wait", str(job_id), "--timeout", "1", "--poll-interval", "0.1", db=db)
    assert piped.exit_code == 4
    assert "waiting for" not in piped.stderr + piped.stdout


def test_drain_draws_a_progress_line_on_a_tty_only(db: Path) -> None:
    for _ in range(3):
        add(db, "true")
    argv = [sys.executable, "-m", "spoolctl", "work", "--drain", "--quiet", "--db", str(db)]
    drawn = run_in_pty(argv, child_env(), until=b"drained:")
    assert b"\rdraining: 3 attempts (3 succeeded)" in drawn
    assert b"drained: 3 attempts, 3 succeeded" in drawn
    add(db, "true")
    piped = cli("work", "--drain", db=db)
    assert piped.exit_code == 0
    assert "draining" not in piped.stdout + piped.stderr
    assert piped.stdout.strip() == "drained: 1 attempt, 1 succeeded"


def test_status_watch_redraws_until_interrupted(db: Path) -> None:
    add(db, "true")
    argv = [
        sys.executable,
        "-m",
        "spoolctl",
        "status",
        "--watch",
        "--interval",
        "0.2",
        "--db",
        str(db),
    ]
    drawn = run_in_pty(argv, child_env({"NO_COLOR": "1"}), until=b"queued 1", timeout=20)
    assert drawn.count(b"Ctrl-C to stop") >= 1
    assert b"queued 1" in drawn


def test_status_watch_and_json_are_exclusive(db: Path) -> None:
    result = cli("status", "--watch", db=db, json=True)
    assert result.exit_code == 1
    assert result.envelope["errors"][0]["code"] == "INVALID_INPUT"


def test_every_verb_help_shows_an_example() -> None:
    verbs = cli("--help").stdout.split("Commands:")[1].split()
    names = [w for w in verbs if w.islower() and not w.endswith(".")]
    for name in ("add", "work", "status", "wait", "retry", "migrate"):
        assert name in names
        text = cli(name, "--help").stdout
        assert "Examples:" in text and f"spoolctl {name}" in text, name


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_scripts_are_offered(shell: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "spoolctl"],
        env=child_env({"_SPOOLCTL_COMPLETE": f"{shell}_source"}),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0
    assert "_SPOOLCTL_COMPLETE" in proc.stdout


def test_completion_completes_verbs_and_choices() -> None:
    def complete(words: str, cword: int) -> list[str]:
        proc = subprocess.run(
            [sys.executable, "-m", "spoolctl"],
            env=child_env(
                {
                    "_SPOOLCTL_COMPLETE": "bash_complete",
                    "COMP_WORDS": words,
                    "COMP_CWORD": str(cword),
                }
            ),
            capture_output=True,
            text=True,
            timeout=30,
        )
        return [line.split(",", 1)[1] for line in proc.stdout.splitlines()]

    assert "list" in complete("spoolctl li", 1)
    assert set(complete("spoolctl list --state ", 3)) >= {"queued", "dead", "done"}
