"""EXTRA_MISSING's hint names the command that works in the environment
spoolctl runs from: this checkout's own `.venv` (made by ./scripts/demo or
./scripts/setup, perhaps without pip) takes `scripts/setup --extra NAME`;
any other environment its own interpreter's pip, bootstrapped where it has
none. No install is run."""

from __future__ import annotations

import importlib.util
import shlex
import sys
from pathlib import Path

import pytest

import spoolctl
from spoolctl.errors import ExtraMissing, install_command

CHECKOUT = Path(spoolctl.__file__).resolve().parent.parent


def test_the_checkouts_own_venv_is_given_scripts_setup(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(sys, "prefix", str(CHECKOUT / ".venv"))
    monkeypatch.chdir(CHECKOUT)
    assert install_command("web") == "./scripts/setup --extra web"
    monkeypatch.chdir(tmp_path)
    setup = shlex.quote(str(CHECKOUT / "scripts" / "setup"))
    assert install_command("metrics") == f"{setup} --extra metrics"
    error = ExtraMissing("spoolctl web needs the web extra", extra="web")
    assert error.detail["install"] == f"{setup} --extra web"
    assert error.message.endswith(f": {setup} --extra web")


def test_another_environment_is_given_its_own_pip(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "elsewhere"))
    python = shlex.quote(sys.executable)
    assert install_command("web") == f"{python} -m pip install 'spoolctl[web]'"
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "pip" else real(name, *a)
    )
    assert install_command("web") == (
        f"{python} -m ensurepip --default-pip && {python} -m pip install 'spoolctl[web]'"
    )
