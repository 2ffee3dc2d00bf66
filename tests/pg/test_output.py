"""Output from anywhere: on a PostgreSQL queue each attempt's output is stored
in the database as it is produced (`spoolctl/db/backends/postgresql/output.py`), so
`output`, `output --follow` and `feedback` read it on a machine that never saw
the worker's files; the per-stream cap truncates and flags it; prune deletes it.

"Another machine" is a reader whose SPOOLCTL_SPOOL_DIR differs from the
worker's, after the worker's spool folder was deleted."""

from __future__ import annotations

import json
import queue
import shutil
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest

from spoolctl.db.backends.postgresql import output as output_store
from spoolctl.db.backends.postgresql.output import CHUNK_BYTES, OutputCopier
from spoolctl.db.queue import open_for_write
from spoolctl.db.revision import DELETE_STORED_OUTPUT_FLAG, KNOWN_REVISIONS
from spoolctl.layout import attempt_paths
from tests.helpers import REPO, STARTED_WORKERS, child_env, driver_of, wait_for
from tests.pg_server import libpq_url

pytestmark = pytest.mark.subprocess

BINARY = bytes(range(256)) * 600
"""153,600 bytes, every byte value (not UTF-8): three chunks."""


def stdout_of(spool: Path, job: int) -> str:
    """Where attempt 1 of the job writes its stdout in that spool folder."""
    return attempt_paths(spool / "output", job, 1)[0]


def spoolctl(
    *args: str, spool: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    """A real `spoolctl` process with its own spool folder; bytes captured as they are."""
    return subprocess.run(
        [sys.executable, "-m", "spoolctl", *args],
        capture_output=True,
        env=child_env({"SPOOLCTL_SPOOL_DIR": str(spool), **(env or {})}),
        timeout=120,
        stdin=subprocess.DEVNULL,
        cwd=REPO,
    )


def data_of(result: subprocess.CompletedProcess[bytes]) -> Any:
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)["data"]


