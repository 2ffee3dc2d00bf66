"""Placement across a fleet of real workers: three simulated GPU hosts, each
a worker with a declared inventory (SPOOLCTL_TEST_GPUS, `work --gpus all`)
posing as its own machine (SPOOLCTL_TEST_HOSTNAME) in a PID namespace of its
own (`unshare --pid --mount-proc`, as tests/process/test_pid_namespaces.py
runs them), sharing one queue: an SQLite file or a PostgreSQL database.

JOBS jobs of mixed requests (plain, `--weight 2`, 1, 2 and 4 GPUs, halves
and quarters of one, a GPU model, a GPU memory floor) each write the devices
they saw with their start and end (tests/placement_marks.py). Checked: every
job ran exactly once; every job saw exactly the devices its attempt recorded
(`attempts.devices`), as many as it asked for, of the model and memory it
asked for, on the host its attempt names, with CUDA_VISIBLE_DEVICES naming
their indexes in the same order; a job without GPUs saw none; and a sweep of
the intervals finds no device held beyond its capacity at any instant. The
issue's figure was 500 jobs; 150 keep the test within about a minute on a
loaded 2-core machine on each backend, and the mix still packs shares and
contends for every device.

The starvation test: one host of 4 devices, a submitter thread keeping a
stream of 1-GPU jobs due while the worker runs them, and a 4-GPU job added
once the stream keeps every device busy. The policy (services/placement.py,
docs/gpus.md): once it is the lane's first job that does not fit, what it
needs is reserved, so no job ranked after it starts on those devices before
it, and it starts once the jobs that held them have ended, while the stream
still runs.
"""

from __future__ import annotations

import contextlib
import json
import random
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import psutil
import pytest

from spoolctl.cli.database import open_write
from spoolctl.resources import model_matches
from tests.helpers import (
    NS_INIT,
    STARTED_WORKERS,
    UNSHARE,
    Db,
    child_env,
    needs_namespaces,
    rows,
    start_worker,
    wait_for,
)
from tests.placement_marks import add_with_request, mark_argv, marks, peaks_by_key

pytestmark = [
    pytest.mark.both_backends,
    pytest.mark.subprocess,
    pytest.mark.slow,
    pytest.mark.timeout(300),
]

GIB = 1 << 30
JOBS = 150
JOB_S = 0.05
KNOBS = {"SPOOLCTL_TEST_HEARTBEAT_INTERVAL": "0.2", "SPOOLCTL_TEST_REAP_THRESHOLD": "10"}
"""Workers see each other live (a reservation's chosen host) within 10 s;
the lease (SPOOLCTL_HANG_THRESHOLD, 600 s by default) is never reached."""


def inventory(host: str, count: int, model: str, memory_g: int) -> list[dict[str, Any]]:
    return [
        {"uuid": f"GPU-{host}-{i}", "index": i, "model": model, "memory": memory_g * GIB}
        for i in range(count)
    ]


HOSTS = {
    "h1": inventory("h1", 4, "Fake A100-SXM4-80GB", 80),
    "h2": inventory("h2", 4, "Fake A100-PCIE-40GB", 40),
    "h3": inventory("h3", 2, "Fake H100 80GB HBM3", 80),
}
MIX: list[tuple[dict[str, Any], int]] = [
    ({}, 3),
    ({"weight": 2}, 1),
    ({"gpus": 1}, 4),
    ({"gpus": 2}, 2),
    ({"gpus": 1, "gpu_share": 2}, 3),
    ({"gpus": 1, "gpu_share": 4}, 3),
    ({"gpus": 1, "gpu_model": "H100"}, 1),
    ({"gpus": 1, "gpu_memory_bytes": 60 * GIB}, 1),
    ({"gpus": 4, "gpu_memory_bytes": 60 * GIB}, 1),
]
"""Requests (job columns) and how often each is drawn."""


@dataclass
class Host:
    """One worker alone in its PID namespace, posing as machine `name`."""

    name: str
    popen: subprocess.Popen[str]

    def destroy(self) -> None:
        """Kill the namespace's PID 1, and with it everything in there."""
        with contextlib.suppress(psutil.Error):
            for kid in psutil.Process(self.popen.pid).children():
                kid.kill()
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(timeout=30)


