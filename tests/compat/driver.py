"""Run a plan of spoolctl command lines under one implementation's interpreter.

Standard library only: it runs inside the reference's virtual environment as
well as ours. Every command line is a real process of its own: a child forked
from this one (which has already imported the heavy third-party modules, so
each command does not pay for them again) that sets its own working directory,
environment, argv and standard streams, then calls the console entry point
exactly as the installed `spoolctl` script would, and exits with its code.
Scenarios run one after another, their steps in order.

Usage: python driver.py PLAN.json RESULTS.json
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import shutil
import signal
import sqlite3
import sys
import tempfile
import time
import traceback
from typing import Any

STEP_TIMEOUT_S = 60.0
UNCAUGHT = 99  # a Python exception escaped the entry point (never expected)


def entry_point(spec: str) -> Any:
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


def child(spec: str, argv: list[str], env: dict[str, str], cwd: str, fds: tuple[int, ...]) -> None:
    """The forked process: become `spoolctl ARGV...` and never return."""
    code = UNCAUGHT
    try:
        os.setpgid(0, 0)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        sys.argv = ["spoolctl", *argv]
        try:
            returned = entry_point(spec)()
            code = returned if isinstance(returned, int) else 0
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
        code = UNCAUGHT
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                code = code or UNCAUGHT
        os._exit(code)


def start(spec: str, argv: list[str], cwd: str, env: dict[str, str]) -> int:
    """A command left running in the background (a worker); its output is dropped."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        null = os.open(os.devnull, os.O_RDWR)
        child(spec, argv, env, cwd, (null, null, null))
    return pid


def until(spec: str, step: dict[str, Any], cwd: str, env: dict[str, str]) -> dict[str, Any]:
    """Repeat a --json command until data at `path` equals `equals` (or time runs out)."""
    deadline = time.monotonic() + float(step.get("timeout", STEP_TIMEOUT_S))
    while time.monotonic() < deadline:
        result = run_step(spec, {"run": step["until"]}, cwd, env)
        try:
            value: Any = json.loads(result["stdout"])
            for key in step["path"].split("."):
                value = value[key]
        except (ValueError, KeyError, TypeError):
            value = None
        if value == step["equals"]:
            return {"reached": True}
        time.sleep(0.05)
    return {"reached": False}


def finish(pids: list[int]) -> None:
    """Background commands end on their own; any still running after a grace is killed."""
    for pid in pids:
        reap(pid, STEP_TIMEOUT_S)


def run_step(spec: str, step: dict[str, Any], cwd: str, env: dict[str, str]) -> dict[str, Any]:
    with (
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
        tempfile.TemporaryFile() as inp,
    ):
        inp.write(step.get("stdin", "").encode())
        inp.seek(0)
        sys.stdout.flush()
        sys.stderr.flush()
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:
            child(spec, step["run"], env, cwd, (inp.fileno(), out.fileno(), err.fileno()))
        status, timed_out = reap(pid, float(step.get("timeout", STEP_TIMEOUT_S)))
        elapsed = time.monotonic() - started
        out.seek(0)
        err.seek(0)
        return {
            "exit": os.waitstatus_to_exitcode(status),
            "timed_out": timed_out,
            "stdout": out.read().decode("utf-8", "replace"),
            "stderr": err.read().decode("utf-8", "replace"),
            "seconds": round(elapsed, 3),
        }


def reap(pid: int, timeout: float) -> tuple[int, bool]:
    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status, False
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            return os.waitpid(pid, 0)[1], True
        time.sleep(delay)
        delay = min(delay * 2, 0.02)


def prepare(step: dict[str, Any], cwd: str) -> dict[str, Any]:
    """File set-up steps: remove, write a file (text or hex bytes, or an SQLite
    database made by statements), make a folder, chmod, or report a path's
    permission bits."""
    path = os.path.join(cwd, step["path"])
    if "remove" in step and os.path.lexists(path):
        shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    if "mkdir" in step:
        os.makedirs(path, exist_ok=True)
    if "sqlite" in step:  # an SQLite database of another program (statements run on a new file)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        conn = sqlite3.connect(path)
        try:
            conn.executescript(step["sqlite"])
        finally:
            conn.close()
    if "text" in step or "hex" in step:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        data = bytes.fromhex(step["hex"]) if "hex" in step else step["text"].encode()
        with open(path, "wb") as f:
            f.write(data)
    if "chmod" in step:
        os.chmod(path, int(step["chmod"]))
    if "stat" in step:
        return {"mode": os.stat(path).st_mode & 0o777 if os.path.exists(path) else None}
    return {}


def substitute(value: Any, cwd: str) -> Any:
    if isinstance(value, str):
        return value.replace("{dir}", cwd)
    if isinstance(value, list):
        return [substitute(v, cwd) for v in value]
    if isinstance(value, dict):
        return {k: substitute(v, cwd) for k, v in value.items()}
    return value


def run_scenario(plan: dict[str, Any], scenario: dict[str, Any]) -> list[dict[str, Any]]:
    cwd = os.path.join(plan["root"], scenario["name"])
    os.makedirs(cwd)
    results: list[dict[str, Any]] = []
    background: list[int] = []
    for raw in scenario["steps"]:
        step = substitute(raw, cwd)
        env = {**plan["env"], **step.get("env", {})}
        if "run" in step:
            results.append(run_step(plan["entry"], step, cwd, env))
        elif "background" in step:
            background.append(start(plan["entry"], step["background"], cwd, env))
            results.append({"started": True})
        elif "until" in step:
            results.append(until(plan["entry"], step, cwd, env))
        else:
            results.append(prepare(step, cwd))
    finish(background)
    return results


def main() -> None:
    plan_path, results_path = sys.argv[1], sys.argv[2]
    with open(plan_path, encoding="utf-8") as f:
        plan = json.load(f)
    for module in plan.get("preload", []):
        importlib.import_module(module)
    results = {s["name"]: run_scenario(plan, s) for s in plan["scenarios"]}
    with open(results_path, "w", encoding="utf-8") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
