"""`metrics`: the queue's metrics in the Prometheus text exposition format,
on stdout or written atomically to a file (node_exporter's textfile
collector, a cron wrapper). Read-only: never takes the write lock, never
creates a queue. Needs the metrics extra (prometheus_client), imported here
only when the verb runs."""

from __future__ import annotations

import importlib
import os
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import click

from spoolctl.cli.options import BoundedText, db_option, json_option, verb
from spoolctl.cli.queues import open_read, warn_no_queue
from spoolctl.cli.render import Reply, emit
from spoolctl.config import Timing
from spoolctl.errors import ExtraMissing, InvalidInput
from spoolctl.services import metrics as collecting
from spoolctl.services.metrics import MetricsSnapshot

OUTPUT_FILE_MODE = 0o644
"""The written file: readable by node_exporter, which runs as its own user."""


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
    help="Write the exposition to this file atomically instead of stdout.",
)
@db_option
@json_option
def metrics(output: str | None, db: str | None, as_json: bool) -> int:
    """Prometheus metrics (the text exposition format) of the queue.

    Jobs per state and queue, the oldest due job's age, scheduled jobs, running
    jobs and free --slots per lane, paused lanes, live workers, unconfirmed
    orphans, totals of attempts and reaps, recent durations and pickup
    latency. With --output the file is replaced in one rename (a reader never
    sees half of it). Needs the metrics extra: pip install 'spoolctl[metrics]'.
    """
    exposition = load_exposition()
    snapshot, found = snapshot_of(db)
    text = exposition.render(snapshot).decode("utf-8")
    data: dict[str, Any] = {
        "output": None,
        "exposition": None,
        "bytes": len(text.encode("utf-8")),
        "content_type": exposition.CONTENT_TYPE,
    }
    if output is not None:
        data["output"] = str(write_atomically(Path(output), text))
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


def snapshot_of(db: str | None) -> tuple[MetricsSnapshot, bool]:
    """The queue's metrics, read in one snapshot by the queue's clock (the
    server's on PostgreSQL); an empty set when no queue exists yet."""
    queue = open_read(db)
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
