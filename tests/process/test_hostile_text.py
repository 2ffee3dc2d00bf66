"""Job text cannot drive the terminal (docs/security.md, Terminal escapes).

Everything a submitter or a worker controls (the command, notes, tags, env,
cwd, worker ids, hostnames, queue names, pause reasons, errors, output) is fed
escape sequences (OSC title and clipboard writes, CSI, the 8-bit CSI \\x9b),
carriage returns, backspaces, DEL and bytes that are not UTF-8; every human
view is run as a real process and its bytes are checked: no control byte but
newline and tab reaches stdout or stderr, and each hostile value is there in
its escaped form. `--json` carries the original text and `--raw` the original
bytes.
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spoolctl.text import shown, shown_argv
from tests.helpers import child_env, execute
from tests.process.test_terminal import run_in_pty

pytestmark = [pytest.mark.timeout(180), pytest.mark.subprocess]

TITLE = "\x1b]0;pwned\x07"
CLIPBOARD = "\x1b]52;c;cm0gLXJmIH4=\x07"
CSI = "\x1b[2J\x1b[31m"
C1 = "\x9b6n"
TRICKS = "\r\x08\x7f"
HOSTILE = f"a{TITLE}b{CLIPBOARD}c{CSI}d{C1}e{TRICKS}f"
"""Every kind of character the views must not pass on, between letters."""
ESCAPED = (
    "a\\x1b]0;pwned\\x07b\\x1b]52;c;cm0gLXJmIH4=\\x07c\\x1b[2J\\x1b[31md\\x9b6ne\\r\\x08\\x7ff"
)
CR_TRICK = "echo safe\rrm -rf ~"
OUTPUT = b"\x1b[1;31mred\x1b[0m plain\x1b[2K\rover\x08\x7f \xc2\x9b6n \xff\xfe\tend\n"
"""What a job prints: colour, an erase-line, CR, BS, DEL, a C1 CSI, bytes
that are not UTF-8, a tab and the newline."""
PRINTF_FORMAT = "".join(chr(b) if 0x20 <= b < 0x7F else f"\\{b:03o}" for b in OUTPUT)
"""OUTPUT as printf's format, in ASCII (octal escapes): argv stays UTF-8."""
INERT = re.compile(
    rb"[\x00-\x08\x0b-\x1f\x7f]"  # C0 controls but tab and newline, and DEL
    rb"|\xc2[\x80-\x9f]"  # C1 controls, as UTF-8
    rb"|\xe2\x80[\xa8-\xae]|\xe2\x81[\xa6-\xa9]"  # line/paragraph separators, bidi
)


def assert_inert(data: bytes, what: object) -> None:
    """Strict UTF-8 (no raw byte that is not) and no control character."""
    data.decode("utf-8")
    found = INERT.search(data)
    assert found is None, (what, found, data[max(0, found.start() - 40) : found.end() + 40])


@dataclass
class Run:
    code: int
    out: bytes
    err: bytes


def spoolctl(db: Path, *args: str) -> Run:
    """A real `python -m spoolctl` process, its output as bytes."""
    argv = [sys.executable, "-m", "spoolctl", args[0], "--db", str(db), *args[1:]]
    proc = subprocess.run(
        argv, capture_output=True, env=child_env(), timeout=120, stdin=subprocess.DEVNULL
    )
    return Run(proc.returncode, proc.stdout, proc.stderr)


def json_of(db: Path, *args: str) -> dict[str, object]:
    found = spoolctl(db, args[0], "--json", *args[1:])
    assert found.out.count(b"\n") == 1, found.out + found.err
    envelope: dict[str, object] = json.loads(found.out)
    return envelope


def added(db: Path, *args: str) -> int:
    envelope = json_of(db, "add", *args)
    assert envelope["ok"], envelope
    data = envelope["data"]
    assert isinstance(data, dict)
    return int(data["job_id"])


