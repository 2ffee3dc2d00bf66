"""Shell completion through click's environment protocol, as bash, zsh and
fish drive it (`_SPOOLCTL_COMPLETE=SHELL_complete` with `COMP_WORDS` and
`COMP_CWORD`), each a real `spoolctl` process: verbs, two-word verbs, flag
values, and job ids, lanes and schedule names read from the queue; nothing
ever printed to stderr (the prompt) and exit 0 for a line that does not
parse."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import add, child_env, cli, cli_json

pytestmark = pytest.mark.subprocess


def ask(shell: str, words: str, cword: str | int, cwd: Path | None = None) -> list[str]:
    """The candidates a shell gets for a line (its last word the one completed);
    `<file>` where it is told to offer file names."""
    env = child_env(
        {"_SPOOLCTL_COMPLETE": f"{shell}_complete", "COMP_WORDS": words, "COMP_CWORD": str(cword)}
    )
    proc = subprocess.run(
        [sys.executable, "-m", "spoolctl"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        check=False,
    )
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr
    if shell == "zsh":  # type, value, description: three lines each
        lines = proc.stdout.splitlines()
        return [lines[i + 1] for i in range(0, len(lines) - 2, 3) if lines[i] == "plain"]
    values = [line.split(",", 1) for line in proc.stdout.splitlines() if line]
    return [v[1].split("\t")[0] if v[0] == "plain" else f"<{v[0]}>" for v in values]


def bash(line: str, cwd: Path | None = None) -> list[str]:
    words = line.split(" ")
    return ask("bash", line, len(words) - 1, cwd)


def zsh(line: str) -> list[str]:
    return ask("zsh", line, len(line.split(" ")) - 1)


def fish(line: str) -> list[str]:
    return ask("fish", line, line.split(" ")[-1])


SHELLS = {"bash": bash, "zsh": zsh, "fish": fish}


@pytest.mark.parametrize("shell", sorted(SHELLS))
def test_two_word_verbs_complete_one_word_at_a_time(shell: str) -> None:
    complete = SHELLS[shell]
    assert complete("spoolctl sch") == ["schedule", "schema"]
    subs = complete("spoolctl schedule ")
    assert subs == ["add", "list", "pause", "remove", "resume", "run", "show"]
    assert complete("spoolctl schedule re") == ["remove", "resume"]
    verbs = complete("spoolctl ")
    assert "retry" in verbs and "remove" in verbs and "schedule" in verbs
    assert not [v for v in verbs if " " in v]


def test_flags_and_their_values_complete() -> None:
    assert bash("spoolctl add --db ") == ["<file>"]
    assert bash("spoolctl list --state ")[:3] == ["queued", "running", "done"]
    assert "--again" in bash("spoolctl retry --a")
    assert "--cron" in bash("spoolctl schedule add --c")


@pytest.mark.parametrize(
    "line",
    [
        "spoolctl nope ",
        "spoolctl schedule lsit ",
        "spoolctl add --timeout xx ",
        "spoolctl retry abc ",
        "spoolctl show --db postgresql://nobody@127.0.0.1:9/x ",
        "spoolctl show --db /nonexistent/q.db ",
    ],
)
def test_a_line_that_does_not_parse_yields_nothing_and_no_error(line: str) -> None:
    assert bash(line) == []


def test_job_ids_lanes_and_schedules_come_from_the_queue(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    done = add(db, "true")
    assert cli_json("work", "--drain", db=db).exit_code == 0
    queued = add(db, "sleep", "1", opts=("--queue", "builds", "--after", "1h"))
    schedule = cli(
        "schedule", "add", "--db", str(db), "--json", "nightly", "--every", "1h", "--", "true"
    )
    assert schedule.exit_code == 0, schedule.stdout
    assert bash(f"spoolctl show --db {db} ") == [str(queued), str(done)]
    assert bash(f"spoolctl retry --db {db} ") == [str(done)]
    assert bash(f"spoolctl remove --db {db} ") == [str(queued)]
    assert bash(f"spoolctl update --db {db} ") == [str(queued)]
    assert bash(f"spoolctl update --db {db} --in-queue b") == ["builds"]
    assert bash(f"spoolctl show --db {db} {queued}") == [str(queued)]
    assert bash(f"spoolctl show --db {db} x") == []
    assert bash(f"spoolctl list --db {db} --queue b") == ["builds"]
    assert bash(f"spoolctl pause --db {db} ") == ["builds", "default"]
    assert bash(f"spoolctl schedule show --db {db} ") == ["nightly"]
    assert zsh(f"spoolctl cancel --db {db} ") == [str(queued)]
    assert fish(f"spoolctl schedule pause --db {db} n") == ["nightly"]
    assert bash("spoolctl show ", cwd=tmp_path) == []  # no queue here: none is made
    assert not (tmp_path / ".spoolctl").exists()


def test_the_scripts_of_each_shell_are_printed() -> None:
    for shell, marker in (
        ("bash", "complete -o nosort"),
        ("zsh", "#compdef"),
        ("fish", "complete"),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "spoolctl"],
            env=child_env({"_SPOOLCTL_COMPLETE": f"{shell}_source"}),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert (proc.returncode, proc.stderr) == (0, "")
        assert marker in proc.stdout and "_SPOOLCTL_COMPLETE" in proc.stdout


def test_an_empty_completion_variable_is_no_completion(tmp_path: Path) -> None:
    """As click reads it: a stray empty `_SPOOLCTL_COMPLETE` runs the verb."""
    proc = subprocess.run(
        [sys.executable, "-m", "spoolctl", "--version"],
        env=child_env({"_SPOOLCTL_COMPLETE": ""}),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert (proc.returncode, "spoolctl" in proc.stdout) == (0, True)