@contextlib.contextmanager
def fleet(db: Db, root: Path) -> Iterator[list[Host]]:
    needs_namespaces()
    hosts = []
    try:
        for name, devices in HOSTS.items():
            work = [sys.executable, "-m", "spoolctl", "work", "--db", str(db), "--json"]
            work += ["--worker-id", f"w-{name}", "--concurrency", "6", "--gpus", "all"]
            work += ["--poll-interval", "0.1"]
            env = child_env(
                {
                    **KNOBS,
                    "SPOOLCTL_TEST_HOSTNAME": name,
                    "SPOOLCTL_TEST_GPUS": json.dumps(devices),
                }
            )
            popen = subprocess.Popen(
                [*UNSHARE, "sh", "-c", NS_INIT, str(root / f"ns-{name}"), *work],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                text=True,
                start_new_session=True,
            )
            STARTED_WORKERS.append(popen)
            hosts.append(Host(name, popen))
        yield hosts
    finally:
        for host in hosts:
            host.destroy()


def worker_logs(root: Path) -> str:
    return "\n".join(p.read_text()[-2000:] for p in sorted(root.glob("ns-*.log")))


def test_a_fleet_never_over_holds_a_device_and_each_job_sees_its_own(
    db: Db, tmp_path: Path
) -> None:
    folder = tmp_path / "marks"
    folder.mkdir()
    rng = random.Random(47)
    requests, weights = zip(*MIX, strict=True)
    queue = open_write(str(db))
    try:
        asked = {}
        for _ in range(JOBS):
            request = rng.choices(requests, weights)[0]
            asked[add_with_request(queue, mark_argv(folder, JOB_S), request)] = request
    finally:
        queue.engine.dispose()

    with fleet(db, tmp_path):

        def done() -> bool:
            found = rows(db, "SELECT count(*) AS n FROM jobs WHERE state = 'done'")
            return int(found[0]["n"]) == JOBS

        try:
            wait_for(done, timeout=120, interval=0.2, what=f"{JOBS} jobs done")
        except AssertionError as exc:
            states = rows(db, "SELECT state, count(*) AS n FROM jobs GROUP BY state")
            raise AssertionError(f"{exc}: {states}\n{worker_logs(tmp_path)}") from None

    tries = rows(db, "SELECT job_id, state, host, devices FROM attempts ORDER BY job_id")
    assert [(r["job_id"], r["state"]) for r in tries] == [(j, "succeeded") for j in sorted(asked)]
    seen = {m.job_id: m for m in marks(folder)}
    assert sorted((m.job_id, m.attempt) for m in seen.values()) == [(j, 1) for j in sorted(asked)]
    device = {d["uuid"]: (host, d) for host, kind in HOSTS.items() for d in kind}
    held = []
    for attempt in tries:
        job_id, mark, request = attempt["job_id"], seen[attempt["job_id"]], asked[attempt["job_id"]]
        recorded = tuple(attempt["devices"].split(",")) if attempt["devices"] else ()
        assert mark.gpus is not None and mark.visible is not None, f"job {job_id}: {mark}"
        assert set(mark.gpus) == set(recorded), f"job {job_id} saw {mark.gpus}, held {recorded}"
        assert len(mark.gpus) == request.get("gpus", 0), f"job {job_id} asked {request}: {mark}"
        assert mark.visible == tuple(str(device[u][1]["index"]) for u in mark.gpus), mark
        for uuid in mark.gpus:
            host, facts = device[uuid]
            assert host == attempt["host"], f"job {job_id} on {attempt['host']} saw {uuid}"
            assert model_matches(request.get("gpu_model") or "*", facts["model"]), (job_id, facts)
            assert facts["memory"] >= request.get("gpu_memory_bytes", 0), (job_id, facts)
            share = Fraction(1, request.get("gpu_share", 1))
            held.append((uuid, mark.start, mark.end, share))
    over = {uuid: top for uuid, top in peaks_by_key(held).items() if top > 1}
    assert not over, f"devices held beyond their capacity: {over}"
    assert {uuid for uuid, *_ in held} == set(device), "some device was never used"
    left = rows(db, "SELECT uuid, held FROM devices WHERE held <> 0")
    assert left == [] and rows(db, "SELECT * FROM device_holds") == []


