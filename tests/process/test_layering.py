"""The architecture holds where it takes real processes to see it: the add
and status paths stay lean (what a fresh interpreter imports for them), and
the revision scripts travel inside the wheel, which alone creates and
migrates a queue. The rest of the architecture's checks read the source, in
tests/unit/test_layering.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import REPO, child_env


def modules_after(argv: list[str], tmp_path: Path) -> tuple[dict[str, Any], set[str]]:
    """Run one --json command line in a fresh interpreter: its envelope (after
    checking it succeeded with exit 0) and every module it imported. A verb
    that failed early imports little, so its imports would prove nothing."""
    listing = tmp_path / "modules.json"
    script = (
        "import sys, json\n"
        "from spoolctl.cli import run\n"
        f"code = run({argv!r})\n"
        f"open({str(listing)!r}, 'w').write(json.dumps(sorted(sys.modules)))\n"
        "sys.exit(code)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=child_env(),
        timeout=60,
    )
    assert proc.returncode == 0, (argv, proc.stdout, proc.stderr)
    envelope = json.loads(proc.stdout)
    assert envelope["ok"] is True and envelope["errors"] == [], envelope
    return envelope, set(json.loads(listing.read_text()))


@pytest.mark.subprocess
def test_add_path_imports_neither_alembic_nor_psutil(tmp_path: Path) -> None:
    db = tmp_path / "q" / "queue.db"
    # The first add creates the database (that may load alembic); the steady
    # state is the second one.
    first, _ = modules_after(["add", "--db", str(db), "--json", "--", "true"], tmp_path)
    envelope, loaded = modules_after(["add", "--db", str(db), "--json", "--", "true"], tmp_path)
    assert envelope["data"]["job_id"] == first["data"]["job_id"] + 1, "the job was added"
    assert "spoolctl.cli.lean" in loaded and "spoolctl.cli.jobs" not in loaded, "the lean path"
    heavy = {"sqlalchemy", "click", "dataclasses", "uuid"} & {m.split(".")[0] for m in loaded}
    assert not heavy, f"the lean path loaded {heavy}"
    assert not any(m.split(".")[0] == "alembic" for m in loaded)
    assert "psutil" not in loaded
    assert "prometheus_client" not in loaded
    assert "spoolctl.worker" not in loaded
    assert "sqlalchemy.dialects.postgresql" not in loaded, "an SQLite add loaded PostgreSQL's"


@pytest.mark.subprocess
def test_worker_start_imports_neither_alembic_nor_psutil(tmp_path: Path) -> None:
    """A worker asks /proc for start times (its own, its jobs'): psutil is
    imported only where a reap or a liveness check needs it."""
    db = tmp_path / "q" / "queue.db"
    modules_after(["add", "--db", str(db), "--json", "--", "true"], tmp_path)
    envelope, loaded = modules_after(["work", "--drain", "--db", str(db), "--json"], tmp_path)
    assert envelope["data"]["executed"] == 1, envelope
    assert "spoolctl.worker" in loaded
    assert not any(m.split(".")[0] == "alembic" for m in loaded)
    assert "psutil" not in loaded


@pytest.mark.subprocess
def test_status_path_imports_neither_sqlalchemy_nor_click(tmp_path: Path) -> None:
    db = tmp_path / "q" / "queue.db"
    modules_after(["add", "--db", str(db), "--json", "--", "true"], tmp_path)
    envelope, loaded = modules_after(["status", "--db", str(db), "--json"], tmp_path)
    assert envelope["data"]["counts"]["queued"] == 1, "status read the queue"
    assert "spoolctl.cli.lean_read" in loaded and "spoolctl.cli.status" not in loaded, "lean"
    heavy = {"sqlalchemy", "click", "dataclasses", "uuid", "alembic"}
    assert not heavy & {m.split(".")[0] for m in loaded}, "the lean path of status"


WHEEL_SOURCES = ("pyproject.toml", "README.md", "spoolctl", "migrations")
"""What setuptools reads to build the wheel (pyproject.toml's packages and
package-dir); the build runs on a copy of them."""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One wheel for the module's tests, built offline from a copy of the
    checkout's sources: setuptools writes build/ and *.egg-info beside what it
    builds, and two builds of one folder at once (parallel test workers) break
    each other's."""
    root = tmp_path_factory.mktemp("wheel")
    source, out = root / "src", root / "out"
    source.mkdir()
    for name in WHEEL_SOURCES:
        origin = REPO / name
        if origin.is_dir():
            shutil.copytree(origin, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(origin, source / name)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return next(out.glob("spoolctl-*.whl"))


@pytest.mark.subprocess
def test_wheel_ships_the_revision_scripts(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert "spoolctl/_migrations/env.py" in names
    assert "spoolctl/_migrations/script.py.mako" in names
    shipped = {Path(n).name for n in names if n.startswith("spoolctl/_migrations/versions/")}
    in_repo = {p.name for p in (REPO / "migrations" / "versions").glob("*.py")}
    assert in_repo <= shipped
    modules = {p.relative_to(REPO).as_posix() for p in (REPO / "spoolctl").rglob("*.py")}
    assert modules - set(names) == set(), "a package of spoolctl/ is missing from the wheel"
    web_files = {
        p.relative_to(REPO).as_posix()
        for p in (REPO / "spoolctl" / "web").rglob("*")
        if p.is_file() and p.suffix in (".html", ".js", ".css")
    }
    assert web_files and web_files <= set(names)


@pytest.mark.subprocess
def test_installed_wheel_migrates_from_any_directory(tmp_path: Path, wheel: Path) -> None:
    """The wheel alone (no repository, no alembic.ini) can create and migrate a queue."""
    target, elsewhere = tmp_path / "site", tmp_path / "elsewhere"
    elsewhere.mkdir()
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    env = child_env({"PYTHONPATH": str(target)})
    db = elsewhere / "q" / "queue.db"
    where = subprocess.run(
        [sys.executable, "-c", "import spoolctl; print(spoolctl.__file__)"],
        capture_output=True,
        text=True,
        cwd=elsewhere,
        env=env,
        check=True,
    )
    assert where.stdout.startswith(str(target))
    for argv in (["migrate", "--db", str(db)], ["add", "--db", str(db), "--", "true"]):
        proc = subprocess.run(
            [sys.executable, "-m", "spoolctl", *argv],
            capture_output=True,
            text=True,
            cwd=elsewhere,
            env=env,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
    status = subprocess.run(
        [sys.executable, "-m", "spoolctl", "migrate", "--status", "--db", str(db), "--json"],
        capture_output=True,
        text=True,
        cwd=elsewhere,
        env=env,
        timeout=60,
    )
    data = json.loads(status.stdout)["data"]
    assert data["current"] == data["head"]
    assert data["pending"] == []
