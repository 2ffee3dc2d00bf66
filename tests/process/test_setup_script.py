"""scripts/setup's arguments: `--extra NAME` (what the README gives for the
dashboard after ./scripts/demo) and `--dry-run`, run on a copy of the script
beside a copy of pyproject.toml, so nothing is installed and no .venv of
this checkout is touched."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

from tests.helpers import REPO


def setup_copy(tmp_path: Path) -> Path:
    (tmp_path / "scripts").mkdir()
    script = tmp_path / "scripts" / "setup"
    shutil.copy2(REPO / "scripts" / "setup", script)
    shutil.copy2(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    return script


def run(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(script), *args], capture_output=True, text=True, timeout=60, check=False
    )


def stamp(root: Path, name: str) -> None:
    """A .venv whose install of `name` is done for this pyproject.toml."""
    want = hashlib.sha256((root / "pyproject.toml").read_bytes()).hexdigest() + "-compat"
    (root / ".venv" / "bin").mkdir(parents=True, exist_ok=True)
    python = root / ".venv" / "bin" / "python"
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    (root / ".venv" / f".spoolctl-setup-{name}").write_text(want + "\n")


def test_bad_arguments_are_refused_before_anything_is_made(tmp_path: Path) -> None:
    script = setup_copy(tmp_path)
    for args in (["--extra", "nope"], ["--extra"], ["--extra="], ["--bogus"]):
        proc = run(script, *args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert "--extra NAME" in proc.stderr and "web metrics postgresql" in proc.stderr
    assert "no extra named 'nope'" in run(script, "--extra", "nope").stderr
    assert not (tmp_path / ".venv").exists()


def test_an_extra_is_the_runtime_and_the_extra_and_is_installed_once(tmp_path: Path) -> None:
    script = setup_copy(tmp_path)
    fresh = run(script, "--extra", "web", "--dry-run")
    assert fresh.returncode == 0, fresh.stderr
    assert fresh.stdout.splitlines() == [
        "would create .venv",
        "would install spoolctl's runtime dependencies into .venv",
        "would install the extras web into .venv",
    ]
    stamp(tmp_path, "runtime")  # as ./scripts/demo leaves it
    both = run(script, "--extra=web,metrics", "--extra", "web", "--dry-run")
    assert both.stdout.splitlines() == ["would install the extras web metrics into .venv"]
    stamp(tmp_path, "extra-web")
    assert run(script, "--extra", "web", "--dry-run").stdout == "nothing to install\n"
    stamp(tmp_path, "full")  # the test setup holds every extra
    assert run(script, "--extra", "postgresql", "--dry-run").stdout == "nothing to install\n"
