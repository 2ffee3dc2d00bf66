"""The first signal of a canceled running job: chosen by the canceller
(SIGTERM unless told), carried in the `canceled` event's detail, and read
back by the worker that loses the job (`first_signals`); a bad name is
INVALID_INPUT. The processes themselves: tests/process/test_cancel_signals.py."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import pytest

from spoolctl.cli.database import open_write
from spoolctl.db.queue import Queue
from spoolctl.errors import InvalidInput
from spoolctl.services import claim
from spoolctl.services.cancel import cancel, first_signals, signal_number
from spoolctl.services.deadletter import requeue
from spoolctl.services.events import record_event
from spoolctl.services.job_spec import JobSpec
from spoolctl.services.submit import submit
from spoolctl.states import EventKind
from tests.helpers import Db

pytestmark = pytest.mark.both_backends


@pytest.fixture
def queue(db: Db) -> Iterator[Queue]:
    opened = open_write(str(db))
    yield opened
    opened.engine.dispose()


def running(queue: Queue) -> int:
    """A job claimed by worker `w`: running, as far as the queue knows."""
    spec = JobSpec(argv=["true"])
    job_id = int(queue.write(lambda conn: submit(conn, spec, time.time() - 1)).job_id)
    claimant = claim.Claimant("w", 1, "default", queue.output_root)
    (taken,) = queue.write(lambda conn: claim.claim_up_to(conn, claimant, 1, time.time()))
    assert taken.job_id == job_id
    return job_id


@pytest.mark.parametrize(
    ("raw", "number"),
    [("TERM", 15), ("SIGTERM", 15), ("term", 15), ("15", 15), ("INT", 2), ("hup", 1), ("9", 9)],
)
def test_a_signal_is_named_as_the_shell_names_it(raw: str, number: int) -> None:
    assert signal_number(raw) == number


@pytest.mark.parametrize("raw", ["", "0", "-15", "999", "NOPE", "SIG", "TERM!", "ＴＥＲＭ", "1e1"])
def test_anything_else_is_invalid_input(raw: str) -> None:
    with pytest.raises(InvalidInput):
        signal_number(raw)


def test_a_cancel_asks_for_sigterm_unless_told_otherwise(queue: Queue) -> None:
    graceful, killed, chosen = running(queue), running(queue), running(queue)
    now = time.time()
    queue.write(lambda conn: cancel(conn, graceful, running_ok=True, now=now))
    queue.write(
        lambda conn: cancel(conn, killed, running_ok=True, now=now, first_signal=signal.SIGKILL)
    )
    queue.write(
        lambda conn: cancel(conn, chosen, running_ok=True, now=now, first_signal=signal.SIGINT)
    )

    found = queue.read(lambda conn: first_signals(conn, [graceful, killed, chosen]))

    assert found == {graceful: signal.SIGTERM, killed: signal.SIGKILL, chosen: signal.SIGINT}


def test_a_cancel_that_names_no_signal_means_sigkill(queue: Queue) -> None:
    """A `canceled` event written before the key existed: the old behaviour."""
    job_id = running(queue)
    now = time.time()
    queue.write(lambda conn: cancel(conn, job_id, running_ok=True, now=now))
    queue.write(
        lambda conn: record_event(
            conn, job_id, EventKind.CANCELED, now, detail={"was_running": True}
        )
    )

    assert queue.read(lambda conn: first_signals(conn, [job_id])) == {job_id: signal.SIGKILL}


def test_a_job_lost_otherwise_is_not_answered(queue: Queue) -> None:
    """Force-retried: its worker kills it at once, as before."""
    job_id = running(queue)
    queue.write(lambda conn: requeue(conn, job_id, force=True, now=time.time()))

    assert queue.read(lambda conn: first_signals(conn, [job_id])) == {}
