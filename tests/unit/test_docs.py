"""Every command shown in the docs names what exists: commands that must not
run (```console, ```ini blocks and `inline code`) are checked against the
click tree, so the docs cannot name a verb or flag that does not exist. The
fenced ```sh blocks are run for real in tests/process/test_docs.py."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.timeout(180)

ANY_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
INLINE = re.compile(r"`([^`\n]+)`")
MENTION = re.compile(
    r"(?<![=\w.-])(?:'spoolctl([^'\n]*)'|\"spoolctl([^\"\n]*)\"|spoolctl((?:[ \t]+\S+)*))"
)
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def verb_flags() -> dict[str, set[str]]:
    """Every verb's option strings (the empty verb is the top-level group)."""
    from spoolctl.cli.contract import verb_commands
    from spoolctl.cli.verbs import GROUPS

    flags = {"": {"--version", "--help", "-h"}}
    flags |= {family: {"--json", "--help", "-h"} for family in GROUPS}
    for name, command in verb_commands().items():
        opts = {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
        flags[name] = opts | {"--help", "-h"}
    return flags


def words(text: str) -> list[str]:
    """Shell words up to the argv separator `--`, a pipe, `;`, `&&` or a comment."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        tokens = list(lexer)
    except ValueError:  # an unbalanced quote in a truncated example
        tokens = text.split()
    out: list[str] = []
    for token in tokens:
        if token == "--" or set(token) <= set("|;&<>()"):
            break
        out.append(token)
    return out


def mentions(path: Path) -> list[str]:
    """Command lines the docs show without running them: `spoolctl ...` in
    non-sh fenced blocks and inline code, and inline code that starts with
    a verb (`retry --force`) or is a bare flag (`--max-retries`)."""
    text = path.read_text(encoding="utf-8")
    found: list[str] = []
    for lang, block in ANY_FENCE.findall(text):
        if lang != "sh":
            found += [m for line in block.splitlines() for m in commands_in(line)]
    prose = ANY_FENCE.sub("", text)
    for span in INLINE.findall(prose):
        found += commands_in(span) or [span]
    return found


def commands_in(text: str) -> list[str]:
    """`spoolctl ...` commands in a line; a quoted one ends at its quote."""
    return ["spoolctl" + "".join(groups) for groups in MENTION.findall(text)]


def unknown_flags(line: str, flags: dict[str, set[str]]) -> list[str]:
    tokens = words(line)
    if tokens and tokens[0] == "spoolctl":
        tokens = tokens[1:]
        if len(tokens) > 1 and f"{tokens[0]} {tokens[1]}" in flags:  # `schedule add`
            tokens = [f"{tokens[0]} {tokens[1]}", *tokens[2:]]
        verb = tokens[0] if tokens and tokens[0] in flags else ""
        if tokens and tokens[0].isupper():  # a placeholder: `spoolctl VERB --help`
            return []
        if tokens and not tokens[0].startswith("-") and not verb:
            return [f"no verb {tokens[0]!r}"]
    elif tokens and tokens[0] in flags:
        verb = tokens[0]
    elif tokens and re.fullmatch(r"--[a-z][a-z-]*", tokens[0]):
        return [] if any(tokens[0] in opts for opts in flags.values()) else [tokens[0]]
    else:
        return []
    named = [t.split("=")[0] for t in tokens if re.fullmatch(r"--?[a-z][a-z-]*(=.*)?", t)]
    return [f"{verb} {flag}" for flag in named if flag not in flags[verb]]


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_shown_commands_name_real_verbs_and_flags(path: Path) -> None:
    flags = verb_flags()
    bad = {line: unknown for line in mentions(path) if (unknown := unknown_flags(line, flags))}
    assert not bad, f"{path.name} names verbs or flags that do not exist: {bad}"


def test_the_flag_check_catches_a_made_up_flag() -> None:
    flags = verb_flags()
    assert unknown_flags("spoolctl work --drain --bogus", flags) == ["work --bogus"]
    assert unknown_flags("spoolctl frobnicate 3", flags) == ["no verb 'frobnicate'"]
    assert unknown_flags("spoolctl VERB --help", flags) == []
    assert unknown_flags("retry --forse", flags) == ["retry --forse"]
    assert unknown_flags("--max-retry", flags) == ["--max-retry"]
    assert unknown_flags("spoolctl add --timeout 5 -- sh -c 'x --y'", flags) == []
    assert commands_in("run 'spoolctl list --bogus' then 'spoolctl show 1'") == [
        "spoolctl list --bogus",
        "spoolctl show 1",
    ]


def test_the_verb_reference_shows_every_example_as_written() -> None:
    """A shell reads these lines: `"$(openssl rand -hex 16)"` and `> err.log`
    must stay as the verb wrote them (quoting them made a literal token)."""
    from spoolctl.cli.contract import verb_commands

    page = (REPO / "docs" / "verbs.md").read_text(encoding="utf-8").splitlines()
    for name, command in verb_commands().items():
        for example in command.examples:
            assert example in page, (name, example)


FORBIDDEN = (
    r"\bSPEC\b",
    r"§ ?\d",
    r"\bDESIGN\.md\b",
    r"\bguarantees\.txt\b",
    r"\.\./shared\b",
    r"\b[Ii]ssues? #?\d+",
    r"\(#\d+\)",
    r"\b(?:issues|pull)/\d+",
)
"""References a reader of the repository cannot follow: a requirements
document kept outside it, or an issue number. Cite docs/ (design.md says
where each rule lives) or write the reason where it applies."""
OUTSIDE_REFERENCE = re.compile("|".join(FORBIDDEN))
OUTSIDE = {
    "spec": "SP" + "EC",
    "section": "\u00a7",
    "design": "DES" + "IGN.md",
    "seed": "seed/guarantees" + ".txt",
    "issue": "iss" + "ue",
    "Issue": "Iss" + "ue",
    "hash": "#",
}
"""The outside names the samples below are written with, assembled here so
that no line of the repository itself names a document outside it."""
CITATIONS = tuple(
    sample.format(**OUTSIDE)
    for sample in (
        "the revision policy of {spec} section 3",
        "appended ({spec} {section}7)",
        "the targets of {spec}.md section 6",
        "see {design}",
        "the guarantees in {seed}",
        "Bytes are data ({issue} 20 item 4)",
        "{Issue} 22's fleet",
        "fixed in {issue}s {hash}12 and ({hash}13)",
        "github.com/o/r/{issue}s/7",
    )
)
"""Citations the guard must catch (most of them once stood in this repository)."""
STANDALONE = ["spoolctl", "tests", "docs", "ARCHITECTURE.md", "README.md", "bench"]
GENERATED = {"__pycache__", ".pytest_cache", ".hypothesis", ".mypy_cache", ".ruff_cache"}
VENVS = {".venv", ".venv-ref"}
"""Virtual environments made by scripts/setup and bench/run: other projects' files."""


def outside_references(path: Path) -> list[str]:
    """`file:line: text` for each line of a text file, or of the text files
    under a folder, that cites something outside the repository; this test's
    own pattern and samples are not citations."""
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    found = []
    for file in files:
        if (GENERATED | VENVS) & set(file.parts) or file.is_relative_to(REPO / "bench" / "results"):
            continue
        raw = file.read_bytes()
        if b"\0" in raw:
            continue  # images and databases
        text = raw.decode("utf-8", errors="replace")
        if file == Path(__file__).resolve():
            for own in (*FORBIDDEN, *CITATIONS):
                text = text.replace(own, "")
        shown = file.relative_to(REPO) if file.is_relative_to(REPO) else file
        for number, line in enumerate(text.splitlines(), 1):
            if OUTSIDE_REFERENCE.search(line):
                found.append(f"{shown}:{number}: {line.strip()}")
    return found


@pytest.mark.parametrize("area", STANDALONE)
def test_the_repository_cites_only_itself(area: str) -> None:
    found = outside_references(REPO / area)
    assert not found, "cite docs/ or write the reason instead:\n" + "\n".join(found)


def test_the_citation_guard_catches_each_kind(tmp_path: Path) -> None:
    assert [text for text in CITATIONS if not OUTSIDE_REFERENCE.search(text)] == []
    innocent = ["spec = job_of(row)", 'SECRET = "s3§cr"', "#1 succeeded", "SPECIAL", "1#2"]
    assert [text for text in innocent if OUTSIDE_REFERENCE.search(text)] == []
    folder = tmp_path / "pkg"
    (folder / "sub").mkdir(parents=True)
    cited = CITATIONS[0]
    (folder / "sub" / "queue.py").write_text(f'"""Opening a queue.\n\nOn {cited}."""\n')
    (folder / "clean.md").write_text("The revision policy of docs/migrations.md.\n")
    (folder / "image.png").write_bytes(b"\x89PNG\0 " + CITATIONS[1].encode())
    assert outside_references(folder) == [f'{folder / "sub" / "queue.py"}:3: On {cited}."""']
