"""The benchmark and the tests share only devtools/: bench/ never imports
tests/, tests/ never imports bench/, devtools/ imports neither, and only
devtools/pg_server.py runs PostgreSQL's initdb and pg_ctl (one server start,
whose FAST profile the tests use and whose DURABLE one the benchmark does).

bench/ is not part of the test run; these checks only read its source."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers import REPO
from tests.unit.test_layering import imported_modules

BENCH = REPO / "bench"
DEVTOOLS = REPO / "devtools"
TESTS = REPO / "tests"
SERVER_TOOLS = {"initdb", "pg_ctl"}


def _sources(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.py"))


def _ids(path: Path) -> str:
    return str(path.relative_to(REPO))


def _dynamic_imports(tree: ast.AST) -> set[str]:
    """Module names given as a literal to importlib.import_module or __import__."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        first = node.args[0]
        if called in ("import_module", "__import__") and isinstance(first, ast.Constant):
            names.add(str(first.value))
    return names


def imports_of(path: Path, packages: set[str]) -> list[str]:
    """Every module path imports, at any depth (lazy imports in functions
    included, and literal importlib.import_module names), that is one of
    packages or inside one."""
    found = imported_modules(path) | _dynamic_imports(ast.parse(path.read_text(encoding="utf-8")))
    return sorted(m for m in found if m.split(".")[0] in packages)


@pytest.mark.parametrize("path", _sources(BENCH), ids=_ids)
def test_bench_does_not_import_the_tests(path: Path) -> None:
    assert imports_of(path, {"tests"}) == [], "move what bench needs into devtools/"


@pytest.mark.parametrize("path", _sources(TESTS), ids=_ids)
def test_the_tests_do_not_import_bench(path: Path) -> None:
    assert imports_of(path, {"bench"}) == [], "move what the tests need into devtools/"


@pytest.mark.parametrize("path", _sources(DEVTOOLS), ids=_ids)
def test_devtools_imports_neither_the_tests_nor_bench(path: Path) -> None:
    assert imports_of(path, {"tests", "bench"}) == []


def _runs_server_tools(path: Path) -> bool:
    """path names initdb or pg_ctl as a string of its own (an argv word, a
    path part), not merely in prose."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return any(
        isinstance(node, ast.Constant) and node.value in SERVER_TOOLS for node in ast.walk(tree)
    )


def test_only_devtools_starts_a_postgresql_server() -> None:
    this = Path(__file__).resolve()  # names the tools to look for
    starters = [
        _ids(p)
        for p in (*_sources(BENCH), *_sources(TESTS), *_sources(DEVTOOLS))
        if p.resolve() != this and _runs_server_tools(p)
    ]
    assert starters == ["devtools/pg_server.py"]


def test_the_checks_see_every_form_of_import(tmp_path: Path) -> None:
    """The checks above would catch a module that imports the tests: at the
    top, in a function, from a submodule, or through importlib."""
    forms = {
        "import tests": ["tests"],
        "from tests.pg_server import start_server": ["tests.pg_server"],
        "def f():\n    import tests.helpers as h\n    return h": ["tests.helpers"],
        "import importlib\nm = importlib.import_module('tests.pg_server')": ["tests.pg_server"],
        "m = __import__('tests')": ["tests"],
        "import testsuite\nfrom devtools.pg_server import FAST": [],
    }
    for i, (source, expected) in enumerate(forms.items()):
        module = tmp_path / f"m{i}.py"
        module.write_text(source + "\n")
        assert imports_of(module, {"tests"}) == expected, source
    runner = tmp_path / "runner.py"
    runner.write_text('"""Runs initdb."""\nfrom pathlib import Path\nx = Path("bin") / "initdb"\n')
    assert _runs_server_tools(runner)
    runner.write_text('"""Runs initdb and pg_ctl, in prose only."""\n')
    assert not _runs_server_tools(runner)