SMALL_S = 0.4
STREAM_MAX = 400
"""The stream's cap: the big job must start long before it is reached."""


class Stream(threading.Thread):
    """Keeps QUEUED small jobs due while the worker runs them, until told to
    stop (or STREAM_MAX jobs)."""

    QUEUED = 6

    def __init__(self, db: Db, folder: Path) -> None:
        super().__init__(daemon=True)
        self.db, self.folder = db, folder
        self.added: list[int] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        queue = open_write(str(self.db))
        try:
            while not self.stop.is_set() and len(self.added) < STREAM_MAX:
                queued = rows(self.db, "SELECT count(*) AS n FROM jobs WHERE state = 'queued'")
                for _ in range(self.QUEUED - int(queued[0]["n"])):
                    argv = mark_argv(self.folder, SMALL_S)
                    self.added.append(add_with_request(queue, argv, {"gpus": 1}))
                self.stop.wait(0.05)
        except BaseException as exc:  # reported by the test
            self.error = exc
        finally:
            queue.engine.dispose()


def claimed_order(db: Db) -> dict[int, int]:
    """Job id -> the id of its `claimed` event (the order of the claims)."""
    found = rows(db, "SELECT job_id, id FROM job_events WHERE event = 'claimed'")
    return {int(r["job_id"]): int(r["id"]) for r in found}


def test_a_big_job_starts_within_the_bound_under_a_stream_of_small_ones(
    db: Db, tmp_path: Path
) -> None:
    folder = tmp_path / "marks"
    folder.mkdir()
    made = open_write(str(db))
    made.write(lambda conn: None)  # the queue exists before anyone reads it
    made.engine.dispose()
    env = {**KNOBS, "SPOOLCTL_TEST_HOSTNAME": "solo"}
    env["SPOOLCTL_TEST_GPUS"] = json.dumps(inventory("solo", 4, "Fake A100", 80))
    worker = start_worker(
        db, "--concurrency", "4", "--gpus", "all", "--poll-interval", "0.1", env=env
    )
    stream = Stream(db, folder)
    stream.start()
    try:
        wait_for(lambda: len(claimed_order(db)) >= 8, timeout=60, what="the stream to run")
        queue = open_write(str(db))
        try:
            big = add_with_request(queue, mark_argv(folder, SMALL_S), {"gpus": 4})
        finally:
            queue.engine.dispose()
        wait_for(lambda: big in claimed_order(db), timeout=120, what="the 4-GPU job to start")
        stream.stop.set()
        stream.join(timeout=60)
        assert stream.error is None, stream.error
        assert len(stream.added) < STREAM_MAX, "the stream ended before the big job started"
        every = [*stream.added, big]
        wait_for(lambda: len(marks(folder)) == len(every), timeout=120, what="every job to end")
    finally:
        stream.stop.set()
        worker.kill()
        worker.communicate()

    order = claimed_order(db)
    added = {
        int(r["job_id"]): int(r["id"])
        for r in rows(db, "SELECT job_id, id FROM job_events WHERE event = 'added'")
    }
    after = [j for j in stream.added if j > big]
    waiting = [j for j in after if added[j] < order[big]]
    assert waiting, "no small job was due when the big one started: the stream had stopped"
    jumped = [j for j in after if order[j] < order[big]]
    assert not jumped, f"jobs ranked after the 4-GPU job {big} started before it: {jumped}"
    meanwhile = [j for j, at in order.items() if added[big] < at < order[big]]
    assert all(j < big for j in meanwhile), (big, meanwhile)
    (mark,) = [m for m in marks(folder) if m.job_id == big]
    assert mark.gpus is not None and len(mark.gpus) == 4, mark
