"""Run every scenario under both implementations, side by side.

The reference and ours each get one driver process (see driver.py) with its
own scratch root; the two run at the same time, one per core. Their answers
are paired step by step for the tests to compare.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.compat.reference import clean_env
from tests.compat.scenarios import SCENARIOS, Scenario, Step
from tests.compat.shapes import Answer

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DRIVER = HERE / "driver.py"
# Imported once by each driver before it forks its commands: the console entry
# and every verb module (nothing in either reads the environment at import).
REFERENCE_PRELOAD = ("spoolctl.cli",)
OURS_PRELOAD = (
    "spoolctl.cli",
    "spoolctl.cli.jobs",
    "spoolctl.cli.batch",
    "spoolctl.cli.work",
    "spoolctl.cli.status",
    "spoolctl.cli.inspect",
    "spoolctl.cli.wait",
    "spoolctl.cli.output",
    "spoolctl.cli.feedback",
    "spoolctl.cli.events",
    "spoolctl.cli.steer",
    "spoolctl.cli.migrate",
    "spoolctl.cli.admin",
    "spoolctl.cli.contract",
    "spoolctl.cli.capabilities",
    "spoolctl.cli.brief",
    "spoolctl.db.revision",
    "spoolctl.worker",
)
DRIVER_TIMEOUT_S = 600


@dataclass(frozen=True)
class Implementation:
    name: str
    python: Path
    env: dict[str, str]
    preload: tuple[str, ...] = ()


def reference(python: Path) -> Implementation:
    return Implementation("0.4.11", python, base_env(), REFERENCE_PRELOAD)


def ours() -> Implementation:
    return Implementation(
        "ours", Path(sys.executable), {**base_env(), "PYTHONPATH": str(REPO)}, OURS_PRELOAD
    )


def base_env() -> dict[str, str]:
    """What every command line runs with: no knobs, a stable locale, no colour."""
    env = {k: v for k, v in clean_env().items() if not k.startswith("PYTEST")}
    env.update({"LC_ALL": "C.UTF-8", "NO_COLOR": "1", "PYTHONIOENCODING": "utf-8"})
    return env


def plan(impl: Implementation, root: Path, scenarios: tuple[Scenario, ...]) -> dict[str, Any]:
    return {
        "entry": "spoolctl.cli:main",
        "preload": list(impl.preload),
        "root": str(root),
        "env": impl.env,
        "scenarios": [
            {"name": s.name, "steps": [step.plan() for step in s.steps]} for s in scenarios
        ],
    }


def run_both(
    implementations: tuple[Implementation, Implementation],
    scenarios: tuple[Scenario, ...] = SCENARIOS,
) -> dict[str, list[list[dict[str, Any]]]]:
    """{scenario name: [[original's result, ours] per step]}."""
    with tempfile.TemporaryDirectory(prefix="spoolctl-compat-") as tmp:
        procs = []
        for impl in implementations:
            root = Path(tmp) / impl.name
            root.mkdir()
            plan_file = Path(tmp) / f"{impl.name}.plan.json"
            plan_file.write_text(json.dumps(plan(impl, root, scenarios)))
            out = Path(tmp) / f"{impl.name}.results.json"
            proc = subprocess.Popen(
                [str(impl.python), str(DRIVER), str(plan_file), str(out)],
                env=impl.env,
                cwd=tmp,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            procs.append((impl, proc, out))
        results = []
        for impl, proc, out in procs:
            log, _ = proc.communicate(timeout=DRIVER_TIMEOUT_S)
            if proc.returncode != 0 or not out.exists():
                raise RuntimeError(f"the {impl.name} driver failed ({proc.returncode}):\n{log}")
            results.append(json.loads(out.read_text()))
    original, mine = results
    return {
        s.name: [[a, b] for a, b in zip(original[s.name], mine[s.name], strict=True)]
        for s in scenarios
    }


def answer(result: dict[str, Any]) -> Answer:
    return Answer(result["exit"], result["stdout"], result["stderr"], result["timed_out"])


def command_label(step: Step) -> str:
    """The step as a person would type it, without the scratch queue's path."""
    return step.label.replace(" --db {dir}/spool/queue.db", "").replace("{dir}/", "")


def run_steps() -> list[tuple[Scenario, int, Step]]:
    return [(s, i, step) for s in SCENARIOS for i, step in enumerate(s.steps)]
