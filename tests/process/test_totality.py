"""Totality: whatever the arguments, spoolctl answers with one well-formed
envelope and a documented exit code, never a traceback, and malformed input
never changes the queue. Hypothesis throws generated argument lists at every
verb, in-process; flags that could block are bounded or left out.

The examples are drawn afresh on every run (no derandomize, no example
database: each run explores new inputs, and a failure prints the seed to
replay it with --hypothesis-seed). Numbers far outside every bound (beyond
64 bits, huge negatives) are drawn too, and every integer parameter is also
probed at its edges by a plain test below. The tests with a queue run on
SQLite and on PostgreSQL."""

from __future__ import annotations

import gc
import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import click
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spoolctl.cli.contract import verb_commands
from spoolctl.cli.schemas import ENVELOPE
from spoolctl.cli.verbs import FAMILY_HELP, GROUPS
from spoolctl.errors import ERROR_CODES
from tests.helpers import Db, cli, is_postgres, rows
from tests.populated import Populated, populate, run_quiet, takes_db
from tests.schema_check import errors as schema_errors

pytestmark = [pytest.mark.both_backends, pytest.mark.subprocess]

ENVELOPE_KEYS = {"ok", "tool_version", "data", "meta", "warnings", "commands", "errors"}
NEVER = {
    "--db",
    "--json",
    "--help",
    "-h",
    "--follow",
    "--poll-interval",
    "--idle-timeout",
    "--watch",
}
# Flags left out per verb: they block by design (bounded below instead), or
# they would legitimately rewrite the schema under every later example.
LEFT_OUT = {
    "wait": {"--timeout"},
    "events": {"--wait-timeout"},
    "work": {"--once", "--drain", "--queue", "--concurrency", "--slots"},
    "migrate": {"--downgrade", "--to"},
}
# Prefixes that bound anything blocking to (almost) no time at all.
BOUNDS = {
    "wait": ["--timeout", "0"],
    "events": ["--wait-timeout", "0"],
    "work": ["--once", "--queue", "totality-empty-lane"],
}
JUNK = [
    "",
    "-",
    "--",
    "-x",
    "--nope",
    "--stat",
    "0",
    "1",
    "2",
    "3",
    "-1",
    "99999999999999999999",
    "nan",
    "inf",
    "-inf",
    "1e309",
    "0.5",
    "1h",
    "5m",
    "-5s",
    "1x",
    "a=b",
    "=",
    "K=",
    "done",
    "guide",
    "list",
    "\x00",
    "é",
    " ",
    "\t",
    "2038-01-19T03:14:08",
    "none",
    "true",
]


def vocabulary(verb: str) -> list[str]:
    """The verb's own flags and choices, plus junk."""
    words = list(JUNK)
    for param in verb_commands()[verb].params:
        if isinstance(param, click.Option):
            words += [o for o in param.opts if o not in NEVER | LEFT_OUT.get(verb, set())]
        choices = getattr(param.type, "choices", None)
        if choices:
            words += [str(c) for c in choices]
    return words


EDGES = [2**31, 2**63 - 1, 2**63, 2**64, 10**30, -(2**31) - 1, -(2**63) - 1, -(10**30)]
NUMBERS = st.one_of(
    st.integers(min_value=-(2**80), max_value=2**80),
    st.sampled_from(EDGES),
    st.floats(allow_nan=True, allow_infinity=True),
).map(str)


def arguments(verb: str) -> st.SearchStrategy[list[str]]:
    text = st.text(max_size=6).filter(lambda t: t not in NEVER)  # "--help" fits in six
    token = st.one_of(st.sampled_from(vocabulary(verb)), text, NUMBERS)
    return st.lists(token, max_size=6)


@pytest.fixture(scope="module")
def q(module_db: Db) -> Populated:
    return populate(module_db)


def snapshot(q: Populated) -> Any:
    """The queue's jobs: as `list` shows them on SQLite; on PostgreSQL every
    column of every row, read directly (a CLI call there costs ~70 ms, most of
    it opening connections, and this runs twice per example)."""
    if is_postgres(q.db):
        return [tuple(row) for row in rows(q.db, "SELECT * FROM jobs ORDER BY id")]
    return q.jobs()


def check_envelope(stdout: str, exit_code: int) -> dict[str, Any]:
    lines = stdout.splitlines()
    assert len(lines) == 1, stdout
    envelope = json.loads(lines[0])
    assert set(envelope) == ENVELOPE_KEYS
    assert schema_errors(envelope, ENVELOPE) == []
    assert envelope["ok"] == (envelope["errors"] == [])
    if not envelope["ok"]:
        error = envelope["errors"][0]
        assert envelope["data"] is None
        assert error["code"] != "INTERNAL", error
        assert ERROR_CODES[error["code"]] == error["exit_code"] == exit_code
    return envelope


