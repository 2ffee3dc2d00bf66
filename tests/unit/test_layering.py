"""The architecture holds: click stays in the CLI, no backend is asked for
outside its driver, and every module and class stays short enough to read.
That the add path stays lean and the revision scripts travel inside the
wheel takes real processes: tests/process/test_layering.py."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.helpers import REPO

PACKAGE = REPO / "spoolctl"
ENTRY_POINTS = {"__main__.py"}
BELOW_CLI = [
    p
    for p in PACKAGE.rglob("*.py")
    if "cli" not in p.relative_to(PACKAGE).parts and p.name not in ENTRY_POINTS
]


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("path", BELOW_CLI, ids=lambda p: str(p.relative_to(REPO)))
def test_no_click_or_printing_below_the_cli(path: Path) -> None:
    modules = imported_modules(path)
    assert not any(m == "click" or m.startswith("click.") for m in modules)
    assert not any(m.startswith("spoolctl.cli") for m in modules)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    calls = {
        node.func.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    }
    assert "print" not in calls
    attributes = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    assert "exit" not in attributes


def test_alembic_is_imported_only_by_the_revision_module() -> None:
    for path in PACKAGE.rglob("*.py"):
        if path.name == "revision.py" or "_migrations" in path.parts:
            continue
        assert not any(m.startswith("alembic") for m in imported_modules(path)), path


def test_prometheus_client_is_imported_only_by_the_exposition_module() -> None:
    """The metrics extra is optional: `metrics` and the web's /metrics load
    spoolctl.exposition lazily, and nothing else names prometheus_client."""
    for path in PACKAGE.rglob("*.py"):
        if path.name == "exposition.py":
            continue
        assert not any(m.startswith("prometheus_client") for m in imported_modules(path)), path
    importers = [p for p in PACKAGE.rglob("*.py") if "spoolctl.exposition" in p.read_text()]
    assert sorted(p.relative_to(PACKAGE).as_posix() for p in importers) == [
        "cli/metrics.py",
        "web/app.py",
    ]


def test_the_fixtures_tests_read_live_inside_the_checkout() -> None:
    """A fresh clone passes on its own: the legacy fixtures the tests use are
    the copies in tests/fixtures, with their manifest."""
    from tests.unit import test_legacy

    assert test_legacy.FIXTURES.resolve().is_relative_to(REPO.resolve())
    assert (test_legacy.FIXTURES / "MANIFEST.md").is_file()
    assert (test_legacy.FIXTURES / "expected.json").is_file()


BACKEND_CHECK = re.compile(
    r"dialect\.name|\bis_postgres\w*"
    r"|isinstance\((?:\w+\.)?(db|target|where|location|queue|driver|path|url),"
    r"\s*\(?(Path|str|SqliteDriver|PostgresDriver)\b"
    r"|\.name\s*[!=]=\s*[\"'](sqlite|postgresql)[\"']"
)
"""What a backend check looks like: a dialect's name, `is_postgres...`, or an
isinstance test on what a queue target used to be (a path or a URL string)
or on a driver class."""


def backend_checks(path: Path) -> list[str]:
    """Lines of a module that decide which backend a queue is on."""
    return [f"{path}:{found}" for found in backend_checks_in(path)]


def test_no_backend_is_asked_for_outside_its_driver() -> None:
    """Everything that differs between SQLite and PostgreSQL lives in
    spoolctl/db/backends/ (one driver per backend); nothing else asks which
    backend a queue is on. Adding a third engine is one new driver."""
    outside = [p for p in PACKAGE.rglob("*.py") if "backends" not in p.relative_to(PACKAGE).parts]
    found = [line for path in sorted(outside) for line in backend_checks(path)]
    assert found == []


def test_the_backend_check_finds_what_it_looks_for(tmp_path: Path) -> None:
    sample = tmp_path / "module.py"
    sample.write_text(
        "if conn.dialect.name == 'postgresql':\n    pass\n"
        "if is_postgres(target):\n    pass\n"
        "if isinstance(location.target, str):\n    pass\n"
        "if isinstance(value, str):\n    pass\n"
        "if queue.driver.name == 'sqlite':\n    pass\n"
        "states = (where.state,) if isinstance(where.state, str) else where.state\n"
    )
    found = [line.rsplit(": ", 1)[-1] for line in backend_checks_in(sample)]
    assert found == [
        "if conn.dialect.name == 'postgresql':",
        "if is_postgres(target):",
        "if isinstance(location.target, str):",
        "if queue.driver.name == 'sqlite':",
    ]


def backend_checks_in(path: Path) -> list[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [f"{n}: {line.strip()}" for n, line in enumerate(lines, 1) if _is_check(line)]


def _is_check(line: str) -> bool:
    return BACKEND_CHECK.search(line) is not None


MODULE_MAX_LINES = 400
CLASS_MAX_LINES = 200
SIZE_EXEMPT: dict[str, str] = {
    "spoolctl/cli/schemas.py": (
        "the data schema of every verb, one declaration each: a reference table"
        " read by lookup, not top to bottom; split by length it made an import circle"
    ),
    "spoolctl/cli/capabilities.py": (
        "one function per section of the published contract (verbs, codes,"
        " environment, limits, scheduling), each built from its own source of truth"
    ),
    "spoolctl/worker/loop.py": (
        "class Worker sequences every duty of a worker's pass; its size is the"
        " number of duties, each a short method"
    ),
}
"""Modules of spoolctl/ allowed past the limits (path from the repository
root -> why, on `ruff format`'s layout), each until its reason goes: an
exemption no longer needed fails the test too. A limit is a prompt to look,
not a reason to split: a module split only for length is worse than one
long module with a reason here."""


def oversized(path: Path, root: Path) -> list[str]:
    """What in one module passes the limits: its own length, and each class's
    (decorators included)."""
    text = path.read_text(encoding="utf-8")
    name = path.relative_to(root).as_posix()
    found = []
    if (length := len(text.splitlines())) > MODULE_MAX_LINES:
        found.append(f"{name}: {length} lines (at most {MODULE_MAX_LINES})")
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef):
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            if (length := (node.end_lineno or node.lineno) - start + 1) > CLASS_MAX_LINES:
                found.append(
                    f"{name}:{node.lineno}: class {node.name}: {length} lines"
                    f" (at most {CLASS_MAX_LINES})"
                )
    return found


def size_problems(package: Path, root: Path, exempt: dict[str, str]) -> list[str]:
    """Every module or class past the limits outside `exempt`, and every
    exemption whose module is gone or back within them."""
    problems = []
    for path in sorted(package.rglob("*.py")):
        found = oversized(path, root)
        name = path.relative_to(root).as_posix()
        if name not in exempt:
            problems += found
        elif not found:
            problems.append(f"{name} is within the limits now: drop its exemption")
    present = {p.relative_to(root).as_posix() for p in package.rglob("*.py")}
    problems += [f"{name} is gone: drop its exemption" for name in exempt if name not in present]
    return problems


def test_every_module_and_class_is_short_enough_to_read() -> None:
    """A newcomer reads any module of spoolctl/ in one sitting: no module over
    400 lines, no class over 200 (as `ruff format` lays them out, which the
    linters hold), unless an exemption says why."""
    assert size_problems(PACKAGE, REPO, SIZE_EXEMPT) == []


def test_the_size_check_finds_what_it_looks_for(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    body = [f"    x{n} = {n}" for n in range(CLASS_MAX_LINES - 2)]
    fits = ["@dataclass", "class Fits:", *body, *["y = 1"] * (MODULE_MAX_LINES - CLASS_MAX_LINES)]
    (package / "fits.py").write_text("\n".join(fits) + "\n")
    (package / "long.py").write_text("\n".join([*fits, "z = 2"]) + "\n")
    (package / "wide.py").write_text("\n".join(["@dataclass", "class Wide:", *body, "    z = 2"]))
    wide = f"pkg/wide.py:2: class Wide: {CLASS_MAX_LINES + 1} lines (at most {CLASS_MAX_LINES})"
    assert size_problems(package, tmp_path, {}) == [
        f"pkg/long.py: {MODULE_MAX_LINES + 1} lines (at most {MODULE_MAX_LINES})",
        wide,
    ]
    exempt = {"pkg/fits.py": "a reason", "pkg/long.py": "a reason", "pkg/gone.py": "a reason"}
    assert size_problems(package, tmp_path, exempt) == [
        "pkg/fits.py is within the limits now: drop its exemption",
        wide,
        "pkg/gone.py is gone: drop its exemption",
    ]
