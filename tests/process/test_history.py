"""History-checked chaos on both backends (tests/history.py): jobs are
submitted with `add` while workers are SIGKILLed and replaced, SIGSTOPped
(sometimes past the hang threshold, where the others fence them), the
queue's disk fills up, one worker's clocks are stepped (a time namespace),
and on PostgreSQL the workers' connections are terminated and the server is
restarted. Then the queue is drained, and a checker that reads only the
jobs' own record and `add`'s replies finds no lost job and no two copies of
one job at once, and counts the duplicates at-least-once allows.

A fault that cannot be injected here (no root for a tmpfs, no time
namespaces) is counted as not injected, with why; nothing asserts that a
fault hit a running job. Each run's figures go to SPOOLCTL_HISTORY_REPORT
(JSON lines) when it is set, and to the test's properties (junit XML).
SPOOLCTL_HISTORY_SEED repeats a run's choices (its seed is in the figures).
For a post-mortem a run leaves in its tmp_path the record (history/record),
the faults with their times (faults.jsonl), each worker's log (worker-N.log,
`--log-format json`: every reap with its verdict) and, where the spool was a
tmpfs, a copy of the SQLite queue (spool-kept/).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests import history
from tests.helpers import (
    STARTED_WORKERS,
    Db,
    child_env,
    cli,
    patience,
    stop_started_workers,
    wait_for,
)
from tests.history import Faults, Figures, Submissions
from tests.pg_server import ENV_URL, PgServer, start_server

HANG_S = 5.0
"""The hang threshold of these runs: a worker stopped for longer is fenced
by the others; one whose heartbeats do not land for half of it fences itself."""
WORKER_ENV = {"SPOOLCTL_HANG_THRESHOLD": str(HANG_S)}
JOBS = 240
WORKERS = 3
CHAOS_S = (20.0, 45.0)
"""Faults go on while `add` runs, for at least the first and at most the second."""
DRAIN_S = 60.0
"""On an idle machine; wait_for scales it (SPOOLCTL_TEST_TIMEOUT_SCALE)."""
WEIGHTS = {"sigkill": 3, "sigstop": 3, "disk_full": 1, "clock_step": 1, "server_restart": 1}
"""How often each kind comes after the first round (one of each); 2 if not named."""
DISK = "64m"

Done = dict[str, Any] | None
"""What a fault did (for the run's fault log), or None where it could not be injected."""
Injector = Callable[[random.Random], Done]


# -- what the jobs' record says, and the checker on hand-made records -------------------


def write_record(folder: Path, *lines: str) -> Path:
    """A record of `kind key attempt` lines (token and pid made up per attempt)."""
    history.prepare(folder)
    record = folder / history.RECORD
    with open(record, "a") as out:
        for line in lines:
            kind, key, attempt = line.split()
            out.write(f"{kind} {key} {attempt} w/{key}/{attempt} {100 + int(attempt)} 1\n")
    return record


def submitted(*keys: str) -> Submissions:
    return Submissions(tried=list(keys), acked={k: n for n, k in enumerate(keys, 1)})


def test_the_checker_counts_a_rerun_after_a_crash_as_a_duplicate(tmp_path: Path) -> None:
    record = write_record(tmp_path, "start a 1", "start b 1", "end b 1", "start a 2", "end a 2")
    figures = history.check(record, submitted("a", "b"), {}, Faults())
    assert (figures.executions, figures.completed, figures.duplicates) == (3, 2, 1)
    assert (figures.lost, figures.overlaps, figures.phantoms) == (0, 0, 0)


def test_the_checker_finds_a_lost_job(tmp_path: Path) -> None:
    """Acknowledged, started, never ended and not dead: lost. A dead job is
    accounted for once it started, or with a reason for never starting."""
    record = write_record(tmp_path, "start a 1", "start b 1", "end b 1", "start d 1")
    keys = submitted("a", "b", "c", "d", "e")
    dead = {"d": "exit 1", "e": "could not spawn: no such file"}
    figures = history.check(record, keys, dead, Faults())
    assert (figures.lost, figures.lost_keys, figures.dead) == (2, ["a", "c"], 2)
    assert history.check(record, keys, {**dead, "c": "timed out"}, Faults()).lost_keys == ["a", "c"]


def test_the_checker_finds_two_copies_at_once(tmp_path: Path) -> None:
    """By the lock (a copy found it held) and by the record's order alone (a
    copy started between another's start and end); copies one after the
    other, or after one killed mid-run, are no overlap."""
    by_lock = write_record(tmp_path / "1", "start a 1", "overlap a 2", "start a 2", "end a 2")
    assert history.check(by_lock, submitted("a"), {}, Faults()).overlap_keys == ["a"]
    by_order = write_record(tmp_path / "2", "start a 1", "start a 2", "end a 1", "end a 2")
    assert history.check(by_order, submitted("a"), {}, Faults()).overlaps == 1
    fine = write_record(tmp_path / "3", "start a 1", "start a 2", "end a 2", "start a 3", "end a 3")
    assert history.check(fine, submitted("a"), {}, Faults()).overlaps == 0


def test_the_checker_tells_ambiguous_adds_phantoms_and_torn_lines(tmp_path: Path) -> None:
    record = write_record(tmp_path, "start a 1", "end a 1", "start x 1", "start z 1")
    with open(record, "a") as out:
        out.write("start a\n")
    keys = Submissions(tried=["a", "x"], acked={"a": 1}, refused={"x": "UNREACHABLE"})
    figures = history.check(record, keys, {}, Faults())
    assert (figures.unacknowledged_run, figures.phantoms, figures.malformed) == (1, 1, 1)
    assert figures.lost == 0


@pytest.mark.subprocess
def test_a_real_job_writes_the_record_the_checker_reads(tmp_path: Path) -> None:
    """The job's own script, run twice by hand (the second while the first
    holds the lock), with the variables a worker exports."""
    folder = history.prepare(tmp_path / "runs")
    env = {**os.environ, "SPOOLCTL_ATTEMPT": "1", "SPOOLCTL_ATTEMPT_TOKEN": "w/1/2.000000"}
    first = subprocess.Popen(
        history.job_argv(folder, "k1", 5.0),
        env=env,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    record = folder / history.RECORD
    wait_for(lambda: "start k1" in record.read_text(), timeout=30, what="the first copy")
    second = subprocess.run(history.job_argv(folder, "k1", 0.0), env=env, capture_output=True)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    assert second.returncode == 0 and second.stdout == b"ran k1\n"
    figures = history.check(record, submitted("k1"), {}, Faults())
    assert (figures.executions, figures.completed, figures.overlaps) == (2, 1, 1)
    assert figures.malformed == 0
    assert history.key_of(history.job_argv(folder, "k9", 0.1)) == "k9"


# -- submitting -------------------------------------------------------------------------


class Submitter(threading.Thread):
    """Submits `count` jobs through `add` (one at a time, or `add --batch`),
    and keeps what each reply said."""

    def __init__(self, db: Db, folder: Path, count: int, rng: random.Random) -> None:
        super().__init__(daemon=True)
        self.db, self.folder, self.count, self.rng = db, folder, count, rng
        self.said = Submissions()
        self.error: BaseException | None = None

    def run(self) -> None:
        """Until `count` jobs are acknowledged: a refused add is tried again
        under new keys (a clean "no" obliges nothing), up to three times as many."""
        try:
            sent = 0
            while len(self.said.acked) < self.count and sent < 3 * self.count:
                size = 1 if self.rng.random() < 0.4 else self.rng.randint(4, 16)
                size = min(size, self.count - len(self.said.acked))
                keys = [f"k{n}" for n in range(sent, sent + size)]
                sent += len(keys)
                self.submit(keys)
        except BaseException as exc:  # told to the test, which fails on it
            self.error = exc

    def spec(self, key: str) -> dict[str, Any]:
        """A job as a line of `add --batch`. Most are short; about one in
        twelve outlives the reap threshold, a crash's backoff and the time a
        reaper takes under load, and comes first (priority 5): were a crashed
        copy not ended before the job runs again, it would still be running."""
        if self.rng.random() < 0.08:
            return {
                "argv": history.job_argv(self.folder, key, self.rng.uniform(5.0, 8.0)),
                "priority": 5,
            }
        return {"argv": history.job_argv(self.folder, key, self.rng.uniform(0.05, 0.3))}

    def submit(self, keys: list[str]) -> None:
        specs = [self.spec(k) for k in keys]
        self.said.tried += keys
        if len(keys) == 1:
            priority = ("--priority", str(specs[0]["priority"])) if "priority" in specs[0] else ()
            result = cli("add", *priority, "--", *specs[0]["argv"], db=self.db, json=True)
        else:
            batch = self.folder / f"batch-{keys[0]}.ndjson"
            batch.write_text("".join(json.dumps(spec) + "\n" for spec in specs))
            result = cli("add", "--batch", str(batch), db=self.db, json=True)
        try:
            reply = json.loads(result.stdout)
        except ValueError:
            self.said.unanswered += keys
            return
        if not reply.get("ok"):
            code = reply["errors"][0]["code"] if reply.get("errors") else f"exit {result.exit_code}"
            self.said.refused.update(dict.fromkeys(keys, code))
            return
        ids = reply["data"]["job_ids"] if len(keys) > 1 else [reply["data"]["job_id"]]
        assert len(ids) == len(keys), reply
        self.said.acked.update(zip(keys, ids, strict=True))


# -- the fleet and its faults --------------------------------------------------------------


@dataclass
class Member:
    popen: subprocess.Popen[str]
    clock_offset_s: int = 0
    woken_at: float | None = None
    """While SIGSTOPped: when it gets its SIGCONT."""
    leaving: bool = False
    """Killed or told to stop by the test (its exit is no surprise)."""


class Fleet:
    """Loop-mode workers; the test kills, stops and replaces them."""

    def __init__(self, db: Db, root: Path, env: dict[str, str], faults: Faults) -> None:
        self.db, self.root, self.env, self.faults = db, root, env, faults
        self.members: list[Member] = []

    def start(self, clock_offset_s: int = 0) -> Member:
        argv = [
            sys.executable,
            "-m",
            "spoolctl",
            "work",
            "--db",
            str(self.db),
            "--json",
            "--concurrency",
            "2",
            "--poll-interval",
            "0.1",
            "--log-format",
            "json",
        ]
        if clock_offset_s:
            shift = str(clock_offset_s)
            argv = ["unshare", "--time", "--monotonic", shift, "--boottime", shift, *argv]
        with open(self.root / f"worker-{len(self.members)}.log", "w") as log:
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                text=True,
                env=child_env({**WORKER_ENV, **self.env}),
            )
        STARTED_WORKERS.append(popen)
        member = Member(popen, clock_offset_s)
        self.members.append(member)
        return member

    def working(self) -> list[Member]:
        return [m for m in self.members if not m.leaving and m.popen.poll() is None]

    def awake(self) -> list[Member]:
        return [m for m in self.working() if m.woken_at is None]

    def sigkill(self, rng: random.Random) -> Done:
        if not self.working():
            return None
        victim = rng.choice(self.working())
        victim.leaving = True
        victim.popen.send_signal(signal.SIGKILL)
        victim.popen.wait(timeout=patience(10))
        return {"pid": victim.popen.pid, "then": self.start().popen.pid}

    def sigstop(self, rng: random.Random, hold_s: float) -> Done:
        if not self.awake():
            return None
        victim = rng.choice(self.awake())
        victim.popen.send_signal(signal.SIGSTOP)
        victim.woken_at = time.monotonic() + hold_s
        if hold_s > HANG_S:
            self.faults.injected["sigstop_past_hang"] += 1
        return {"pid": victim.popen.pid, "hold_s": hold_s}

    def step_clock(self, rng: random.Random) -> Done:
        """A worker whose CLOCK_MONOTONIC and CLOCK_BOOTTIME read hours ahead
        or minutes behind the others' takes over from one that stops."""
        if not self.working():
            return None
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        behind = -int(min(uptime / 2, 600))
        offset = rng.choice([3600, 86400 * 3] + ([behind] if behind < -30 else []))
        leaver = rng.choice(self.awake() or self.working())
        started = self.start(clock_offset_s=offset)
        leaver.leaving = True
        leaver.popen.send_signal(signal.SIGTERM if leaver.woken_at is None else signal.SIGKILL)
        return {"pid": started.popen.pid, "offset_s": offset, "instead_of": leaver.popen.pid}

    def tick(self, now: float) -> None:
        """SIGCONT the workers whose stop is over; replace those that died of
        something else than the test (fenced by another worker)."""
        for member in self.members:
            alive = member.popen.poll() is None
            if member.woken_at is not None and (now >= member.woken_at or not alive):
                member.woken_at = None
                if alive:
                    member.popen.send_signal(signal.SIGCONT)
            if not alive and not member.leaving:
                member.leaving = True
                code = member.popen.returncode
                self.faults.observed[f"worker_exit_{code}"] += 1
                self.faults.log.append(
                    {
                        "at": time.time(),
                        "kind": "exit",
                        "pid": member.popen.pid,
                        "code": code,
                        "then": self.start().popen.pid,
                    }
                )

    def wake_all(self) -> None:
        self.tick(float("inf"))

    def stop_all(self) -> None:
        for member in self.members:
            member.leaving = True
            if member.popen.poll() is None:
                member.popen.send_signal(signal.SIGTERM)
        for member in self.members:
            try:
                member.popen.wait(timeout=patience(10))
            except subprocess.TimeoutExpired:
                member.popen.kill()
                member.popen.wait()

    def cleanup(self) -> None:
        for member in self.members:
            if member.popen.poll() is None:
                member.popen.kill()
                member.popen.wait()


class SmallDisk:
    """A small tmpfs under the queue's spool (root only), filled up on demand."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.path.mkdir(parents=True, exist_ok=True)
        self.why_not: str | None = None
        self.freed_at: float | None = None
        self.filler = path / "filler"
        if os.geteuid() != 0:
            self.why_not = "not root: cannot mount a small tmpfs"
            return
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={DISK}", "tmpfs", str(path)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            self.why_not = f"mount failed: {done.stderr.strip()}"

    def fill(self, hold_s: float) -> Done:
        chunk = b"\0" * (1 << 20)
        out = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            while os.write(out, chunk):
                pass
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
        finally:
            os.close(out)
        self.freed_at = time.monotonic() + hold_s
        return {"hold_s": hold_s}

    def tick(self, now: float) -> None:
        if self.freed_at is not None and now >= self.freed_at:
            self.filler.unlink(missing_ok=True)
            self.freed_at = None

    def unmount(self) -> None:
        """Unmount, keeping a copy of the queue's files beside it for a post-mortem."""
        if self.why_not is None:
            kept = self.path.with_name(f"{self.path.name}-kept")
            kept.mkdir(exist_ok=True)
            for found in self.path.glob("*.db*"):
                with contextlib.suppress(OSError):
                    shutil.copy2(found, kept / found.name)
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True)


