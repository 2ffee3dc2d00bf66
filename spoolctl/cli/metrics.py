"""`metrics`: the queue's metrics in the Prometheus text exposition format,
on stdout or written atomically to a file (node_exporter's textfile
collector, a cron wrapper). Read-only: never takes the write lock, never
creates a queue. Needs the metrics extra (prometheus_client), imported here
only when the verb runs."""

from __future__ import annotations

import codecs
import importlib
import os
import stat
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

import click

from spoolctl.cli.database import driver_of, warn_no_queue
from spoolctl.cli.options import BoundedText, db_option, json_option, verb
from spoolctl.cli.reply import Reply, emit
from spoolctl.config import Timing
from spoolctl.db.backends.base import Driver
from spoolctl.db.queue import open_for_read
from spoolctl.errors import ExtraMissing, InvalidInput
from spoolctl.services import metrics as collecting
from spoolctl.services.metrics import MetricsSnapshot

OUTPUT_FILE_MODE = 0o644
"""The written file: readable by node_exporter, which runs as its own user."""
PROBE_BYTES = 8192
"""How much of an existing file is read to tell a metrics file from another."""
SQLITE_HEADER = b"SQLite format 3\0"
KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
)


@verb(
    "metrics",
    examples=(
        "spoolctl metrics",
        "spoolctl metrics --output /var/lib/node_exporter/textfile/spoolctl.prom",
    ),
)
@click.option(
    "--output",
    type=BoundedText("output file", 4096),
    default=None,
    help="Write the exposition to this file atomically instead of stdout: a new file, or "
    "a text file such as an earlier exposition. A link, folder, device, FIFO, socket, one "
    "of the queue's own files or a file that is not text is INVALID_INPUT.",
)
@db_option
@json_option
def metrics(output: str | None, db: str | None, as_json: bool) -> int:
    """Prometheus metrics (the text exposition format) of the queue.

    Jobs per state and queue, the oldest due job's age, scheduled jobs, running
    jobs and free --slots per lane, paused lanes, live workers, unconfirmed
    orphans, totals of attempts and reaps, recent durations and pickup
    latency. With --output the file is replaced in one rename (a reader never
    sees half of it). --output refuses, with INVALID_INPUT (detail.reason)
    and writing nothing, a path that is a symbolic link (symlink), a folder,
    device, FIFO or socket (not_a_regular_file), one of the queue's own
    files: the database, its -wal, -shm or -journal, output/ (inside_spool), or a
    file that is not text, such as an SQLite database (not_a_metrics_file),
    or one it cannot look at (unreadable). Needs the metrics extra: pip install 'spoolctl[metrics]'.
    """
    exposition = load_exposition()
    driver = driver_of(db)
    target = None if output is None else output_target(output, driver.spool, driver.output_root)
    snapshot, found = snapshot_of(driver)
    text = exposition.render(snapshot).decode("utf-8")
    data: dict[str, Any] = {
        "output": None,
        "exposition": None,
        "bytes": len(text.encode("utf-8")),
        "content_type": exposition.CONTENT_TYPE,
    }
    if target is not None:
        data["output"] = str(write_atomically(target, text))
        reply = Reply(data, text=f"spoolctl metrics: wrote {data['bytes']} bytes to {output}")
    else:
        data["exposition"] = text
        reply = Reply(data, text=text.rstrip("\n"))
    return emit(reply if found else warn_no_queue(reply, db), as_json)


def load_exposition() -> ModuleType:
    """spoolctl.exposition, or EXTRA_MISSING naming the install command."""
    try:
        exposition = importlib.import_module("spoolctl.exposition")
    except ModuleNotFoundError as exc:
        raise ExtraMissing(
            f"spoolctl metrics needs the metrics extra ({exc.name} is missing)",
            extra="metrics",
            missing=exc.name,
        ) from None
    return exposition


def snapshot_of(driver: Driver) -> tuple[MetricsSnapshot, bool]:
    """The queue's metrics, read in one snapshot by the queue's clock (the
    server's on PostgreSQL); an empty set when no queue exists yet."""
    queue = open_for_read(driver)
    if queue is None:
        return collecting.empty_snapshot(time.time()), False
    now = queue.now()
    live_within_s = Timing.from_env().reap_threshold_s
    return queue.read(lambda conn: collecting.collect(conn, now, live_within_s=live_within_s)), True


