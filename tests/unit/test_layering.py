"""The architecture holds: the layers keep the order ARCHITECTURE.md draws and
no module imports itself through others, click stays in the CLI, no backend
is asked for outside its driver, and every module and class stays short
enough to read. That the add path stays lean and the revision scripts travel
inside the wheel takes real processes: tests/process/test_layering.py."""

from __future__ import annotations

import ast
import re
from collections.abc import Container, Sequence
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


def module_names(package: Path) -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its own:
    `spoolctl.db` is spoolctl/db/__init__.py)."""
    names = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


class _Imports(ast.NodeVisitor):
    """The modules of the package one module imports, each with its first line:
    every import statement, at module level, in a function or a class, and
    under `if TYPE_CHECKING:` (a type the module names is a module it needs to
    be read). `from a import b` imports the module a.b where there is one,
    else a; a relative import is resolved from the importing module. A module
    loaded by a name written in the call (`importlib.import_module("a.b")`)
    is imported too; one loaded by a name held in data is noted in `by_name`."""

    def __init__(self, name: str, is_package: bool, modules: Container[str]) -> None:
        self.name, self.modules = name, modules
        self.base = name if is_package else name.rpartition(".")[0]
        self.found: dict[str, int] = {}
        self.by_name: list[int] = []

    def _add(self, target: str, line: int) -> None:
        while target and target not in self.modules:
            target = target.rpartition(".")[0]
        if target and target != self.name:
            self.found.setdefault(target, line)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node.lineno)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name in ("import_module", "__import__"):
            first = node.args[0] if node.args else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                self._add(first.value, node.lineno)
            else:
                self.by_name.append(node.lineno)
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        origin = node.module or ""
        if node.level:
            up = self.base.split(".")[: len(self.base.split(".")) - node.level + 1]
            origin = ".".join([*up, *([origin] if origin else [])])
        for alias in node.names:
            submodule = f"{origin}.{alias.name}"
            self._add(submodule if submodule in self.modules else origin, node.lineno)


def import_graph(package: Path) -> dict[str, dict[str, int]]:
    """Module -> {module of the package it imports: line}. Importing a module
    also runs its parent packages' __init__.py; that is no edge here (a
    package's __init__ that imports its own modules would otherwise be a
    circle by construction). A module loaded by a name held in data is no
    edge either: only the registries do that (`LOADED_BY_NAME`)."""
    return {name: found for name, (found, _) in _imports(package).items()}


def _imports(package: Path) -> dict[str, tuple[dict[str, int], list[int]]]:
    """Module -> (the modules it imports, the lines that load one by a name
    held in data)."""
    modules = module_names(package)
    found = {}
    for name, path in modules.items():
        visitor = _Imports(name, path.name == "__init__.py", modules)
        visitor.visit(ast.parse(path.read_text(encoding="utf-8")))
        found[name] = (visitor.found, visitor.by_name)
    return found


def import_circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Every group of modules that import each other, directly or not (the
    strongly connected components with more than one module), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in graph[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = []
            while not group or group[-1] != module:
                group.append(stack.pop())
            if len(group) > 1:
                circles.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(circles)


def test_no_module_imports_itself_through_others() -> None:
    """No import circle in the package, whether the imports run at load time,
    in a function or only for the type checker."""
    graph = import_graph(PACKAGE)
    circles = import_circles(graph)
    shown = [
        [f"{m} -> {', '.join(f'{t}:{graph[m][t]}' for t in graph[m] if t in c)}" for m in c]
        for c in circles
    ]
    assert circles == [], shown


def test_the_circle_check_finds_what_it_looks_for(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from pkg import leaf\n")
    (package / "leaf.py").write_text("import os\n")
    (package / "a.py").write_text("def f():\n    from pkg.sub import b\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "b.py").write_text("from ..c import thing\n")
    (package / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n"
    )
    (package / "d.py").write_text(
        "import pkg.leaf\nfrom pkg import e\nimport importlib\n"
        "importlib.import_module('pkg.a')\nimportlib.import_module(NAMES[0])\n"
    )
    (package / "e.py").write_text("from pkg.leaf import os\n")
    graph = import_graph(package)
    assert graph["pkg.a"] == {"pkg.sub.b": 2}
    assert graph["pkg.sub.b"] == {"pkg.c": 1}
    assert graph["pkg.d"] == {"pkg.leaf": 1, "pkg.e": 2, "pkg.a": 4}
    assert _imports(package)["pkg.d"][1] == [5]
    assert import_circles(graph) == [["pkg.a", "pkg.c", "pkg.sub.b"]]
    (package / "c.py").write_text("thing = 1\n")
    assert import_circles(import_graph(package)) == []


LOADED_BY_NAME = {
    "spoolctl/cli/app.py": "the verbs: each verb's module is loaded when it is called",
    "spoolctl/db/backends/__init__.py": (
        "the driver registry: a driver is loaded once a --db value chose it, and"
        " no module below the drivers depends on one (a plug-in)"
    ),
}
"""The only modules that load a module by a name held in data (no import
statement, so no edge of the import graph), each with why."""


def test_only_the_registries_load_modules_by_names_held_in_data() -> None:
    loaders = {
        module_names(PACKAGE)[name].relative_to(REPO).as_posix()
        for name, (_, by_name) in _imports(PACKAGE).items()
        if by_name
    }
    assert loaders == set(LOADED_BY_NAME)


LAYERS: tuple[tuple[str, ...], ...] = (
    ("cli/", "web/", "exposition.py", "__main__.py"),
    ("worker/",),
    (
        "runner/supervise.py",
        "runner/stopping.py",
        "runner/contained.py",
        "runner/liveness.py",
        "runner/capacity.py",
    ),
    ("services/",),
    ("db/backends/sqlite/", "db/backends/postgresql/"),
    ("db/",),
    ("runner/",),
    (
        "errors.py",
        "states.py",
        "text.py",
        "validate.py",
        "layout.py",
        "config.py",
        "resources.py",
        "__init__.py",
    ),
)
"""The layers of spoolctl/, top to bottom, as ARCHITECTURE.md draws them
(`test_the_layers_are_the_ones_architecture_md_draws`): a module may import
its own layer and the layers below it. A folder holds every module under it
that no longer entry names."""


def layer_of(path: str, layers: Sequence[Sequence[str]]) -> int | None:
    """The index of the layer a module (its path inside the package) is in:
    the one with the longest entry that names it; None if none does."""
    found, longest = None, -1
    for index, entries in enumerate(layers):
        for entry in entries:
            names = path.startswith(entry) if entry.endswith("/") else path == entry
            if names and len(entry) > longest:
                found, longest = index, len(entry)
    return found


def order_problems(package: Path, layers: Sequence[Sequence[str]]) -> list[str]:
    """Every module in no layer, and every import of a layer above the
    importer's."""
    paths = {
        name: path.relative_to(package).as_posix() for name, path in module_names(package).items()
    }
    where = {name: layer_of(path, layers) for name, path in paths.items()}
    problems = [f"{paths[name]} is in no layer" for name in sorted(where) if where[name] is None]
    for name, imported in sorted(import_graph(package).items()):
        for target, line in imported.items():
            low, high = where[name], where[target]
            if low is not None and high is not None and high < low:
                problems.append(f"{paths[name]}:{line} imports {paths[target]}, a layer above it")
    return problems