def time_namespaces() -> str | None:
    """Why one worker's clocks cannot be stepped here (None: they can)."""
    try:
        probe = subprocess.run(
            ["unshare", "--time", "--monotonic", "1", "--boottime", "1", "true"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except OSError as exc:
        return f"no unshare: {exc}"
    return None if probe.returncode == 0 else f"unshare --time: {probe.stderr.strip()}"


@dataclass
class Chaos:
    fleet: Fleet
    disk: SmallDisk
    faults: Faults
    rng: random.Random
    extra: dict[str, Injector]
    """Faults of one backend (PostgreSQL's), by kind."""

    def kinds(self) -> dict[str, Injector]:
        stops = iter(
            [HANG_S + 2.0] + [self.rng.choice([0.5, 2.0, HANG_S + 2.0]) for _ in range(99)]
        )
        found: dict[str, Injector] = {
            "sigkill": self.fleet.sigkill,
            "sigstop": lambda rng: self.fleet.sigstop(rng, next(stops)),
            "disk_full": lambda rng: self.disk.fill(rng.choice([1.0, 3.0])),
            "clock_step": self.fleet.step_clock,
            **self.extra,
        }
        if self.disk.why_not is not None:
            self.faults.not_injected["disk_full"] = self.disk.why_not
        if (why := time_namespaces()) is not None:
            self.faults.not_injected["clock_step"] = why
        return {k: f for k, f in found.items() if k not in self.faults.not_injected}

    def run(self, submitter: Submitter) -> None:
        """Inject faults while `add` runs (every kind at least once), then wake
        every worker and free the disk."""
        kinds = self.kinds()
        order = self.rng.sample(list(kinds), len(kinds))
        weighted = [k for k in kinds for _ in range(WEIGHTS.get(k, 2))]
        began = time.monotonic()
        next_at = began + 1.0
        while True:
            now = time.monotonic()
            self.fleet.tick(now)
            self.disk.tick(now)
            if now - began > CHAOS_S[1] or (
                now - began > CHAOS_S[0] and not submitter.is_alive() and not order
            ):
                break
            if now >= next_at:
                kind = order.pop() if order else self.rng.choice(weighted)
                done = kinds[kind](self.rng)
                if done is not None:
                    self.faults.injected[kind] += 1
                    self.faults.log.append({"at": time.time(), "kind": kind, **done})
                elif not self.faults.injected[kind] and kind not in order:
                    order.insert(0, kind)  # nothing to act on yet (no session open): later
                next_at = time.monotonic() + self.rng.uniform(0.7, 1.8)
            time.sleep(0.05)
        self.fleet.wake_all()
        self.disk.tick(float("inf"))
        for kind in order:
            self.faults.not_injected[kind] = "found nothing to act on while the faults went on"


# -- one run ----------------------------------------------------------------------------


def unfinished(db: Db) -> int | None:
    """Jobs still to run, by `status --json` (None while it cannot tell)."""
    result = cli("status", db=db, json=True)
    if result.exit_code != 0:
        return None
    counts = result.data["counts"]
    return int(counts["queued"] + counts["running"] + counts["waiting"])


def dead_keys(db: Db) -> dict[str, str]:
    """The keys of jobs that ended dead, with their last error (asked once, at the end)."""
    result = cli("list", "--state", "dead", "--limit", "0", db=db, json=True)
    assert result.exit_code == 0, result.stdout + result.stderr
    found = {}
    for job in result.data["jobs"]:
        key = history.key_of(job["argv"])
        if key is not None:
            found[key] = job["last_error"] or ""
    return found


def run_history(
    name: str,
    db: Db,
    tmp_path: Path,
    disk: SmallDisk,
    env: dict[str, str],
    record_property: Callable[[str, Any], None],
    extra: dict[str, Injector] | None = None,
    faults: Faults | None = None,
) -> Figures:
    """Submit JOBS jobs to a fleet of WORKERS under faults, drain the queue,
    check the record; publish the figures, then assert on them."""
    seed = int(os.environ.get("SPOOLCTL_HISTORY_SEED") or secrets.randbelow(1 << 32))
    rng = random.Random(seed)
    folder = history.prepare(tmp_path / "history")
    faults = faults or Faults()
    fleet = Fleet(db, tmp_path, env, faults)
    submitter = Submitter(db, folder, JOBS, random.Random(rng.random()))
    began = time.monotonic()
    left: list[int | None] = [None]

    def drained() -> bool:
        fleet.tick(time.monotonic())
        left[0] = unfinished(db)
        return left[0] == 0

    try:
        submitter.start()
        for _ in range(WORKERS):
            fleet.start()
        Chaos(fleet, disk, faults, rng, extra or {}).run(submitter)
        submitter.join(timeout=patience(30))
        assert not submitter.is_alive() and submitter.error is None, submitter.error
        with contextlib.suppress(AssertionError):
            wait_for(drained, timeout=DRAIN_S, interval=0.5, what="the queue to drain")
        dead = dead_keys(db) if left[0] == 0 else {}
        fleet.stop_all()
    finally:
        fleet.cleanup()
        with open(tmp_path / "faults.jsonl", "w") as out:
            out.writelines(json.dumps(line) + "\n" for line in faults.log)
    figures = history.check(folder / history.RECORD, submitter.said, dead, faults)
    said = submitter.said
    facts = {
        "seed": seed,
        "wall_s": round(time.monotonic() - began, 1),
        "workers_started": len(fleet.members),
        "refused_adds": len(said.refused),
        "refused_codes": dict(Counter(said.refused.values())),
        "unanswered_adds": len(said.unanswered),
        "left_unfinished": left[0],
    }
    entry = history.publish(name, figures, facts)
    record_property("history", json.dumps(entry, sort_keys=True))
    print(json.dumps(entry, sort_keys=True))
    assert left[0] == 0, f"the queue never drained: {entry}"
    assert figures.lost == figures.overlaps == figures.phantoms == figures.malformed == 0, entry
    assert figures.acknowledged >= JOBS // 2, entry
    every_kind = {"sigkill", "sigstop", "disk_full", "clock_step", *(extra or {})}
    assert every_kind <= set(faults.injected) | set(faults.not_injected), entry
    return figures


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[SmallDisk]:
    disk = SmallDisk(tmp_path / "spool")
    yield disk
    for proc in STARTED_WORKERS:  # nothing of ours keeps the mount busy
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    disk.unmount()


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.timeout(200)
def test_sqlite_history_under_kills_stops_a_full_disk_and_a_clock_step(
    db: Path, tmp_path: Path, small_disk: SmallDisk, record_property: Any
) -> None:
    assert db.parent == small_disk.path
    run_history("sqlite", db, tmp_path, small_disk, {}, record_property)


# -- PostgreSQL: the same, and the server's own faults ---------------------------------


@pytest.fixture(scope="module")
def own_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PgServer]:
    """A server of this module's own, even where SPOOLCTL_TEST_PG_URL names
    one: only a server started here may be restarted."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(ENV_URL, raising=False)
        started = start_server(tmp_path_factory.mktemp("history-pg"))
    yield started
    started.stop()


def terminate_spoolctl_sessions(server: PgServer, dbname: str) -> int:
    """pg_terminate_backend every spoolctl session on the database (workers,
    their listeners, verbs); how many were ended."""
    with server.connect(dbname, autocommit=True, application_name="history-test") as conn:
        found = conn.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name IN ('spoolctl', 'spoolctl-listen')"
            " AND datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchone()
    return int(found[0]) if found else 0


def restart(server: PgServer, down_s: float) -> Done:
    """Shut the server down (fast: every session ends), keep it down a while, start it."""
    server.shut_down()
    time.sleep(down_s)  # how long the outage lasts, not a wait for anything
    server.start_again()
    return {"down_s": down_s}


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.pg
@pytest.mark.timeout(200)
def test_postgresql_history_under_the_same_and_lost_connections_and_a_server_restart(
    own_server: PgServer,
    tmp_path: Path,
    small_disk: SmallDisk,
    record_property: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Here the disk that fills up holds the workers' spool (their output
    files); the queue is in the server."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SPOOLCTL_DB", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    if not own_server.running:
        own_server.start_again()
    name = f"t_history_{secrets.token_hex(4)}"
    url = own_server.create_database(name)
    faults = Faults()

    def cut(rng: random.Random) -> Done:
        ended = terminate_spoolctl_sessions(own_server, name)
        faults.observed["sessions_terminated"] += ended
        return {"sessions": ended} if ended else None

    extra: dict[str, Injector] = {
        "conn_terminate": cut,
        "server_restart": lambda rng: restart(own_server, rng.choice([0.5, 2.0, 4.0])),
    }
    env = {"SPOOLCTL_SPOOL_DIR": str(small_disk.path)}
    try:
        run_history("postgresql", url, tmp_path, small_disk, env, record_property, extra, faults)
    finally:
        stop_started_workers()
        if not own_server.running:
            own_server.start_again()
        own_server.drop_database(name)