@dataclass(frozen=True)
class Hostile:
    db: Path
    shell: int
    printer: int
    lane_job: int
    refused: int


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Hostile:
    """A queue where every field a person reads holds HOSTILE: through the CLI
    where it accepts such text, behind its back where it refuses it (queue
    names, keys, hostnames, errors)."""
    db = tmp_path_factory.mktemp("hostile") / "spool" / "queue.db"
    shell = added(
        db,
        "--note",
        HOSTILE,
        "--tag",
        f"k{TITLE}={HOSTILE}",
        "--env",
        f"E{CSI}={HOSTILE}",
        "-c",
        CR_TRICK + " #",
    )
    printer = added(db, "--", "printf", PRINTF_FORMAT)
    refused = added(db, "--", "true")
    drained = spoolctl(db, "work", "--drain", "--worker-id", f"w{HOSTILE}")
    assert drained.code == 0, drained.err
    lane_job = added(db, "--queue", "later", "--after", "1h", "--", "true")
    paused = spoolctl(db, "pause", "default", "--reason", HOSTILE)
    assert paused.code == 0, paused.err
    for sql, params in [
        (
            "UPDATE jobs SET queue = ?, idempotency_key = ?, last_error = ? WHERE id = ?",
            (f"q{TITLE}", HOSTILE, HOSTILE, lane_job),
        ),
        ("UPDATE attempts SET error = ? WHERE job_id = ?", (HOSTILE, printer)),
        ("UPDATE workers SET hostname = ?", (f"h{CLIPBOARD}",)),
        ("UPDATE attempts SET stdout_path = ? WHERE job_id = ?", (f"/tmp/x{TITLE}", refused)),
    ]:
        execute(db, sql, params)
    return Hostile(db, shell, printer, lane_job, refused)


def views(h: Hostile) -> list[list[str]]:
    return [
        ["list"],
        ["list", "--state", "done"],
        ["show", str(h.shell)],
        ["show", str(h.printer)],
        ["show", str(h.lane_job)],
        ["status"],
        ["workers", "--all"],
        ["events"],
        ["events", "--job", str(h.printer)],
        ["output", str(h.printer)],
        ["feedback", str(h.printer)],
        ["feedback", str(h.lane_job)],
        ["output", str(h.refused)],
        ["output", str(h.refused), "--raw"],
        ["wait", str(h.shell), "--timeout", "0"],
        ["pause", "default"],
        ["resume", "--all"],
        ["pause", "default", "--reason", HOSTILE],
    ]


@pytest.mark.slow
def test_no_view_passes_a_control_character_to_the_terminal(hostile: Hostile) -> None:
    for args in views(hostile):
        found = spoolctl(hostile.db, *args)
        assert found.code in (0, 1), (args, found.err)
        assert b"Traceback" not in found.err and b"INTERNAL" not in found.err, (args, found.err)
        assert_inert(found.out, args)
        assert_inert(found.err, args)


def test_each_hostile_value_is_shown_in_its_escaped_form(hostile: Hostile) -> None:
    listed = spoolctl(hostile.db, "list").out.decode()
    assert "sh -c $'echo safe\\rrm -rf ~ #'" in listed, "visibly not `rm -rf ~`"
    assert "q\\x1b]0;pwned\\x07" in listed
    shell = spoolctl(hostile.db, "show", str(hostile.shell)).out.decode()
    assert "sh -c $'echo safe\\rrm -rf ~ #'" in shell
    assert f"note      {ESCAPED}" in shell
    assert f"k\\x1b]0;pwned\\x07={ESCAPED}" in shell
    assert f"E\\x1b[2J\\x1b[31m={ESCAPED}" in shell
    assert f"w{ESCAPED}" in shell, "the worker id, in the attempts and the events"
    other = spoolctl(hostile.db, "show", str(hostile.lane_job)).out.decode()
    assert f"idempotency_key {ESCAPED}" in other and f"last_error {ESCAPED}" in other
    status = spoolctl(hostile.db, "status").out.decode()
    assert ESCAPED[:50] in status, "the pause reason (cut at 50)"
    workers = spoolctl(hostile.db, "workers", "--all").out.decode()
    assert "h\\x1b]52;c;cm0gLXJmIH4=\\x07" in workers
    refused = spoolctl(hostile.db, "output", str(hostile.refused))
    assert b"/tmp/x\\x1b]0;pwned\\x07" in refused.err, "the warning line"


def test_output_previews_keep_newlines_and_tabs_and_escape_the_rest(hostile: Hostile) -> None:
    preview = "\\x1b[1;31mred\\x1b[0m plain\\x1b[2K\\rover\\x08\\x7f \\x9b6n"
    out = spoolctl(hostile.db, "output", str(hostile.printer), "--stream", "stdout").out.decode()
    assert preview in out and "\tend" in out
    fed = spoolctl(hostile.db, "feedback", str(hostile.printer)).out.decode()
    assert preview in fed and "\tend" in fed