def test_each_layer_imports_only_its_own_and_the_layers_below() -> None:
    assert order_problems(PACKAGE, LAYERS) == []


def test_the_order_check_finds_what_it_looks_for(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "top").mkdir(parents=True)
    (package / "low").mkdir()
    (package / "__init__.py").write_text("")
    (package / "top" / "__init__.py").write_text("")
    (package / "top" / "a.py").write_text("from pkg import mid\nfrom pkg.low import b\n")
    (package / "mid.py").write_text("def f():\n    from pkg.low import b\n")
    (package / "low" / "__init__.py").write_text("")
    (package / "low" / "b.py").write_text("from pkg import mid\n")
    (package / "low" / "c.py").write_text("from pkg.top import a\n")
    (package / "stray.py").write_text("")
    layers = (("top/",), ("mid.py", "low/c.py"), ("low/", "__init__.py"))
    assert order_problems(package, layers) == [
        "stray.py is in no layer",
        "low/b.py:1 imports mid.py, a layer above it",
        "low/c.py:1 imports top/a.py, a layer above it",
    ]


def architecture_layers(text: str) -> list[tuple[str, ...]]:
    """The layers ARCHITECTURE.md's picture draws: the first fenced block
    after `## Layers`, one layer a line (its modules, comma-separated, then
    two spaces or more and what it does); arrows between them."""
    section = text.split("## Layers", 1)[1]
    block = section.split("```", 2)[1]
    layers = []
    for line in block.splitlines():
        if line.strip() and not line.startswith((" ", "↓")):
            modules = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
            layers.append(tuple(m.strip() for m in modules.split(",")))
    return layers


def test_the_layers_are_the_ones_architecture_md_draws() -> None:
    drawn = architecture_layers((REPO / "ARCHITECTURE.md").read_text(encoding="utf-8"))
    assert drawn == [tuple(layer) for layer in LAYERS]


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
    "spoolctl/services/job_spec.py": (
        "FIELDS is the one declaration of every job attribute (its flag, batch key, column,"
        " schedule, identity, label), a reference table read by lookup, with the readings"
        " its rows are written in"
    ),
    "spoolctl/cli/output.py": (
        "the `output` verb, now and with --follow: one answer, read once or as it"
        " grows; split by length the two imported each other"
    ),
    "spoolctl/runner/supervise.py": (
        "class Execution is one attempt from spawn to end: its process and cgroup, its"
        " outcome, and every signal it gets (signal, suspend, continue, the warning, a"
        " timeout's or a cancel's first signal, the group's end, SIGKILL), each a short"
        " method over the process and cgroup it holds (when each is due and how far the"
        " stopping has gone are runner/stopping.py's); the module adds the attempt's"
        " output files and its spawn record"
    ),
    "spoolctl/db/tables.py": (
        "the schema's single definition: every table with its columns, constraints and"
        " indexes, one block each, read by lookup; a migration test compares it whole"
    ),
    "spoolctl/db/lean_sql.py": (
        "generated by scripts/gen_docs.py: the lean path's statements as SQLAlchemy"
        " compiles them, never read or edited by hand"
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
