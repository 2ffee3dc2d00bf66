"""The newcomer's path holds together: the README has the sections a newcomer
needs, its performance table is one run recorded in docs/performance.md (the
measurement notebook, where every other run lives), docs/index.md links every
page of docs/, and every relative link in README.md and docs/*.md points at a
file (and heading) that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes."""
    headings = re.findall(r"^#+ (.+)$", FENCE.sub("", path.read_text(encoding="utf-8")), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_readme_has_the_newcomers_sections() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## (.+)$", text, re.M)
    for wanted in (
        "Two commands",
        "A ten-line tour",
        "What it guarantees",
        "How it compares",
        "Performance",
        "Limitations",
        "Documentation",
    ):
        assert wanted in headings, wanted
    assert "./scripts/demo" in text and "./scripts/test" in text
    table = text.split("<!-- perf-table -->")[1].split("<!-- /perf-table -->")[0]
    assert table.strip().startswith("|"), "the perf table sits between its markers"
    for tool in ("nohup", "tmux", "task-spooler", "nq", "pueue", "0.4.11", "cron", "Celery"):
        assert tool in text, tool


RUN_ID = re.compile(r"\b\d{8}T\d{6}Z\b")


def unlinked(line: str) -> str:
    """A table row with its links' targets dropped: the README and docs/ link
    the same page by different relative paths."""
    return re.sub(r"\]\([^)]*\)", "]", line)


def test_the_readme_shows_one_run_and_the_notebook_records_it() -> None:
    """The README's table comes from one benchmark run, named once; that run
    and its table are in docs/performance.md, so the README can be brought
    up to date with a newer run without losing the old one."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    notebook = (REPO / "docs" / "performance.md").read_text(encoding="utf-8")
    runs = set(RUN_ID.findall(readme))
    assert len(runs) == 1, f"the README names one run, not {sorted(runs)}"
    assert runs <= set(RUN_ID.findall(notebook))
    table = readme.split("<!-- perf-table -->")[1].split("<!-- /perf-table -->")[0]
    rows = [unlinked(line) for line in table.splitlines() if line.startswith("|")]
    recorded = {unlinked(line) for line in notebook.splitlines()}
    missing = [row for row in rows if row not in recorded]
    assert rows and missing == [], missing
    assert "docs/performance.md" in readme.split("## Performance")[1]


def test_the_index_links_every_page() -> None:
    index = (REPO / "docs" / "index.md").read_text(encoding="utf-8")
    linked = {target.split("#")[0] for target in LINK.findall(index)}
    pages = {p.name for p in (REPO / "docs").glob("*.md")} - {"index.md"}
    assert pages <= linked, pages - linked
    assert "docs/index.md" in (REPO / "README.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_relative_links_resolve(page: Path) -> None:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not checked offline
        file_part, _, anchor = target.partition("#")
        resolved = (page.parent / file_part).resolve() if file_part else page
        if not resolved.exists() or (anchor and anchor not in anchors(resolved)):
            broken.append(target)
    assert not broken, f"{page.name}: broken links {broken}"


def test_the_architecture_page_names_modules_that_exist() -> None:
    """ARCHITECTURE.md names modules and tests by path: each must exist (the
    page goes stale the day a module moves)."""
    page = (REPO / "ARCHITECTURE.md").read_text(encoding="utf-8")
    files = [p.relative_to(REPO).as_posix() for p in REPO.glob("**/*.py") if ".venv" not in p.parts]
    named = set(re.findall(r"`([\w/]+\.py)`", page))
    assert named, "the page names no module"
    missing = [n for n in sorted(named) if not any(f == n or f.endswith("/" + n) for f in files)]
    assert missing == []
    folders = {f.rsplit("/", 1)[0] + "/" for f in files}
    for folder in re.findall(r"`([\w/]+/)`", page):
        assert any(f == folder or f.endswith("/" + folder) for f in folders), folder