def test_followed_output_is_escaped_like_a_preview_and_raw_when_asked(hostile: Hostile) -> None:
    """`output --follow` prints for a person: escaped but newline and tab;
    with --raw it streams the bytes as they are."""
    args = ("output", str(hostile.printer), "--follow", "--stream", "stdout")
    followed = spoolctl(hostile.db, *args)
    assert followed.code == 0, followed.err
    assert_inert(followed.out, "output --follow")
    assert followed.out.decode().startswith("\\x1b[1;31mred") and b"\tend\n" in followed.out
    assert b"\\xff\\xfe" in followed.out
    assert spoolctl(hostile.db, *args, "--raw").out == OUTPUT


def test_raw_is_byte_exact_and_json_carries_the_original_text(hostile: Hostile) -> None:
    raw = spoolctl(hostile.db, "output", str(hostile.printer), "--stream", "stdout", "--raw")
    assert raw.out == OUTPUT
    job = json_of(hostile.db, "show", str(hostile.shell))["data"]
    assert isinstance(job, dict)
    assert job["job"]["note"] == HOSTILE and job["job"]["argv"] == ["sh", "-c", CR_TRICK + " #"]
    assert job["job"]["tags"] == {f"k{TITLE}": HOSTILE}
    assert job["job"]["env"] == {f"E{CSI}": HOSTILE}
    assert {a["worker_id"] for a in job["attempts"]} == {f"w{HOSTILE}"}
    status = json_of(hostile.db, "status")["data"]
    assert isinstance(status, dict)
    assert [lane["reason"] for lane in status["paused_lanes"]] == [HOSTILE]
    listed = json_of(hostile.db, "list")["data"]
    assert isinstance(listed, dict)
    queues = {j["id"]: j["queue"] for j in listed["jobs"]}
    assert queues[hostile.lane_job] == f"q{TITLE}"


def test_an_osc_sequence_reaches_a_real_terminal_as_text(hostile: Hostile) -> None:
    """On a terminal the views colour their own words; what a job wrote stays text."""
    argv = [sys.executable, "-m", "spoolctl", "show", str(hostile.shell), "--db", str(hostile.db)]
    drawn = run_in_pty(argv, child_env(), until=b"events:")
    assert b"\x1b]" not in drawn and b"safe\rrm" not in drawn
    assert b"note      a\\x1b]0;pwned\\x07b" in drawn


def test_bytes_that_are_not_utf8_show_as_hex_escapes(tmp_path: Path) -> None:
    """A command holding bytes that are not UTF-8 (PEP 383 surrogates in the
    decoded argv) is shown with `\\xXX` for each byte, never raising."""
    db = tmp_path / "spool" / "queue.db"
    job_id = added(db, "--", "printf", "\udcff\udc9b")  # the bytes ff 9b, as the OS passes them
    for args in (["list"], ["show", str(job_id)]):
        found = spoolctl(db, *args)
        assert found.code == 0, found.err
        assert_inert(found.out, args)
        assert "printf $'\\xff\\x9b'" in found.out.decode(), found.out


def test_a_state_no_spoolctl_writes_is_shown_escaped(tmp_path: Path) -> None:
    """A row edited past the CHECK constraints: its state is text like any other."""
    db = tmp_path / "spool" / "queue.db"
    job_id = added(db, "--", "true")
    conn = sqlite3.connect(db)
    try:
        conn.execute("PRAGMA ignore_check_constraints=ON")
        with conn:
            conn.execute("UPDATE jobs SET state = ? WHERE id = ?", (f"z{TITLE}", job_id))
    finally:
        conn.close()
    for args in (["status"], ["list"], ["show", str(job_id)], ["wait", str(job_id)]):
        found = spoolctl(db, *args, "--timeout", "0") if args[0] == "wait" else spoolctl(db, *args)
        assert_inert(found.out, args)
        assert_inert(found.err, args)
        if args[0] != "wait":  # which times out: the state is not final
            assert "z\\x1b]0;pwned\\x07" in found.out.decode(), args


