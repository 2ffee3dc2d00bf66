"""Where an attempt's output files live inside the spool's `output/` folder.

Attempts claimed from 0.5.1 on write `output/<F>xxx/<job>.<n>.stdout` and
`.stderr`, where F is the job id divided by 1,000 (`output/123xxx/` holds jobs
123000 to 123999): an attempt creates its two files and, but for the first
of each thousand jobs, no folder. Creating two folders per attempt took
about a fifth of each job's spawn time on this project's ext4 disk.

Attempts claimed before, and legacy output adopted by `migrate`, keep the
folder layout `output/<job>/<n>/stdout|stderr`. Nothing moves: the paths are
stored on the attempt rows, and every reader goes by the row. Only `prune`
derives paths, and it knows both shapes (`owned_files`).

A folder name of the new shape ends in `xxx`, so it never collides with a job
folder of the old one (a job id is all digits).
"""

from __future__ import annotations

import re
from pathlib import Path

STREAMS = ("stdout", "stderr")
JOBS_PER_FOLDER = 1000
_NAME = re.compile(r"([0-9]+)\.([0-9]+)\.(stdout|stderr)")  # \d takes any script's digits


def folder_name(job_id: int) -> str:
    """The shared folder of a job's attempts (new layout)."""
    return f"{job_id // JOBS_PER_FOLDER}xxx"


def attempt_paths(output_root: Path | str, job_id: int, attempt_no: int) -> tuple[str, str]:
    """stdout and stderr of one attempt claimed now (plain string work: this
    runs once per job on the worker's hot path)."""
    base = f"{output_root}/{job_id // JOBS_PER_FOLDER}xxx/{job_id}.{attempt_no}."
    return base + "stdout", base + "stderr"


def job_of(name: str) -> int | None:
    """The job a file name of the new layout belongs to; None for any other name."""
    found = _NAME.fullmatch(name)
    return None if found is None else int(found.group(1))


def folder_layout_tail(job_id: int, attempt_no: int, stream: str) -> str:
    """The old layout, relative to the spool: where adoption relocates legacy output."""
    return f"output/{job_id}/{attempt_no}/{stream}"
