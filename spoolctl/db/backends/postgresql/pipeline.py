"""A pass's statements in one psycopg pipeline: sent without waiting
between them, answered in one round trip, with the transaction's opening
(`begin.Opening`) first where it is still due."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine, event

from spoolctl.db.backends.postgresql.begin import Opening
from spoolctl.db.prepared import OPENING_INFO

PIPELINE_INFO = "spoolctl_pipeline"
"""A connection's info key: the psycopg pipeline it is in (`pipeline`)."""


@contextmanager
def pipeline(conn: Connection) -> Iterator[bool]:
    """psycopg's pipeline mode on conn's driver connection; leaving it waits
    for every answer still due. A statement SQLAlchemy runs meanwhile is
    answered at once (`answer_in_pipelines`): only
    `Prepared.send` waits. A transaction not opened yet opens first in the
    pipeline, and its revision check is read as the pipeline ends, before
    any answer of the pass is: where a statement failed, a schema that is
    not ours is the error told."""
    import psycopg

    info = conn.connection.info
    driver: Any = conn.connection.driver_connection
    opening: Opening | None = info.pop(OPENING_INFO, None)
    revision = None
    try:
        with driver.pipeline() as batch:
            info[PIPELINE_INFO] = batch
            try:
                revision = None if opening is None else opening.queue(driver)
                yield True
            finally:
                del info[PIPELINE_INFO]
    except psycopg.Error as failed:
        if opening is not None and revision is not None:  # None: the opening was not sent
            opening.check(revision, failed)
        raise
    if opening is not None:
        opening.check(revision)


def answer_in_pipelines(engine: Engine) -> None:
    """SQLAlchemy reads a statement's description and rows as soon as it
    ran: inside a pipeline, have them (and the answers sent before) now."""

    @event.listens_for(engine, "after_cursor_execute")
    def _answer_now(conn: Connection, *_: Any) -> None:
        batch = conn.connection.info.get(PIPELINE_INFO)
        if batch is not None:
            batch.sync()
