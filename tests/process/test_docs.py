"""Every command shown in the docs runs: the fenced ```sh blocks of README.md
and docs/*.md are executed, file by file, against a scratch queue. Commands
that must not run are checked against the click tree instead, in-process:
tests/unit/test_docs.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, child_env
from tests.unit.test_docs import DOCS

pytestmark = pytest.mark.timeout(180)

FENCE = re.compile(r"^```sh\n(.*?)^```", re.MULTILINE | re.DOTALL)


def sh_blocks(path: Path) -> list[str]:
    return FENCE.findall(path.read_text(encoding="utf-8"))


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize(
    "path", [p for p in DOCS if sh_blocks(p)], ids=lambda p: p.relative_to(REPO).as_posix()
)
def test_shell_examples_run(path: Path, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "spoolctl"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m spoolctl "$@"\n')
    wrapper.chmod(0o755)
    env = child_env(
        {
            "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "SPOOLCTL_DB": str(tmp_path / "spool" / "queue.db"),
            "NO_COLOR": "1",
        }
    )
    for number, block in enumerate(sh_blocks(path), 1):
        proc = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", block],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, (
            f"{path.name} block {number} failed ({proc.returncode}):\n{block}\n"
            f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        )
        assert "Traceback" not in proc.stderr + proc.stdout
