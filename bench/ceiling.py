"""The machine's own ceiling for draining `true` jobs, measured in the same run
as the drains and interleaved with them (bench/spawnloop.py does the loop):

- spawn: `true` spawned and waited for in a loop, nothing else;
- spawn + files: the same plus, per job, the files one attempt of ours
  creates, and the folders that hold them when they are missing (since 0.5.1
  two files, and a folder per thousand jobs; before, two new folders and two
  files per job), on the file system the drain ran on. With 2 loops in
  parallel for the 2-worker drains.

The per-attempt layout is read from ours (`attempt_layout`), so the ceiling
follows a later change of the layout.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fixtures import BENCH, OURS, BenchError, clean_env, fresh_dir

SPAWNLOOP = BENCH / "spawnloop.py"
START_DELAY_S = 0.5
"""Loops start this long after launch, together: their interpreters start up first."""
PROBE_JOB = 987654321

LAYOUT_PROBE = f"""
import json, pathlib
try:
    from spoolctl.layout import attempt_paths as output_paths
except ImportError:  # a build from before the layout of 0.5.1
    from spoolctl.services.claim import output_paths
root = pathlib.Path('/ROOT')
paths = output_paths(root, {PROBE_JOB}, 1)
print(json.dumps([str(pathlib.Path(p).relative_to(root)) for p in paths]))
"""


@dataclass(frozen=True)
class Layout:
    """What one attempt creates under the output root ("{job}" = job id): its
    files, and the folders holding them when those are missing."""

    dirs: tuple[str, ...]
    files: tuple[str, ...]
    source: str

    def as_json(self) -> str:
        return json.dumps({"dirs": list(self.dirs), "files": list(self.files)})

    def facts(self) -> dict[str, Any]:
        return {"dirs": list(self.dirs), "files": list(self.files), "source": self.source}


FALLBACK_LAYOUT = Layout(
    dirs=("{job}", "{job}/1"),
    files=("{job}/1/stdout", "{job}/1/stderr"),
    source="constant in bench/ceiling.py (ours' output_paths could not be read)",
)
"""Ours before 0.5.1: OUTPUT_ROOT/<job>/<attempt>/{stdout,stderr}, both folders new."""

NO_FILES = Layout(dirs=(), files=(), source="spawn alone")


def attempt_layout() -> Layout:
    """Ours' per-attempt output layout, from its own output_paths (run under
    ours' interpreter): the files of attempt 1 of a job, and every folder
    between the output root and them (each created per attempt if missing)."""
    proc = subprocess.run(
        [str(OURS.python), "-c", LAYOUT_PROBE],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
        check=False,
    )
    try:
        files = [f.replace(str(PROBE_JOB), "{job}") for f in json.loads(proc.stdout)]
    except ValueError:
        return FALLBACK_LAYOUT
    dirs: list[str] = []
    for f in files:
        for parent in reversed(Path(f).parents[:-1]):
            if str(parent) not in dirs:
                dirs.append(str(parent))
    return Layout(tuple(dirs), tuple(files), "the output paths of ours' claim (spoolctl.layout)")


def sample(root: Path, layout: Layout, spawns: int, loops: int) -> dict[str, Any]:
    """One ceiling measurement: `loops` parallel loops of spawns/loops jobs each
    in a fresh folder under root (left there: the caller removes root);
    value = jobs/s from the first loop's start to the last loop's end."""
    per_loop = spawns // loops
    d = fresh_dir("ceiling", root)
    start_at = time.time() + START_DELAY_S
    args = [str(per_loop), repr(start_at), layout.as_json()]
    procs = [
        subprocess.Popen(
            [sys.executable, str(SPAWNLOOP), str(d), str(1 + i * per_loop), *args],
            cwd=d,
            env=clean_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(loops)
    ]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    if any(p.returncode != 0 for p in procs):
        raise BenchError(f"spawnloop failed: {[p.returncode for p in procs]}")
    runs = [json.loads(o) for o in outs]
    wall = max(r["end"] for r in runs) - min(r["start"] for r in runs)
    total = per_loop * loops
    return {"value": total / wall, "wall_s": wall, "spawns": total, "loops": loops}
