"""The reference's cached virtual environment survives what CI and developers
do to it: two pytest processes building it at once, and a build that died
half-way (a folder without its completion marker)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.compat.reference import COMPLETE, REFERENCE_VERSION, installed_version, venv_dir

pytestmark = [pytest.mark.timeout(600), pytest.mark.subprocess, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
BUILD = (
    "import sys\nfrom tests.compat.reference import reference_python\nprint(reference_python())\n"
)


def test_racing_builds_over_a_half_built_cache_agree(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    env = {**os.environ, "SPOOLCTL_COMPAT_CACHE": str(cache), "PYTHONPATH": str(REPO)}
    half = cache / venv_dir().name
    (half / "bin").mkdir(parents=True)
    (half / "bin" / "python").write_text("#!/bin/sh\nexit 1\n")  # a build that died early
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", BUILD],
            env=env,
            cwd=REPO,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(2)
    ]
    answers = [proc.communicate(timeout=540) for proc in racers]
    assert [proc.returncode for proc in racers] == [0, 0], answers
    paths = {out.strip() for out, _ in answers}
    assert paths == {str(half / "bin" / "python")}
    assert (half / COMPLETE).read_text().strip() == REFERENCE_VERSION
    assert installed_version(half / "bin" / "python") == REFERENCE_VERSION
