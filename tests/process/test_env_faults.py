"""Environment faults: a read-only disk, an unwritable spool folder, a full
disk (under the output only, and under the whole spool), a damaged or foreign
file at the database path. Each gives a clear error, loses no job, and is
named by `doctor`.

Read-only and full disks are real: a small tmpfs mounted (and remounted
read-only) by the test, because as root neither chmod nor file modes stop a
write. Those tests are skipped only where mounting is impossible (not root,
or no permission to mount).
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from spoolctl.cli.database import open_write
from spoolctl.services.job_spec import JobSpec
from spoolctl.services.submit import submit
from tests.helpers import Result, add, attempts_of, cli_json, job, rows, start_worker, wait_for

pytestmark = [pytest.mark.timeout(60), pytest.mark.subprocess]


def _mount(*args: str) -> bool:
    found = subprocess.run(["mount", *args], capture_output=True, timeout=20)
    return found.returncode == 0


def _mount_or_fail(*args: str) -> None:
    found = subprocess.run(["mount", *args], capture_output=True, text=True, timeout=20)
    assert found.returncode == 0, (
        "these tests need a real tmpfs (CI runs as root and can mount one): "
        f"mount {' '.join(args)} failed: {found.stderr.strip()}"
    )


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[[Path, str], None]]:
    """mount(path, size): a fresh tmpfs of that size at path, unmounted after."""
    mounted: list[Path] = []

    def mount(path: Path, size: str) -> None:
        path.mkdir(parents=True, exist_ok=True)
        _mount_or_fail("-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path))
        mounted.append(path)

    yield mount
    for path in reversed(mounted):
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=20)


def add_jobs(db: Path, *argvs: list[str], max_retries: int = 0) -> list[int]:
    queue = open_write(str(db))
    try:
        specs = [JobSpec(argv=argv, max_retries=max_retries) for argv in argvs]
        return queue.write(lambda conn: [submit(conn, s, time.time()).job_id for s in specs])
    finally:
        queue.engine.dispose()


def doctor(db: Path) -> dict[str, dict[str, str]]:
    result = cli_json("doctor", db=db)
    assert result.exit_code == 3 and result.data["ready"] is False, result.stdout
    return {c["id"]: c for c in result.data["checks"]}


def failed_with(result: Result, reason: str, fragment: str) -> None:
    """A DB_UNUSABLE refusal (exit 3) with this reason and words."""
    assert result.exit_code == 3, result.stdout + result.stderr
    (error,) = result.envelope["errors"]
    assert (error["code"], error["detail"]["reason"]) == ("DB_UNUSABLE", reason), error
    assert fragment in error["message"]
    assert "Traceback" not in result.stdout + result.stderr


def job_count(db: Path) -> int:
    return int(rows(db, "SELECT count(*) AS n FROM jobs")[0]["n"])


@pytest.mark.slow
def test_a_read_only_disk_refuses_every_write_clearly_and_keeps_every_job(
    tmp_path: Path, tmpfs: Callable[[Path, str], None]
) -> None:
    spool = tmp_path / "spool"
    tmpfs(spool, "8m")
    db = spool / "queue.db"
    add(db, "true"), add(db, "true")
    # as a queue in use leaves it (the last connection to close folds the log
    # into the file and removes the -wal and -shm): a reader killed open
    killed_open = (
        "import os, signal, sqlite3, sys; "
        "sqlite3.connect(sys.argv[1]).execute('SELECT count(*) FROM jobs').fetchone(); "
        "os.kill(os.getpid(), signal.SIGKILL)"
    )
    subprocess.run([sys.executable, "-c", killed_open, str(db)], check=False, timeout=60)
    assert db.with_name("queue.db-wal").exists() and db.with_name("queue.db-shm").exists()
    assert _mount("-o", "remount,ro", str(spool))

    failed_with(cli_json("add", "--", "true", db=db), "read_only", "read-only")
    failed_with(cli_json("work", "--once", db=db), "read_only", "read-only")
    failed_with(cli_json("cancel", "1", db=db), "read_only", "read-only")
    listed = cli_json("list", db=db)
    assert listed.exit_code == 0 and listed.data["count"] == 2, "reads still work"
    checks = doctor(db)
    assert checks["spool_directory_writable"]["status"] == "fail"
    assert checks["sqlite_open_readwrite"]["status"] == "fail"
    assert "read-only" in checks["sqlite_open_readwrite"]["message"]

    assert _mount("-o", "remount,rw", str(spool))
    assert [r["state"] for r in rows(db, "SELECT state FROM jobs")] == ["queued", "queued"]
    assert cli_json("work", "--drain", db=db).data["executed"] == 2


def test_a_spool_folder_that_cannot_be_written_creates_nothing(
    tmp_path: Path, tmpfs: Callable[[Path, str], None]
) -> None:
    disk = tmp_path / "disk"
    tmpfs(disk, "1m")
    assert _mount("-o", "remount,ro", str(disk))
    db = disk / "spool" / "queue.db"

    failed_with(cli_json("add", "--", "true", db=db), "read_only", "cannot create the queue")
    failed_with(cli_json("work", "--once", db=db), "read_only", "Read-only file system")
    assert not (disk / "spool").exists()
    assert doctor(db)["spool_directory_writable"]["status"] == "fail"


FILL = ["head", "-c", "3000000", "/dev/zero"]  # fails (exit 1) when the disk is full


def test_a_full_output_disk_truncates_output_but_every_attempt_is_recorded(
    db: Path, tmpfs: Callable[[Path, str], None]
) -> None:
    filler, after = add_jobs(db, FILL, ["echo", "after"])
    tmpfs(db.parent / "output", "1m")

    result = cli_json("work", "--drain", db=db)

    assert result.exit_code == 0 and result.data["executed"] == 2, "the worker survived"
    (attempt,) = attempts_of(db, filler)
    assert attempt["state"] == "failed" and attempt["exit_code"] == 1
    shown = cli_json("output", str(filler), "--stream", "stdout", db=db).data
    size = shown["streams"]["stdout"]["size_bytes"]
    assert 0 < size <= 1_048_576 and shown["streams"]["stdout"]["preview_truncated"]
    (second,) = attempts_of(db, after)
    assert second["state"] in ("succeeded", "failed"), "recorded whatever the disk allowed"
    assert doctor(db)["disk_space"]["status"] == "fail"


@pytest.mark.slow
def test_a_full_database_disk_makes_the_worker_wait_and_loses_no_job(
    tmp_path: Path, tmpfs: Callable[[Path, str], None]
) -> None:
    """A worker that cannot write its queue (the disk is full) keeps running:
    it still enforces the timeout of its other job, retries with backoff, and
    records every outcome once the operator makes room, so nothing is rerun."""
    spool = tmp_path / "spool"
    tmpfs(spool, "1m")
    db = spool / "queue.db"
    pidfile = tmp_path / "sleeper.pid"
    once_fill = ["sh", "-c", 'if [ "$SPOOLCTL_ATTEMPT" = 1 ]; then exec "$@"; fi', "sh", *FILL]
    sleeper = ["sh", "-c", f"echo $$ > {pidfile}; exec sleep 60"]
    queue = open_write(str(db))
    specs = [
        JobSpec(argv=once_fill, max_retries=1),
        JobSpec(argv=sleeper, timeout_seconds=2, max_retries=0),
    ]
    filler, slow = queue.write(lambda conn: [submit(conn, s, time.time()).job_id for s in specs])
    queue.engine.dispose()
    (other,) = add_jobs(db, ["true"])

    worker = start_worker(db, "--drain", "--concurrency", "2", "--poll-interval", "0.1")
    wait_for(pidfile.exists, what="the sleeper to start")
    sleeper_pid = int(pidfile.read_text())
    wait_for(lambda: doctor(db)["disk_space"]["status"] == "fail", what="the disk to fill")
    wait_for(lambda: not _alive(sleeper_pid), timeout=10, what="the timeout kill")
    assert worker.poll() is None, "the worker stopped instead of waiting for room"
    assert job(db, slow)["state"] == "running", "recorded although the disk is full?"

    assert _mount("-o", "remount,size=16m", str(spool))  # the operator makes room
    out, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, out + err
    assert [job(db, j)["state"] for j in (filler, slow, other)] == ["done", "dead", "done"]
    first, second = attempts_of(db, filler)
    assert (first["state"], first["exit_code"]) == ("failed", 1), "its outcome was kept"
    assert second["state"] == "succeeded"
    (timed_out,) = attempts_of(db, slow)
    assert timed_out["state"] == "timed_out"
    assert "abandoned" not in {a["state"] for j in (filler, slow) for a in attempts_of(db, j)}


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_foreign_file_at_the_database_path_stops_a_worker_and_doctor_names_it(
    tmp_path: Path,
) -> None:
    db = tmp_path / "queue.db"
    db.write_text("not a database\n" * 100)
    before = db.read_bytes()

    failed_with(cli_json("work", "--once", db=db), "damaged", "not an SQLite database")
    opened = doctor(db)["sqlite_open_readwrite"]
    assert opened["status"] == "fail" and "not a database" in opened["message"]
    assert db.read_bytes() == before


def test_a_damaged_queue_is_found_by_doctor_and_refused_by_verbs(db: Path) -> None:
    add_jobs(db, *[["echo", "x" * 2000] for _ in range(50)])
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); "
            "c.execute('PRAGMA wal_checkpoint(TRUNCATE)'); c.close()",
            str(db),
        ],
        check=True,
        timeout=20,
    )
    half = db.stat().st_size // 2 // 4096 * 4096
    with open(db, "r+b") as handle:  # scribble over the later pages: the table's rows
        handle.seek(half)
        handle.write(b"\xa5" * half)

    integrity = doctor(db)["integrity"]
    assert integrity["status"] == "fail" and "damaged" in integrity["message"]
    result = cli_json("list", db=db)
    assert result.exit_code == 3 and "Traceback" not in result.stdout + result.stderr
    error = result.envelope["errors"][0]
    assert (error["code"], error["detail"]["reason"]) == ("DB_UNUSABLE", "damaged")
    assert "malformed" in error["message"]


def test_doctor_names_a_database_deleted_underneath(db: Path) -> None:
    add_jobs(db, ["true"])
    holder = sqlite3.connect(db)  # like a running worker: its -wal stays open
    try:
        holder.execute("SELECT count(*) FROM jobs").fetchone()
        db.unlink()
        missing = doctor(db)["database_exists"]
    finally:
        holder.close()
    assert missing["status"] == "fail" and "deleted" in missing["message"]


@pytest.mark.slow
def test_a_worker_whose_database_is_deleted_stops_and_recreates_nothing(
    db: Path, tmp_path: Path
) -> None:
    """SQLite would go on writing to the unlinked file, and a new connection
    used to create an empty file at the path and pair it with the old -wal."""
    add(db, "true")
    log = tmp_path / "worker.log"
    worker = start_worker(db, "--poll-interval", "0.1", log=log)
    try:
        wait_for(lambda: job(db, 1)["state"] == "done", what="the first job")
        db.unlink()
        code = worker.wait(timeout=10)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    envelope = json.loads(log.read_text().splitlines()[-1])
    error = envelope["errors"][0]
    assert code == 3 and (error["code"], error["detail"]["reason"]) == ("DB_UNUSABLE", "replaced")
    assert "deleted or replaced" in error["message"]
    assert not db.exists(), "the worker recreated the queue file"
