"""The original spoolctl, installed from the package registry into a virtual
environment of its own, cached between runs and keyed by version.

The cache lives in $SPOOLCTL_COMPAT_CACHE, else $XDG_CACHE_HOME/spoolctl-tests,
else ~/.cache/spoolctl-tests. Two pytest processes may race to build it: an
exclusive lock file serialises them, and the second finds the first's work. A
build that died half-way (no completion marker, or a marker whose interpreter
no longer runs the right version) is thrown away and built again.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

REFERENCE_VERSION = "0.4.11"
COMPLETE = ".spoolctl-tests-complete"


def cache_root() -> Path:
    explicit = os.environ.get("SPOOLCTL_COMPAT_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "spoolctl-tests"


def venv_dir(version: str = REFERENCE_VERSION) -> Path:
    tag = f"py{sys.version_info.major}.{sys.version_info.minor}"
    return cache_root() / f"spoolctl-{version}-{tag}"


def reference_python(version: str = REFERENCE_VERSION) -> Path:
    """The interpreter of a virtual environment holding spoolctl==version."""
    target = venv_dir(version)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        python = target / "bin" / "python"
        if not (target / COMPLETE).exists() or installed_version(python) != version:
            build(target, version)
        return python


def installed_version(python: Path) -> str | None:
    if not python.exists():
        return None
    probe = "import importlib.metadata as m; print(m.version('spoolctl'))"
    proc = subprocess.run(  # -I: not this checkout's spoolctl.egg-info in the working folder
        [str(python), "-I", "-c", probe],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
    )
    return proc.stdout.strip() if proc.returncode == 0 else None


def build(target: Path, version: str) -> None:
    shutil.rmtree(target, ignore_errors=True)
    base = getattr(sys, "_base_executable", sys.executable)
    run([base, "-m", "venv", str(target)])
    run(
        [
            str(target / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            f"spoolctl=={version}",
        ]
    )
    (target / COMPLETE).write_text(version + "\n")


def run(argv: list[str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, env=clean_env(), timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(
            f"building the reference spoolctl failed: {' '.join(argv)}\n"
            f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        )


def clean_env() -> dict[str, str]:
    """No PYTHONPATH (it would put this checkout's spoolctl first) and no knobs."""
    return {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV") and not k.startswith("SPOOLCTL_")
    }
