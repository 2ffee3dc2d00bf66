"""The machine's ceiling for one-process-per-job: spawn `true` in a loop.

Run as its own process (stdlib only, nothing of spoolctl imported):

    python bench/spawnloop.py ROOT FIRST_JOB COUNT START_AT LAYOUT_JSON

LAYOUT_JSON is {"dirs": [...], "files": [...]}: paths relative to ROOT with
"{job}" for the job id (see ceiling.attempt_layout). Per job it opens the
files for append (making the directories, mode 0700, only when an open finds
one missing, as our worker does), spawns `true` as a new session's leader
with stdout and stderr on the first
two files (or /dev/null), closes the files and waits, as our worker does.
An empty layout measures the spawn alone. Waits until the wall clock reaches
START_AT (so that parallel loops start together), then prints JSON
{"start": t0, "end": t1, "count": n}.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

DIR_MODE = 0o700


def one_job(root: Path, job: int, dirs: list[str], files: list[str]) -> None:
    try:
        handles = open_all(root, job, files)
    except FileNotFoundError:  # as ours: the folders are made only when missing
        for d in dirs:
            try:
                os.mkdir(root / d.format(job=job), DIR_MODE)
            except FileExistsError:
                continue
        handles = open_all(root, job, files)
    try:
        out: Any = handles[0] if handles else subprocess.DEVNULL
        err: Any = handles[1] if len(handles) > 1 else subprocess.DEVNULL
        proc = subprocess.Popen(
            ["true"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
            close_fds=True,
        )
    finally:
        for h in handles:
            h.close()
    proc.wait()


def open_all(root: Path, job: int, files: list[str]) -> list[IO[bytes]]:
    handles: list[IO[bytes]] = []
    try:
        for f in files:
            handles.append(open(root / f.format(job=job), "ab"))  # noqa: SIM115
    except OSError:
        for h in handles:
            h.close()
        raise
    return handles


def main() -> None:
    root, first, count = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    start_at, layout = float(sys.argv[4]), json.loads(sys.argv[5])
    time.sleep(max(0.0, start_at - time.time()))
    t0 = time.time()
    for job in range(first, first + count):
        one_job(root, job, layout["dirs"], layout["files"])
    t1 = time.time()
    print(json.dumps({"start": t0, "end": t1, "count": count}))


if __name__ == "__main__":
    main()