def sql(url: str, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(libpq_url(url)) as conn:
        return conn.execute(statement, params).fetchall()


def chunks(url: str, job_id: int, stream: str) -> list[tuple[int, bytes, int]]:
    """(offset, data, truncated) of one stream of the job's latest attempt, in order."""
    found = sql(
        url,
        'SELECT c."offset", c.data, c.truncated FROM output_chunks c'
        " JOIN attempts a ON a.id = c.attempt_id WHERE a.job_id = %s AND c.stream = %s"
        ' ORDER BY c."offset"',
        (job_id, stream),
    )
    return [(int(o), bytes(d), int(t)) for o, d, t in found]


def stored_bytes(stored: list[tuple[int, bytes, int]]) -> bytes:
    """The chunks' bytes, after checking they are contiguous from 0, none
    longer than CHUNK_BYTES, and only the last one flagged (if any)."""
    offset = 0
    for position, data, _ in stored:
        assert position == offset and len(data) <= CHUNK_BYTES
        offset += len(data)
    assert all(flag == 0 for _, _, flag in stored[:-1])
    return b"".join(data for _, data, _ in stored)


def add(url: str, spool: Path, *argv: str) -> int:
    return int(data_of(spoolctl("add", "--db", url, "--json", "--", *argv, spool=spool))["job_id"])


def python_job(code: str) -> tuple[str, ...]:
    return (sys.executable, "-c", code)


@pytest.fixture
def pg_queue(pg_url: str, tmp_path: Path) -> str:
    """A migrated PostgreSQL queue."""
    data_of(spoolctl("migrate", "--db", pg_url, "--json", spool=tmp_path / "migrate"))
    return pg_url


def test_output_of_a_finished_job_is_read_from_the_database_elsewhere(
    pg_queue: str, tmp_path: Path
) -> None:
    worker_spool, reader_spool = tmp_path / "worker-host", tmp_path / "reader-host"
    code = (
        "import sys; sys.stdout.buffer.write(bytes(range(256)) * 600);"
        " sys.stderr.buffer.write(b'caf\\xe9 oops\\n')"
    )
    job = add(pg_queue, worker_spool, *python_job(code))
    data_of(spoolctl("work", "--db", pg_queue, "--once", "--json", spool=worker_spool))
    assert Path(stdout_of(worker_spool, job)).read_bytes() == BINARY
    shutil.rmtree(worker_spool)

    stored = chunks(pg_queue, job, "stdout")
    assert stored_bytes(stored) == BINARY and stored[-1][2] == 0 and len(stored) >= 3
    for name, expected in (("stdout", BINARY), ("stderr", b"caf\xe9 oops\n")):
        raw = spoolctl(
            "output", str(job), "--db", pg_queue, "--raw", "--stream", name, spool=reader_spool
        )
        assert (raw.returncode, raw.stdout, raw.stderr) == (0, expected, b"")

    shown = data_of(spoolctl("output", str(job), "--db", pg_queue, "--json", spool=reader_spool))
    out, err = shown["streams"]["stdout"], shown["streams"]["stderr"]
    assert (out["size_bytes"], out["preview_truncated"], out["missing"]) == (
        len(BINARY),
        True,
        False,
    )
    assert (out["source"], out["stored_bytes"], out["stored_truncated"]) == (
        "database",
        len(BINARY),
        False,
    )
    assert out["path"].startswith(str(worker_spool))  # where the worker wrote it
    assert err["preview"] == "caf\ufffd oops\n"
    verdict = data_of(
        spoolctl("feedback", str(job), "--db", pg_queue, "--json", spool=reader_spool)
    )
    assert verdict["succeeded"] is True
    assert verdict["streams"]["stderr"]["tail"] == "caf\ufffd oops\n"
    tail = verdict["streams"]["stdout"]
    assert (tail["size_bytes"], tail["truncated"], tail["source"]) == (
        len(BINARY),
        True,
        "database",
    )
    text = spoolctl("output", str(job), "--db", pg_queue, "--stream", "stderr", spool=reader_spool)
    assert text.returncode == 0 and b"caf\xef\xbf\xbd oops" in text.stdout
    assert b"OUTPUT_PATH_REFUSED" not in text.stdout + text.stderr


class LineReader:
    """Lines of a process's stdout, read by a thread, with a deadline per line."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.lines: queue.Queue[bytes] = queue.Queue()
        assert proc.stdout is not None
        stdout = proc.stdout
        threading.Thread(target=lambda: [self.lines.put(x) for x in stdout], daemon=True).start()

    def next(self, timeout: float = 30.0) -> dict[str, Any]:
        return dict(json.loads(self.lines.get(timeout=timeout)))


def test_output_follow_shows_a_running_job_live_from_the_database(
    pg_queue: str, tmp_path: Path
) -> None:
    worker_spool, reader_spool = tmp_path / "worker-host", tmp_path / "reader-host"
    gate = tmp_path / "gate"
    code = (
        "import os, sys, time; print('first', flush=True)\n"
        f"while not os.path.exists({str(gate)!r}): time.sleep(0.02)\n"
        "print('second', flush=True)"
    )
    job = add(pg_queue, worker_spool, *python_job(code))
    worker = subprocess.Popen(
        [sys.executable, "-m", "spoolctl", "work", "--db", pg_queue, "--once", "--json"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=child_env({"SPOOLCTL_SPOOL_DIR": str(worker_spool)}),
        cwd=REPO,
    )
    STARTED_WORKERS.append(worker)
    wait_for(lambda: chunks(pg_queue, job, "stdout"), what="the first line stored")
    follow = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "spoolctl",
            "output",
            str(job),
            "--db",
            pg_queue,
            "--follow",
            "--json",
            "--stream",
            "stdout",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=child_env({"SPOOLCTL_SPOOL_DIR": str(reader_spool)}),
        cwd=REPO,
    )
    STARTED_WORKERS.append(follow)
    frames = LineReader(follow)
    assert frames.next() == {"stream": "stdout", "offset": 0, "text": "first\n"}
    assert sql(pg_queue, "SELECT state FROM jobs WHERE id = %s", (job,)) == [("running",)]
    assert follow.poll() is None  # still following while the job runs
    gate.touch()
    assert frames.next() == {"stream": "stdout", "offset": 6, "text": "second\n"}
    assert frames.next() == {
        "control": {"type": "end", "reason": "attempt_ended", "attempt_state": "succeeded"}
    }
    assert follow.wait(timeout=30) == 0 and worker.wait(timeout=30) == 0


def test_the_cap_truncates_the_stored_copy_and_flags_it(pg_queue: str, tmp_path: Path) -> None:
    worker_spool, reader_spool = tmp_path / "worker-host", tmp_path / "reader-host"
    gate = tmp_path / "gate"
    big = add(pg_queue, worker_spool, *python_job("import sys; sys.stdout.write('x' * 300000)"))
    # the cap is reached exactly while the job runs; more bytes come after that is stored
    late = add(
        pg_queue,
        worker_spool,
        *python_job(
            "import os, sys, time; sys.stdout.write('y' * 100000); sys.stdout.flush()\n"
            f"while not os.path.exists({str(gate)!r}): time.sleep(0.02)\n"
            "sys.stdout.write('z' * 10)"
        ),
    )
    worker = subprocess.Popen(
        [sys.executable, "-m", "spoolctl", "work", "--db", pg_queue, "--drain", "--json"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=child_env(
            {"SPOOLCTL_SPOOL_DIR": str(worker_spool), "SPOOLCTL_PG_OUTPUT_CAP": "100000"}
        ),
        cwd=REPO,
    )
    STARTED_WORKERS.append(worker)
    wait_for(
        lambda: len(stored_bytes(chunks(pg_queue, late, "stdout"))) == 100000,
        what="the second job's first 100000 bytes stored",
    )
    gate.touch()
    assert worker.wait(timeout=60) == 0

    stored = chunks(pg_queue, big, "stdout")
    assert stored_bytes(stored) == b"x" * 100000 and stored[-1][2] == 1
    stored = chunks(pg_queue, late, "stdout")
    assert stored_bytes(stored) == b"y" * 100000 and stored[-1] == (100000, b"", 1)

    elsewhere = data_of(
        spoolctl("output", str(big), "--db", pg_queue, "--json", spool=reader_spool)
    )
    out = elsewhere["streams"]["stdout"]
    assert (out["source"], out["size_bytes"], out["stored_bytes"], out["stored_truncated"]) == (
        "database",
        100000,
        100000,
        True,
    )
    raw = spoolctl(
        "output", str(big), "--db", pg_queue, "--raw", "--stream", "stdout", spool=reader_spool
    )
    assert raw.stdout == b"x" * 100000 and b"SPOOLCTL_PG_OUTPUT_CAP" in raw.stderr
    text = spoolctl("output", str(big), "--db", pg_queue, spool=reader_spool)
    assert b"cut at 100000 bytes in the database" in text.stdout

    # on the worker's machine its own (longer, matching) file is read instead
    here = data_of(spoolctl("output", str(big), "--db", pg_queue, "--json", spool=worker_spool))
    assert (here["streams"]["stdout"]["source"], here["streams"]["stdout"]["size_bytes"]) == (
        "file",
        300000,
    )
    full = spoolctl(
        "output", str(big), "--db", pg_queue, "--raw", "--stream", "stdout", spool=worker_spool
    )
    assert (full.stdout, full.stderr) == (b"x" * 300000, b"")
    tail = data_of(
        spoolctl(
            "feedback",
            str(late),
            "--db",
            pg_queue,
            "--json",
            "--tail-bytes",
            "4",
            spool=reader_spool,
        )
    )
    assert (tail["streams"]["stdout"]["tail"], tail["streams"]["stdout"]["stored_truncated"]) == (
        "yyyy",
        True,
    )


def test_a_bad_cap_is_refused(pg_queue: str, tmp_path: Path) -> None:
    for bad in ("0", str(output_store.MAX_CAP_BYTES + 1)):
        result = spoolctl(
            "work",
            "--db",
            pg_queue,
            "--once",
            "--json",
            spool=tmp_path,
            env={"SPOOLCTL_PG_OUTPUT_CAP": bad},
        )
        assert result.returncode == 1, bad
        assert json.loads(result.stdout)["errors"][0]["code"] == "INVALID_INPUT"


def test_prune_deletes_the_stored_output(pg_queue: str, tmp_path: Path) -> None:
    spool = tmp_path / "worker-host"
    job = add(pg_queue, spool, *python_job("import sys; sys.stdout.write('p' * 70000)"))
    data_of(spoolctl("work", "--db", pg_queue, "--once", "--json", spool=spool))
    assert chunks(pg_queue, job, "stderr") == [(0, b"", 0)], "an empty stream: one empty chunk"

    def stored() -> int:
        return len(chunks(pg_queue, job, "stdout") + chunks(pg_queue, job, "stderr"))

    count = stored()
    assert count >= 3
    prune = ("prune", "--db", pg_queue, "--older-than", "0", "--json")
    dry = data_of(spoolctl(*prune, "--dry-run", spool=spool))
    assert (dry["deleted_output_chunks"], dry["deleted_output_bytes"]) == (count, 70000)
    assert stored() == count
    done = data_of(spoolctl(*prune, "--yes", spool=spool))
    assert (done["deleted_jobs"], done["deleted_output_chunks"], done["freed_bytes"]) == (
        1,
        count,
        70000,
    )
    assert sql(pg_queue, "SELECT count(*) FROM output_chunks") == [(0,)]
    assert not Path(stdout_of(spool, job)).exists()
    assert not Path(stdout_of(spool, job)).parent.exists(), "the emptied folder stays"


def test_a_failed_pass_loses_nothing_and_stores_nothing_twice(
    pg_queue: str, tmp_path: Path
) -> None:
    """A pass whose transaction rolled back, or whose commit was not confirmed,
    is followed by one that resumes from where the database stands."""
    spool = tmp_path / "worker-host"
    job = add(pg_queue, spool, "true")
    data_of(spoolctl("work", "--db", pg_queue, "--once", "--json", spool=spool))
    attempt_id = int(sql(pg_queue, "SELECT id FROM attempts WHERE job_id = %s", (job,))[0][0])
    # the worker stored the empty streams as empty chunks; this copier starts afresh
    sql(pg_queue, "DELETE FROM output_chunks WHERE attempt_id = %s RETURNING id", (attempt_id,))
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    out.write_bytes(b"a" * 100)
    err.write_bytes(b"")
    copier = OutputCopier(cap=1000)
    copier.track(attempt_id, {"stdout": str(out), "stderr": str(err)})
    queue_file = open_for_write(driver_of(pg_queue))
    try:
        with pytest.raises(RuntimeError), queue_file.engine.begin() as conn:
            copier.copy(conn, copier.behind())
            raise RuntimeError("rolled back")
        copier.failed()
        with queue_file.engine.begin() as conn:  # commits, but is reported as failed
            copier.copy(conn, copier.behind())
        copier.failed()
        with out.open("ab") as handle:
            handle.write(b"b" * 50)
        assert copier.behind() == [attempt_id]
        with queue_file.engine.begin() as conn:
            copier.copy(conn, copier.behind())
        copier.landed()
        assert copier.behind() == []
    finally:
        queue_file.dispose()
    stored = chunks(pg_queue, job, "stdout")
    assert [(o, d, t) for o, d, t in stored] == [(0, b"a" * 100, 0), (100, b"b" * 50, 0)]


@pytest.mark.parametrize("prune", ["before", "during"])
def test_an_attempt_pruned_underneath_is_forgotten_without_a_failed_pass(
    pg_queue: str, tmp_path: Path, prune: str
) -> None:
    """A prune that deleted an attempt before the copier's pass, or that is
    deleting it while the pass runs (the pass waits on the row, then finds it
    gone), leaves that attempt's chunks out and the copier forgets it; the
    other attempt of the pass is stored, and nothing fails."""
    spool = tmp_path / "worker-host"
    jobs = [add(pg_queue, spool, "true") for _ in range(2)]
    data_of(spoolctl("work", "--db", pg_queue, "--drain", "--json", spool=spool))
    gone, kept = (
        int(sql(pg_queue, "SELECT id FROM attempts WHERE job_id = %s", (job,))[0][0])
        for job in jobs
    )
    copier = OutputCopier(cap=1000)
    for aid in (gone, kept):
        out = tmp_path / f"out-{aid}"
        out.write_bytes(b"x" * 10)
        copier.track(aid, {"stdout": str(out), "stderr": str(tmp_path / "none")})
    sql(pg_queue, "DELETE FROM output_chunks RETURNING id")
    deleter = psycopg.connect(libpq_url(pg_queue))
    deleter.execute("DELETE FROM attempts WHERE id = %s", (gone,))
    if prune == "before":
        deleter.commit()
    queue_file = open_for_write(driver_of(pg_queue))
    errors: list[BaseException] = []

    def copy() -> None:
        try:
            with queue_file.engine.begin() as conn:
                copier.copy(conn, [gone, kept], final=True)
            copier.landed()
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    try:
        copying = threading.Thread(target=copy)
        copying.start()
        if prune == "during":
            copying.join(timeout=0.5)
            assert copying.is_alive(), "the pass waits for the deleting transaction"
            deleter.commit()
        copying.join(timeout=30)
        assert not copying.is_alive() and errors == []
    finally:
        deleter.close()
        queue_file.dispose()
    assert copier.behind() == []
    stored = sql(pg_queue, 'SELECT attempt_id, stream, "offset", data FROM output_chunks')
    assert [(a, s, o, bytes(d)) for a, s, o, d in stored] == [(kept, "stdout", 0, b"x" * 10)]


def test_a_sqlite_queue_stores_no_chunks(tmp_path: Path) -> None:
    db = tmp_path / "spool" / "queue.db"
    job = add(str(db), tmp_path, "echo", "hi")
    data_of(spoolctl("work", "--db", str(db), "--once", "--json", spool=tmp_path))
    shown = data_of(spoolctl("output", str(job), "--db", str(db), "--json", spool=tmp_path))
    assert shown["streams"]["stdout"]["preview"] == "hi\n"
    assert "source" not in shown["streams"]["stdout"]
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM output_chunks").fetchone() == (0,)
    assert Path(stdout_of(tmp_path / "spool", job)).read_bytes() == b"hi\n"


def test_output_stored_across_failed_passes_is_whole(pg_queue: str, tmp_path: Path) -> None:
    """The worker's passes fail while the job prints (its attempt row locked
    by another session; then its database sessions killed): they are redone
    from where the database stands, so the stored copy ends up byte for byte
    the job's output, each byte once."""
    spool = tmp_path / "worker-host"
    code = (
        "import sys, time\n"
        "for i in range(80):\n"
        "    sys.stdout.write(f'line {i}\\n'); sys.stdout.flush(); time.sleep(0.03)"
    )
    job = add(pg_queue, spool, *python_job(code))
    local = Path(stdout_of(spool, job))
    worker = subprocess.Popen(
        [sys.executable, "-m", "spoolctl", "work", "--db", pg_queue, "--once", "--json"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=child_env({"SPOOLCTL_SPOOL_DIR": str(spool)}),
        cwd=REPO,
    )
    STARTED_WORKERS.append(worker)

    def stored_lines() -> int:
        return stored_bytes(chunks(pg_queue, job, "stdout")).count(b"\n")

    wait_for(lambda: stored_lines() >= 5, what="5 lines stored")
    with psycopg.connect(libpq_url(pg_queue)) as blocker:
        blocker.execute("SELECT id FROM attempts WHERE job_id = %s FOR UPDATE", (job,))
        held = stored_lines()
        wait_for(lambda: local.read_bytes().count(b"\n") >= held + 15, what="15 more lines")
        assert stored_lines() == held  # every pass meanwhile failed on the lock
    wait_for(lambda: stored_lines() >= held + 15, what="the held-back lines stored")
    sql(
        pg_queue,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        " AND application_name LIKE 'spoolctl%%'",
    )
    assert worker.wait(timeout=60) == 0
    expected = "".join(f"line {i}\n" for i in range(80)).encode()
    assert local.read_bytes() == expected
    assert stored_bytes(chunks(pg_queue, job, "stdout")) == expected
    assert sql(pg_queue, "SELECT state FROM jobs WHERE id = %s", (job,)) == [("done",)]


def missing_flags(url: str, job: int, spool: Path) -> dict[str, tuple[bool, bool]]:
    """Per stream, `missing` as `output` and as `feedback` report it."""
    shown = data_of(spoolctl("output", str(job), "--db", url, "--json", spool=spool))["streams"]
    told = data_of(spoolctl("feedback", str(job), "--db", url, "--json", spool=spool))["streams"]
    return {name: (shown[name]["missing"], told[name]["missing"]) for name in ("stdout", "stderr")}


NOT_MISSING = {"stdout": (False, False), "stderr": (False, False)}
MISSING = {"stdout": (True, True), "stderr": (True, True)}


def queue_rows(url: str) -> dict[str, Any]:
    """Every row of every table, and the revision: what a refusal must leave."""
    names = [r[0] for r in sql(url, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
    return {name: sorted(map(repr, sql(url, f'SELECT * FROM "{name}"'))) for name in names}


def test_a_running_attempt_with_nothing_stored_yet_is_not_missing(
    pg_queue: str, tmp_path: Path
) -> None:
    worker_spool, reader_spool = tmp_path / "worker-host", tmp_path / "reader-host"
    gate = tmp_path / "gate"
    wait_code = f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.02)"
    job = add(pg_queue, worker_spool, *python_job(wait_code))
    worker = subprocess.Popen(
        [sys.executable, "-m", "spoolctl", "work", "--db", pg_queue, "--once", "--json"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=child_env({"SPOOLCTL_SPOOL_DIR": str(worker_spool)}),
        cwd=REPO,
    )
    STARTED_WORKERS.append(worker)
    wait_for(lambda: Path(stdout_of(worker_spool, job)).exists(), what="the job started")
    assert sql(pg_queue, "SELECT state FROM attempts WHERE job_id = %s", (job,)) == [("running",)]
    assert chunks(pg_queue, job, "stdout") == chunks(pg_queue, job, "stderr") == []
    assert missing_flags(pg_queue, job, reader_spool) == NOT_MISSING, "empty so far"
    gate.touch()
    assert worker.wait(timeout=60) == 0
    assert chunks(pg_queue, job, "stdout") == chunks(pg_queue, job, "stderr") == [(0, b"", 0)]
    assert missing_flags(pg_queue, job, reader_spool) == NOT_MISSING, "stored empty"


def test_stored_output_that_is_gone_is_missing(pg_queue: str, tmp_path: Path) -> None:
    """Chunks deleted underneath, or dropped by a downgrade given the flag and
    upgraded back: the ended attempt's streams are `missing`, as a missing
    file is on SQLite. Without the flag the downgrade refuses, changing nothing."""
    worker_spool, reader_spool = tmp_path / "worker-host", tmp_path / "reader-host"
    printed = add(pg_queue, worker_spool, "echo", "hello")
    quiet = add(pg_queue, worker_spool, "true")
    data_of(spoolctl("work", "--db", pg_queue, "--drain", "--json", spool=worker_spool))
    for job in (printed, quiet):
        assert missing_flags(pg_queue, job, reader_spool) == NOT_MISSING
    sql(
        pg_queue,
        "DELETE FROM output_chunks c USING attempts a WHERE a.id = c.attempt_id"
        " AND a.job_id = %s RETURNING c.id",
        (quiet,),
    )
    assert missing_flags(pg_queue, quiet, reader_spool) == MISSING

    down = ("migrate", "--db", pg_queue, "--json", "--downgrade", KNOWN_REVISIONS[2], "--yes")
    before = queue_rows(pg_queue)
    refused = spoolctl(*down, spool=reader_spool)
    assert refused.returncode == 2, refused.stdout
    (error,) = json.loads(refused.stdout)["errors"]
    assert error["code"] == "SAFETY_BLOCK" and DELETE_STORED_OUTPUT_FLAG in error["message"]
    assert (error["detail"]["attempts"], error["detail"]["bytes"]) == (1, len(b"hello\n"))
    assert queue_rows(pg_queue) == before, "refused: nothing changed"
    data_of(spoolctl(*down, DELETE_STORED_OUTPUT_FLAG, spool=reader_spool))
    data_of(spoolctl("migrate", "--db", pg_queue, "--json", spool=reader_spool))

    assert missing_flags(pg_queue, printed, reader_spool) == MISSING
    shown = data_of(
        spoolctl("output", str(printed), "--db", pg_queue, "--json", spool=reader_spool)
    )["streams"]["stdout"]
    assert (shown["size_bytes"], shown["preview"], shown["stored_bytes"]) == (0, "", 0)
    assert shown["path"] == stdout_of(worker_spool, printed), "where the worker's file is"
    assert Path(shown["path"]).read_bytes() == b"hello\n", "a downgrade keeps output files"
    text = spoolctl("output", str(printed), "--db", pg_queue, spool=reader_spool)
    assert text.returncode == 0 and b"(no file)" in text.stdout


def test_on_sqlite_a_downgrade_needs_no_flag_and_keeps_the_output(tmp_path: Path) -> None:
    """SQLite keeps output in files and stores no chunks: nothing to refuse."""
    db = tmp_path / "spool" / "queue.db"
    job = add(str(db), tmp_path, "echo", "hi")
    data_of(spoolctl("work", "--db", str(db), "--once", "--json", spool=tmp_path))
    down = data_of(
        spoolctl(
            "migrate",
            "--db",
            str(db),
            "--json",
            "--downgrade",
            KNOWN_REVISIONS[2],
            "--yes",
            spool=tmp_path,
        )
    )
    assert down["to_revision"] == KNOWN_REVISIONS[2]
    data_of(spoolctl("migrate", "--db", str(db), "--json", spool=tmp_path))
    shown = data_of(spoolctl("output", str(job), "--db", str(db), "--json", spool=tmp_path))
    assert (shown["streams"]["stdout"]["preview"], shown["streams"]["stdout"]["missing"]) == (
        "hi\n",
        False,
    )