def write_atomically(path: Path, text: str) -> Path:
    """Write text to a temporary file beside path, flush it to disk, rename
    it over path: readers see the old file or the new one, never a part."""
    target = path.expanduser().absolute()
    try:
        fd, temp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise InvalidInput(
            f"cannot write --output {path}: {exc.strerror or exc}",
            flag="--output",
            reason=exc.strerror or str(exc),
        ) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as sink:
            sink.write(text)
            sink.flush()
            os.fsync(sink.fileno())
        os.chmod(temp, OUTPUT_FILE_MODE)
        os.replace(temp, target)
    except OSError as exc:
        Path(temp).unlink(missing_ok=True)
        raise InvalidInput(
            f"cannot write --output {path}: {exc.strerror or exc}",
            flag="--output",
            reason=exc.strerror or str(exc),
        ) from None
    return target


def output_target(given: str, spool: Path, output_root: Path) -> Path:
    """Where --output may write, checked before anything is read or written:
    a path that does not exist yet, or a regular text file (an earlier
    exposition). Never a symbolic link, a folder, a device, a FIFO or a
    socket (a rename would replace it: as root, --output /dev/null replaced
    the system's /dev/null), none of the queue's own files (the database, its
    -wal, -shm or -journal, anything under the output folder), and no file
    that is not text (an SQLite database, any binary). Other files beside
    the database may be written: `--db ./queue.db` with
    `--output ./spoolctl.prom` is usual."""
    target = Path(given).expanduser().absolute()
    real = Path(os.path.realpath(target))
    if _is_queue_file(real, Path(os.path.realpath(spool)), Path(os.path.realpath(output_root))):
        refuse(given, f"is one of the queue's own files (in {spool})", "inside_spool")
    try:
        found = os.lstat(target)
    except FileNotFoundError:
        return target
    except OSError as exc:
        refuse(given, f"cannot be checked: {exc.strerror or exc}", "unreadable")
    if stat.S_ISLNK(found.st_mode):
        refuse(given, "is a symbolic link: name the file itself", "symlink")
    for test, kind in KINDS:
        if test(found.st_mode):
            refuse(given, f"is {kind}, not a regular file", "not_a_regular_file")
    if not stat.S_ISREG(found.st_mode):
        refuse(given, "is not a regular file", "not_a_regular_file")
    if not is_text(target):
        refuse(
            given, "holds data that is not text (not an earlier exposition)", "not_a_metrics_file"
        )
    return target


SIDECARS = ("-wal", "-shm", "-journal")
"""What SQLite keeps beside a database file while it is used."""


def _is_queue_file(real: Path, spool: Path, output_root: Path) -> bool:
    """The output folder or anything in it, or a file of an SQLite database
    in the spool folder: the database itself or one of its sidecars (an
    empty -wal after a checkpoint is not told apart by its content)."""
    if real == output_root or output_root in real.parents:
        return True
    if real.parent != spool:
        return False
    name = real.name
    for suffix in SIDECARS:
        if name.endswith(suffix):
            name = name.removesuffix(suffix)
            break
    return _starts_as_sqlite(spool / name)


def _starts_as_sqlite(path: Path) -> bool:
    try:
        with open(path, "rb") as handle:
            return handle.read(len(SQLITE_HEADER)) == SQLITE_HEADER
    except OSError:
        return False


def is_text(path: Path) -> bool:
    """The file's first bytes are UTF-8 text without NUL: what an exposition
    is, and what an SQLite database (its header ends in NUL) or any other
    binary file is not. Opened without following a link and without
    blocking, and checked to be the regular file that was looked at."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        refuse(str(path), f"cannot be read to check it: {exc.strerror or exc}", "unreadable")
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        head = handle.read(PROBE_BYTES)
    if head.startswith(SQLITE_HEADER) or b"\0" in head:
        return False
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError:
        return False
    return True


def refuse(given: str, why: str, reason: str) -> NoReturn:
    raise InvalidInput(
        f"--output {given} {why}; nothing was written", flag="--output", reason=reason
    )