SETTINGS = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    derandomize=False,
    database=None,
)
SERVES = {"web"}
"""Verbs that serve until a signal (tests/process/test_web.py checks them)."""
VERBS = [verb for verb in verb_commands() if verb not in SERVES]


@pytest.mark.parametrize("verb", [v for v in VERBS if takes_db(v)])
def test_any_arguments_give_one_envelope_and_leave_the_queue_alone(
    verb: str, q: Populated, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    any_arguments(verb, q, tmp_path, monkeypatch)


@pytest.mark.sqlite_only("the verb takes no --db: its run is the same on either backend")
@pytest.mark.parametrize("verb", [v for v in VERBS if not takes_db(v)])
def test_any_arguments_to_a_verb_without_a_queue_give_one_envelope(
    verb: str, q: Populated, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    any_arguments(verb, q, tmp_path, monkeypatch)


def any_arguments(verb: str, q: Populated, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    mutates = verb_commands()[verb].traits["mutates"]
    state = {"last": snapshot(q)}

    @SETTINGS
    @given(args=arguments(verb))
    def prop(args: list[str]) -> None:
        result = run_quiet(*q.args(verb, "--json", *BOUNDS.get(verb, []), *args))
        assert "Traceback" not in result.stdout + result.stderr
        assert 0 <= result.exit_code <= 6
        envelope = check_envelope(result.stdout, result.exit_code)
        now = snapshot(q)
        if not mutates or not envelope["ok"]:
            assert now == state["last"], (verb, args)
        state["last"] = now

    prop()


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPOOLCTL_DB", str(tmp_path / "scratch" / "queue.db"))
    return tmp_path


@settings(SETTINGS, max_examples=40)
@given(args=st.lists(st.one_of(st.sampled_from([*VERBS, *JUNK]), st.text(max_size=6)), max_size=4))
def test_text_mode_never_shows_a_traceback(scratch: Path, args: list[str]) -> None:
    blocking = ("work", "wait", "events", "output", *SERVES, "--help", "-h")
    result = run_quiet(*[a for a in args if a not in blocking])
    assert "Traceback" not in result.stdout + result.stderr
    assert 0 <= result.exit_code <= 6
    if result.exit_code and result.stderr:
        lines = [line for line in result.stderr.splitlines() if not line.startswith("  hint: ")]
        assert lines[-1].startswith("spoolctl: "), result.stderr


def error_of(*args: str) -> tuple[int, dict[str, Any]]:
    result = run_quiet(*args)
    return result.exit_code, check_envelope(result.stdout, result.exit_code)["errors"][0]


def test_unknown_verb_suggests_the_closest() -> None:
    code, error = error_of("stauts", "--json")
    assert (code, error["code"], error["detail"]["did_you_mean"]) == (
        1,
        "UNKNOWN_COMMAND",
        "status",
    )


def test_unknown_flag_suggests_and_options_are_never_abbreviated() -> None:
    code, error = error_of("list", "--json", "--stat", "done")
    assert (code, error["code"], error["detail"]["did_you_mean"]) == (1, "UNKNOWN_FLAG", "--state")
    assert error_of("list", "--json", "--lim", "5")[1]["code"] == "UNKNOWN_FLAG"
    assert error_of("events", "--json", "--since", "5")[1]["code"] == "UNKNOWN_FLAG"


def test_no_verb_is_missing_required_with_the_verbs_listed() -> None:
    result = run_quiet()
    assert result.exit_code == 1
    assert "MISSING_REQUIRED" in result.stderr and "status" in result.stderr
    assert run_quiet("--help").exit_code == 0
    assert run_quiet("--version").exit_code == 0
    assert run_quiet("list", "--help").exit_code == 0


@pytest.mark.parametrize("family", sorted(GROUPS))
def test_every_family_of_two_word_verbs_lists_its_verbs_alone_and_with_help(family: str) -> None:
    verbs = sorted(
        name.split(" ", 1)[1] for name in verb_commands() if name.startswith(f"{family} ")
    )
    assert verbs and FAMILY_HELP[family]
    for args in ([family], [family, "--help"]):
        result = cli(*args)
        assert (result.exit_code, result.stderr) == (0, ""), (args, result.stderr)
        assert FAMILY_HELP[family].split(":")[0] in result.stdout
        listed = result.stdout.split("Commands:")[1].split("Options:")[0].strip()
        assert [line.split()[0] for line in listed.splitlines()] == verbs, args
    missing = cli(family, json=True)
    assert (missing.exit_code, missing.envelope["errors"][0]["code"]) == (1, "MISSING_REQUIRED")
    for verb in verbs:
        assert cli(family, verb, "--help").exit_code == 0, verb


def sample(param: click.Parameter) -> list[str]:
    """A valid value for an option, so only exclusivity can be wrong."""
    if isinstance(param, click.Option) and param.is_flag:
        return [max(param.opts, key=len)]
    choices = getattr(param.type, "choices", None)
    value = str(choices[-1]) if choices else "1"
    flag = max(param.opts, key=len) if isinstance(param, click.Option) else None
    return [flag, value] if flag else [value]


@pytest.mark.parametrize(
    ("verb", "pair"),
    [(v, p) for v, c in verb_commands().items() for p in c.exclusive],
)
def test_mutually_exclusive_flags_are_invalid_input(
    verb: str, pair: tuple[str, str], tmp_path: Path
) -> None:
    command = verb_commands()[verb]
    params = {p.name: p for p in command.params}
    args = [verb, "--db", str(tmp_path / "q.db")] if "db" in params else [verb]
    if "as_json" not in pair:
        args.append("--json")
    args += [
        w for p in command.params if p.required and isinstance(p, click.Option) for w in sample(p)
    ]
    for name in pair:
        args += sample(params[name])
    args += ["--", *(w for p in command.params if isinstance(p, click.Argument) for w in sample(p))]
    result = run_quiet(*args)
    assert result.exit_code == 1, (args, result.stdout)
    assert "cannot be used together" in result.stdout + result.stderr
    assert not (tmp_path / "q.db").exists()


def integer_params() -> list[tuple[str, click.Parameter]]:
    return [
        (name, p)
        for name, command in verb_commands().items()
        if name not in SERVES
        for p in command.params
        if getattr(p.type, "name", "") in ("integer", "id", "timeout")
    ]


@pytest.mark.parametrize(
    ("verb", "param"), integer_params(), ids=lambda v: v if isinstance(v, str) else v.name
)
def test_every_integer_parameter_is_bounded_where_it_is_parsed(
    verb: str, param: click.Parameter, q: Populated
) -> None:
    """Beyond its published bounds (and beyond 64 bits) an integer is
    INVALID_INPUT, exit 1, before anything reaches SQLite; never INTERNAL."""
    command = verb_commands()[verb]
    published = param.type.contract_info()  # type: ignore[attr-defined]
    low, high = published["min"], published["max"]
    assert low is not None and high is not None and -(2**63) <= low <= high <= 2**63 - 1
    for value in (high + 1, 2**64, 10**30, low - 1, -(2**63) - 1):
        args = [verb, "--json", *BOUNDS.get(verb, [])]
        args += [
            w
            for p in command.params
            if p.required and isinstance(p, click.Option)
            for w in sample(p)
        ]
        if isinstance(param, click.Option):
            args += [max(param.opts, key=len), str(value), "--"]
            args += [w for p in command.params if isinstance(p, click.Argument) for w in sample(p)]
        else:
            args += ["--", str(value)]
        before = snapshot(q)
        result = run_quiet(*q.args(*args))
        envelope = check_envelope(result.stdout, result.exit_code)
        assert (result.exit_code, envelope["errors"][0]["code"]) == (1, "INVALID_INPUT"), args
        assert snapshot(q) == before


@pytest.mark.parametrize(
    ("verb", "param"), integer_params(), ids=lambda v: v if isinstance(v, str) else v.name
)
def test_every_integer_parameter_takes_its_published_bounds(
    verb: str, param: click.Parameter, q: Populated
) -> None:
    """At its published bounds an integer passes the parser, and whatever the
    verb then answers, it is never INTERNAL: every column the value reaches
    holds it, on PostgreSQL as on SQLite."""
    command = verb_commands()[verb]
    published = param.type.contract_info()  # type: ignore[attr-defined]
    for value in (published["max"], published["min"]):
        args = [verb, "--json", *BOUNDS.get(verb, [])]
        args += [
            w
            for p in command.params
            if p.required and isinstance(p, click.Option)
            for w in sample(p)
        ]
        if isinstance(param, click.Option):
            args += [max(param.opts, key=len), str(value), "--"]
            args += [w for p in command.params if isinstance(p, click.Argument) for w in sample(p)]
        else:
            args += ["--", str(value)]
        result = run_quiet(*q.args(*args))
        check_envelope(result.stdout, result.exit_code)  # never INTERNAL


SECRET = "pw-Zq9x"
ODD_DBS = [
    f"postgresql:/u:{SECRET}@127.0.0.1:1/db",
    f"postgresql//u:{SECRET}@127.0.0.1:1/db",
    f" postgresql://u:{SECRET}@127.0.0.1:1/db",
    f"postgres:/u:{SECRET}@h/db",
    f"postgresql://u:{SECRET}@h@127.0.0.1:1/db",
    f"postgresql://u:se/{SECRET}@127.0.0.1:1/db",
    f"postgresql://u:{SECRET}#x@127.0.0.1:1/db",
    f"postgresql://u:{SECRET}@127.0.0.1:1x/db",
    f"postgresql://u@127.0.0.1:1/db?password={SECRET}",
    f"postgresql://u:{SECRET}@127.0.0.1:1/db",
    f"mysql://u:{SECRET}@h/db",
    f"u:{SECRET}@h/db",
    "sqlite://",
    "sqlite:///:memory:",
    "name:with:colon",
]
HOSTILE = ["\x1b]0;pwn\x07", "\x1b[2J", "a\rb", "\x08", "\x9b", "\udcff", "\ud800", "\x7f", "é"]


def broken_files(folder: Path) -> dict[str, Path]:
    """Files a --db may name that are not queues, made afresh for each
    example: a verb that may change what it is given (`migrate` makes a
    queue of the empty file) must not leave the next example a different
    file, or its own -wal and -shm, to compare against. The verbs run in this
    process: a connection an earlier example left to the garbage collector
    would close (and remove its -wal and -shm) in the middle of this one, so
    it is collected first."""
    gc.collect()
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    made = {
        "noise": folder / "noise.db",
        "empty": folder / "empty.db",
        "foreign": folder / "foreign.db",
        "folder": folder / "a-folder",
        "under-a-file": folder / "noise.db" / "queue.db",
        "text": folder / "notes.txt",
    }
    made["noise"].write_bytes(bytes(range(256)) * 64)
    made["empty"].write_bytes(b"")
    made["text"].write_text("hello\n" * 100)
    made["folder"].mkdir(exist_ok=True)
    conn = sqlite3.connect(made["foreign"])
    conn.execute("CREATE TABLE notes (body TEXT)")
    conn.commit()
    conn.close()
    return made


def folder_state(folder: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(folder.rglob("*"))
    }


@pytest.mark.sqlite_only("the odd values never reach a server; the broken files are SQLite's")
@settings(SETTINGS, max_examples=150)
@given(data=st.data())
def test_odd_urls_broken_files_and_hostile_text_never_leak_crash_or_change(
    data: st.DataObject, scratch: Path
) -> None:
    """Any verb with a near-URL (holding a password), a broken file or a
    missing one as --db, and arguments with control characters, lone
    surrogates, huge numbers: no traceback, never INTERNAL, the documented
    exit code, the password in no output, and a refused call leaves every
    file exactly as it was (and makes none)."""
    files = broken_files(scratch / "files")
    # missing in every example: an earlier one's `migrate` or `add` may have
    # made a queue there, and a later read of it would leave its -wal and -shm
    absent = scratch / "absent"
    shutil.rmtree(absent, ignore_errors=True)
    verb = data.draw(st.sampled_from([v for v in VERBS if takes_db(v) and v != "work"]))
    db = data.draw(st.sampled_from([*ODD_DBS, *map(str, files.values()), str(absent / "queue.db")]))
    extra = data.draw(
        st.lists(st.one_of(st.sampled_from(vocabulary(verb) + HOSTILE), NUMBERS), max_size=4)
    )
    as_json = data.draw(st.booleans())
    before = folder_state(scratch)
    args = [verb, *BOUNDS.get(verb, []), "--db", db, *(["--json"] if as_json else []), *extra]
    result = run_quiet(*args)
    shown = result.stdout + result.stderr
    assert "Traceback" not in shown and SECRET not in shown, (args, shown)
    assert 0 <= result.exit_code <= 6
    if as_json:
        envelope = check_envelope(result.stdout, result.exit_code)
        refused = not envelope["ok"]
    else:
        assert "INTERNAL" not in result.stderr, (args, result.stderr)
        refused = result.exit_code not in (0, 6)
    if refused or db in ODD_DBS or not verb_commands()[verb].traits["mutates"]:
        assert folder_state(scratch) == before, args  # a near-URL is never a file name
