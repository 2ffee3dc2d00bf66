"""tests/README.md is the map of the tests, and it cannot rot: every test
file it names exists, every test file is named in it and sits in the folder
of its kind, and it has a row for every guarantee of docs/guarantees.md and
every verb of docs/verbs.md."""

from __future__ import annotations

import re

from tests.conftest import KINDS
from tests.helpers import REPO

TESTS = REPO / "tests"
MAP = (TESTS / "README.md").read_text(encoding="utf-8")
NAMED = re.compile(r"`((?:" + "|".join(KINDS) + r")/test_\w+\.py)`")
ROW = re.compile(r"^\| ([^|]+?) \|", re.MULTILINE)
NOT_GUARANTEES = {"Scope", "Test knobs"}
"""Sections of docs/guarantees.md that state no guarantee."""


def all_test_files() -> list[str]:
    return sorted(p.relative_to(TESTS).as_posix() for p in TESTS.rglob("test_*.py"))


def headings(page: str) -> list[str]:
    text = (REPO / "docs" / page).read_text(encoding="utf-8")
    return re.findall(r"^## (.+?)\s*$", text, re.MULTILINE)


def test_every_test_file_the_map_names_exists() -> None:
    missing = sorted(set(NAMED.findall(MAP)) - set(all_test_files()))
    assert missing == [], "tests/README.md names test files that are not there"


def test_every_test_file_is_on_the_map() -> None:
    unnamed = sorted(set(all_test_files()) - set(NAMED.findall(MAP)))
    assert unnamed == [], "add each to tests/README.md, under what it proves"


def test_every_test_file_is_in_the_folder_of_its_kind() -> None:
    misplaced = [f for f in all_test_files() if f.count("/") != 1 or f.split("/")[0] not in KINDS]
    assert misplaced == [], f"test files go in one of tests/{{{','.join(KINDS)}}}/"


def test_every_guarantee_has_a_row() -> None:
    guarantees = [h for h in headings("guarantees.md") if h not in NOT_GUARANTEES]
    assert guarantees, "docs/guarantees.md lists no guarantee"
    rows = set(ROW.findall(MAP))
    assert [g for g in guarantees if g not in rows] == []


def test_every_verb_has_a_row() -> None:
    verbs = headings("verbs.md")
    assert "add" in verbs and "schedule add" in verbs
    rows = set(ROW.findall(MAP))
    assert [v for v in verbs if f"`{v}`" not in rows] == []