def test_events_show_each_detail_compact_and_show_lists_the_events(hostile: Hostile) -> None:
    listed = spoolctl(hostile.db, "events", "--job", str(hostile.printer)).out.decode()
    claimed = [line for line in listed.splitlines() if " claimed " in line]
    assert claimed and claimed[0].endswith('{"attempt":1}'), listed
    lane = [
        line
        for line in spoolctl(hostile.db, "events").out.decode().splitlines()
        if "lane default paused" in line
    ]
    assert lane and '"reason":"a\\u001b]0;pwned\\u0007b' in lane[0], lane
    shown_job = spoolctl(hostile.db, "show", str(hostile.printer)).out.decode()
    events = shown_job.split("events:\n", 1)[1].splitlines()
    assert [line.split()[5] for line in events] == ["added", "claimed", "succeeded"]


@pytest.mark.slow
def test_attempts_and_failures_are_counted_apart(tmp_path: Path) -> None:
    """`attempts` in the JSON counts failures (as 0.4.11 did); people see how
    many times the job ran, and apart how many of those failed."""
    db = tmp_path / "spool" / "queue.db"
    once = added(db, "--", "true")
    twice = added(db, "--max-retries", "1", "--", "false")
    assert spoolctl(db, "work", "--drain").code == 0  # waits out the retry's backoff
    listed = json_of(db, "list")["data"]
    assert isinstance(listed, dict)
    counts = {j["id"]: (j["attempts_total"], j["attempts"]) for j in listed["jobs"]}
    assert counts == {once: (1, 0), twice: (2, 2)}
    text = spoolctl(db, "list").out.decode().splitlines()
    assert text[0].split()[4:6] == ["ATTEMPTS", "FAILURES"]
    by_id = {line.split()[0]: line.split()[4:6] for line in text[1:]}
    assert by_id == {str(once): ["1", "0"], str(twice): ["2", "2"]}
    assert "attempts  1, failures 0 (crashes 0)" in spoolctl(db, "show", str(once)).out.decode()
    assert "attempts  2, failures 2 (crashes 0)" in spoolctl(db, "show", str(twice)).out.decode()


# -- the function itself ---------------------------------------------------------


def test_shown_names_each_control_as_its_escape() -> None:
    assert shown(HOSTILE) == ESCAPED
    assert shown(CR_TRICK) == "echo safe\\rrm -rf ~"
    assert shown("\udcff\udc80 \ud800 \u2028\u202e\U000e0001 é ✓") == (
        "\\xff\\x80 \\ud800 \\u2028\\u202e\\U000e0001 é ✓"
    )
    assert shown("a\nb\tc\rd", keep_newlines=True) == "a\nb\tc\\rd"
    assert shown("a\nb\tc") == "a\\nb\\tc"
    assert shown(None) == "None" and shown(5) == "5"


@given(st.text(alphabet=st.characters(codec=None)))
def test_shown_never_raises_and_leaves_nothing_unprintable(text: str) -> None:
    assert shown(text).isprintable()
    kept = shown(text, keep_newlines=True)
    assert kept.replace("\n", "").replace("\t", "").isprintable()
    assert kept.count("\n") == text.count("\n")
    assert shown_argv([text, text]).isprintable()


WORDS = [
    "plain",
    "two words",
    "it's",
    "back\\slash",
    CR_TRICK,
    "\x1b]0;t\x07",
    "tab\there",
    "nl\nx",
    "del\x7f",
    "é ✓",
    "\udcff\udc80raw",
    "'",
    "",
    "$HOME `x`",
    "c1\x9b6n",
    "nbsp\xa0",
    "bidi\u202e",
    "tag\U000e0041",
]


def test_a_shown_command_reads_back_in_bash_as_the_same_words() -> None:
    """What `list` and `show` print is a command line bash reads back as the
    argv that runs (bytes that are not UTF-8 included)."""
    line = shown_argv(WORDS)
    script = f"words=( {line} ); printf '%s\\0' \"${{words[@]}}\""
    proc = subprocess.run(
        ["bash", "-c", script], capture_output=True, timeout=30, env={"LC_ALL": "C.UTF-8"}
    )
    assert proc.returncode == 0, proc.stderr
    expected = b"".join(w.encode("utf-8", "surrogateescape") + b"\0" for w in WORDS)
    assert proc.stdout == expected


def test_the_escaping_module_is_a_leaf_of_the_standard_library() -> None:
    """cli/ and web/ both import it; it imports neither, nor anything installed."""
    from tests.unit.test_layering import PACKAGE, imported_modules

    modules = imported_modules(PACKAGE / "text.py")
    assert modules and all(
        m.split(".")[0] in sys.stdlib_module_names | {"__future__"} for m in modules
    ), modules
