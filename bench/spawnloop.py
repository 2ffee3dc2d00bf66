"""The machine's ceiling for one-process-per-job: spawn `true` in a loop.

Run as its own process (stdlib only, nothing of spoolctl imported):

    python bench/spawnloop.py ROOT FIRST_JOB COUNT START_AT LAYOUT_JSON

LAYOUT_JSON is {"dirs": [...], "files": [...]}: paths relative to ROOT with
"{job}" for the job id (see ceiling.attempt_layout). Per job it opens the
files for append (making the directories, mode 0700, only when an open finds
one missing, as our worker does), spawns `true` as a new session's leader
with stdout and stderr on the first
two files (or /dev/null), closes the files and waits, as our worker does.
The spawn is the cheapest Python has: os.posix_spawn of `true`'s path, found
once, with setsid and file actions (the way our worker spawns since 0.5.1;
0.4.11 and our earlier worker used subprocess.Popen, which costs about
0.1 ms more per job), so no drain can pass the ceiling by spawning better.
An empty layout measures the spawn alone. Waits until the wall clock reaches
START_AT (so that parallel loops start together), then prints JSON
{"start": t0, "end": t1, "count": n}.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import IO, Any

DIR_MODE = 0o700
TRUE = shutil.which("true") or "/bin/true"
ENV = dict(os.environ)


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
        actions: list[tuple[Any, ...]] = [(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDWR, 0)]
        for fd, handle in zip((1, 2), handles, strict=False):
            actions.append((os.POSIX_SPAWN_DUP2, handle.fileno(), fd))
        for fd in range(len(handles) + 1, 3):
            actions.append((os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_RDWR, 0))
        pid = os.posix_spawn(TRUE, [TRUE], ENV, file_actions=actions, setsid=True)
    finally:
        for h in handles:
            h.close()
    os.waitpid(pid, 0)


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
