"""The scenarios run against both implementations, each on a fresh queue.

A scenario is a list of steps run in order in its own folder (`{dir}` in any
argument stands for it): command lines, and file set-up (config files, folders).
Every command line is compared (see shapes.py); `pins` name the paths of
`data` whose values must match too, where the value is the meaning (counts,
states, verdicts) rather than an id, a time or a path.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

DB = "{dir}/spool/queue.db"
INT64_PAST = str(2**63)
HUGE = (str(2**64), str(10**30), INT64_PAST)
BAD_INTS = ("abc", "-1", "1.5", "", *HUGE)
BAD_IDS = ("0", "-1", "abc", "1e3", *HUGE)
BAD_SECONDS = ("abc", "-1", "nan", "inf", "1e400", str(10**30))
BAD_DURATIONS = ("abc", "-5s", "5x", "nan", "1e400", "5M", str(10**30))
STATUS_PINS = ("data.counts", "data.scheduled", "data.queues")


@dataclass(frozen=True)
class Step:
    """One command line, or one file set-up (`setup` holds the driver's step)."""

    argv: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    stdin: str = ""
    pins: tuple[str, ...] = ()
    setup: dict[str, Any] | None = None
    timeout: float = 60.0

    @property
    def as_json(self) -> bool:
        head = self.argv[: self.argv.index("--")] if "--" in self.argv else self.argv
        return "--json" in head

    @property
    def label(self) -> str:
        if self.setup is not None:
            return "setup " + " ".join(f"{k}={v}" for k, v in self.setup.items())[:80]
        env = " ".join(f"{k}={v!r}" for k, v in self.env.items())
        return (env + " " if env else "") + "spoolctl " + " ".join(self.argv)

    def plan(self) -> dict[str, Any]:
        if self.setup is not None:
            return dict(self.setup)
        return {
            "run": list(self.argv),
            "env": self.env,
            "stdin": self.stdin,
            "timeout": self.timeout,
        }


@dataclass(frozen=True)
class Scenario:
    name: str
    steps: tuple[Step, ...]


def q(verb: str, *args: str, pins: tuple[str, ...] = (), env: dict[str, str] | None = None) -> Step:
    """`spoolctl VERB --db {dir}/spool/queue.db --json ARGS...`"""
    verb_words = verb.split()
    return Step((*verb_words, "--db", DB, "--json", *args), env=env or {}, pins=pins)


def bare(*argv: str, env: dict[str, str] | None = None, pins: tuple[str, ...] = ()) -> Step:
    """A command line exactly as given (no --db, no --json added)."""
    return Step(tuple(argv), env=env or {}, pins=pins)


def file(path: str, **setup: Any) -> Step:
    return Step(setup={"path": path, **setup})


def config(text: str) -> Step:
    return file(".spoolctl/config.json", text=text)


ADD_PINS = ("data.state", "data.deduplicated", "data.queue", "data.priority")
JOB_PINS = ("data.job.state", "data.job.attempts", "data.job.queue", "data.job.priority")
FEEDBACK_PINS = (
    "data.state",
    "data.terminal",
    "data.succeeded",
    "data.exit_code",
    "data.failure_reason",
    "data.attempts",
)


def empty_queue() -> Scenario:
    """Every read-only verb on a queue file that does not exist yet."""
    return Scenario(
        "empty-queue",
        (
            q("status", pins=STATUS_PINS),
            q("list", pins=("data.count",)),
            q("show", "1"),
            q("output", "1"),
            q("feedback", "1"),
            q("events", pins=("data.count",)),
            q("wait", "1", "--timeout", "1"),
            q("wait", "1", "--timeout", "0"),
            q("retry", "1"),
            q("cancel", "1"),
            q("prune", "--older-than", "1d", "--dry-run", pins=("data.matched", "data.dry_run")),
            q("work", "--once", pins=("data.claimed",)),
            q("work", "--drain", pins=("data.executed",)),
            q("config-show"),
            q("doctor", pins=("data.ready",)),
            file("spool/queue.db", stat=True),
        ),
    )


def self_description() -> Scenario:
    """The verbs that describe the contract, and the bare command line."""
    return Scenario(
        "self-description",
        (
            bare("capabilities", "--json"),
            bare("schema", "--json"),
            *(bare("schema", "--json", "--verb", v) for v in ("add", "status", "list", "show")),
            bare("schema", "--json", "--verb", "nope"),
            bare("brief", "--json"),
            bare("robot-docs", "guide", "--json"),
            bare("robot-docs", "--json"),
            bare("robot-docs", "nope", "--json"),
            bare("brief"),
            bare("capabilities"),
            bare("--version"),
            bare("--help"),
            bare("add", "--help"),
            bare(),
            bare("--json"),
            bare("nope", "--json"),
            bare("statu", "--json"),
            bare("nope"),
            bare("status", "--jsno"),
            bare("status", "--json", "--jsno"),
            bare("add", "--json", "--prio", "3", "--", "true"),
            bare("--json", "status"),
        ),
    )


def lifecycle() -> Scenario:
    """Submit, run, inspect and steer jobs along every success path."""
    return Scenario(
        "lifecycle",
        (
            q("add", "--", "true", pins=ADD_PINS),
            q("add", "--max-retries", "0", "-c", "echo out; echo err >&2; exit 3", pins=ADD_PINS),
            q("add", "--queue", "other", "--", "true", pins=ADD_PINS),
            q("add", "--key", "k1", "--", "echo", "keyed", pins=ADD_PINS),
            q("add", "--key", "k1", "--", "echo", "keyed", pins=ADD_PINS),
            q("add", "--key", "k1", "--note", "changed", "--", "echo", "keyed", pins=ADD_PINS),
            q("add", "--key", "k1", "--", "echo", "other"),
            q("add", "--after", "1h", "--", "true", pins=ADD_PINS),
            q("add", "--at", "0", "--", "true", pins=ADD_PINS),
            q(
                "add",
                "--priority",
                "5",
                "--tag",
                "team=a",
                "--env",
                "K=V",
                "--note",
                "n",
                "--cwd",
                "{dir}",
                "--timeout",
                "30",
                "--max-crashes",
                "1",
                "--",
                "true",
                pins=ADD_PINS,
            ),
            q("list", pins=("data.count",)),
            q("list", "--state", "queued", pins=("data.count",)),
            q("list", "--tag", "team=a", pins=("data.count",)),
            q("list", "--queue", "other", pins=("data.count",)),
            q("list", "--priority-min", "1", "--limit", "2", pins=("data.count",)),
            q("list", "--tag", "team", pins=("data.count",)),
            q("list", "--tag", "nobody", pins=("data.count",)),
            q("status", pins=STATUS_PINS),
            q("show", "1", pins=JOB_PINS),
            q("show", "10"),
            q("output", "1"),
            q("feedback", "1", pins=FEEDBACK_PINS),
            q("work", "--drain", pins=("data.drained",)),
            q("work", "--queue", "other", "--drain", pins=("data.drained", "data.executed")),
            q("work", "--once", pins=("data.claimed",)),
            q("status", pins=STATUS_PINS),
            q("status", "--limit", "1", pins=STATUS_PINS),
            q("list", pins=("data.count",)),
            q("list", "--state", "done,dead", pins=("data.count",)),
            q("list", "--limit", "0", pins=("data.count",)),
            q("show", "1", pins=JOB_PINS),
            q("show", "2", pins=JOB_PINS),
            q("show", "10"),
            q("output", "2"),
            q("output", "2", "--stream", "stdout"),
            q("output", "2", "--attempt", "1"),
            q("output", "2", "--attempt", "9"),
            bare("output", "2", "--db", DB, "--raw", "--stream", "stdout"),
            q("feedback", "1", pins=FEEDBACK_PINS),
            q("feedback", "2", pins=FEEDBACK_PINS),
            q("feedback", "2", "--tail-bytes", "2", pins=FEEDBACK_PINS),
            q("events", "--limit", "0"),
            q("events", "--job", "1"),
            q("events", "--since-id", "2", "--limit", "3"),
            q("events", "--job", "999"),
            q("events", "--wait", "--wait-timeout", "0"),
            q("events", "--since-cursor", "3", "--poll-interval", "0.2"),
            q("wait", "1", "--timeout", "5", pins=("data.all_succeeded",)),
            q("wait", "1", "2", "--timeout", "5", pins=("data.all_succeeded",)),
            q("wait", "1", "99", "--timeout", "1"),
            q("retry", "2", pins=("data.state",)),
            q("retry", "1"),
            q("retry", "2"),
            q("cancel", "2", pins=("data.state", "data.was_running")),
            q("cancel", "2"),
            q("cancel", "1"),
            q("retry", "2", pins=("data.state",)),
            q("cancel", "2", "--running", "-y", pins=("data.state", "data.was_running")),
            q("prune", "--older-than", "0", pins=()),
            q("prune", "--older-than", "0", "--dry-run", pins=("data.matched", "data.dry_run")),
            q(
                "prune",
                "--older-than",
                "0",
                "--state",
                "canceled",
                "-y",
                pins=("data.matched", "data.deleted_jobs", "data.dry_run"),
            ),
            q(
                "prune",
                "--older-than",
                "0",
                "--state",
                "done,dead",
                "--yes",
                pins=("data.matched", "data.deleted_jobs", "data.dry_run"),
            ),
            q("status", pins=STATUS_PINS),
            q("doctor", pins=("data.ready",)),
            q("config-show"),
            bare("status", "--db", DB),
            bare("list", "--db", DB),
            bare("show", "1", "--db", DB),
            file("spool", stat=True),
            file("spool/queue.db", stat=True),
        ),
    )


def finished_only() -> Scenario:
    """A queue whose jobs have all finished still shows in status, with its counts."""
    return Scenario(
        "finished-only",
        (
            q("add", "--queue", "lane", "--", "true"),
            q("add", "--queue", "lane", "--max-retries", "0", "--", "false"),
            q("add", "--queue", "lane", "--", "true"),
            q("cancel", "3"),
            q("work", "--queue", "lane", "--drain", pins=("data.executed",)),
            q("status", pins=STATUS_PINS),
            q("list", "--state", "done,dead,canceled"),
            q("retry", "--force", "2"),
        ),
    )


FAST = {"SPOOLCTL_TEST_HEARTBEAT_INTERVAL": "0.2"}


def running_job() -> Scenario:
    """A job that is running: what may and may not be done to it, and the ledger as frames."""
    job_pins = ("data.job.state",)
    return Scenario(
        "running-job",
        (
            q("add", "--timeout", "60", "--", "sleep", "30"),
            Step(setup={"background": ["work", "--db", DB, "--json", "--once"], "env": FAST}),
            Step(
                setup={
                    "until": ["show", "1", "--db", DB, "--json"],
                    "path": "data.job.state",
                    "equals": "running",
                    "timeout": 20,
                }
            ),
            q("status", pins=STATUS_PINS),
            q("show", "1", pins=job_pins),
            q("list", "--state", "running", pins=("data.count",)),
            q("retry", "1"),
            q("cancel", "1"),
            q("cancel", "1", "--running"),
            q("cancel", "1", "--yes"),
            q(
                "prune",
                "--older-than",
                "0",
                "--state",
                "done,dead,canceled",
                "--yes",
                pins=("data.matched",),
            ),
            q("output", "1"),
            q("feedback", "1", pins=("data.state", "data.terminal", "data.succeeded")),
            q("wait", "1", "--timeout", "0.3"),
            q("cancel", "1", "--running", "--yes", pins=("data.state", "data.was_running")),
            q("wait", "1", "--timeout", "20", pins=("data.all_succeeded",)),
            q("show", "1", pins=job_pins),
            q("feedback", "1", pins=FEEDBACK_PINS),
            q("events", "--follow", "--since-id", "0", "--max-events", "2"),
            q("events", "--follow", "--since-id", "1000", "--idle-timeout", "0.2"),
            q("status", pins=STATUS_PINS),
        ),
    )


def add_input() -> Scenario:
    """Malformed submissions: refused with the documented code, nothing queued."""
    steps = [
        q("add"),
        q("add", "-c", ""),
        q("add", "-c", "   "),
        q("add", "-c", "x", "--", "y"),
        q("add", "echo", "-n", "hi"),
        q("add", "--", "echo", "-n", "hi"),
        q("add", "--timeout"),
        q("add", "--after", "1s", "--at", "0", "--", "true"),
        q("add", "--queue", "bad queue", "--", "true"),
        q("add", "--queue", "", "--", "true"),
        q("add", "--queue", "x" * 65, "--", "true"),
        q("add", "--tag", "novalue", "--", "true"),
        q("add", "--tag", "=v", "--", "true"),
        q("add", "--env", "=v", "--", "true"),
        q("add", "--env", "K", "--", "true"),
        q("add", "--key", "", "--", "true"),
        q("add", "--key", "a\x01b", "--", "true"),
        q("add", "--note", "n" * 10_001, "--", "true"),
        q("add", "--cwd", "", "--", "true"),
        q("add", "--at", "yesterday", "--", "true"),
    ]
    for flag in ("--timeout", "--max-retries", "--max-crashes", "--priority"):
        steps += [q("add", flag, value, "--", "true") for value in BAD_INTS]
    steps += [
        q("add", "--timeout", "0", "--", "true"),
        q("add", "--priority", str(2**31), "--", "true"),
        q("add", "--priority", str(-(2**31) - 1), "--", "true"),
        q("add", "--priority", str(2**31 - 1), "--", "true"),
        q("add", "--priority", str(-(2**31)), "--", "true"),
    ]
    steps += [q("add", "--after", value, "--", "true") for value in BAD_DURATIONS]
    steps += [q("add", "--at", value, "--", "true") for value in ("nan", "inf", "1e400")]
    steps.append(q("list", pins=("data.count",)))
    return Scenario("add-input", tuple(steps))


def id_input() -> Scenario:
    """Ids that are not ids: zero, negative, words, and beyond 64 bits."""
    steps = [q("add", "--", "true")]
    for verb in ("show", "output", "feedback", "retry", "cancel", "wait"):
        steps += [q(verb, value) for value in BAD_IDS]
        steps.append(q(verb))
    steps += [q("retry", "--force", value) for value in HUGE]
    steps += [q("cancel", "--running", "--yes", value) for value in HUGE]
    steps += [q("show", "1", "2"), q("wait", "1", "abc", "--timeout", "0")]
    steps.append(q("list", pins=("data.count",)))
    return Scenario("id-input", tuple(steps))


def option_input() -> Scenario:
    """Every bounded option of the reading and steering verbs, out of bounds."""
    steps = [q("add", "--", "true"), q("work", "--drain")]
    for verb, flag in (
        ("status", "--limit"),
        ("list", "--limit"),
        ("list", "--priority-min"),
        ("events", "--since-id"),
        ("events", "--limit"),
        ("events", "--job"),
        ("work", "--slots"),
    ):
        steps += [q(verb, flag, value) for value in BAD_INTS]
    steps += [q("output", "1", "--attempt", v) for v in ("0", *BAD_INTS)]
    steps += [q("feedback", "1", "--tail-bytes", v) for v in ("0", "65537", *BAD_INTS)]
    steps += [
        q("status", "--limit", "1001"),
        q("list", "--limit", "1001"),
        q("events", "--limit", "10001"),
        q("list", "--state", "bogus"),
        q("list", "--state", ""),
        q("list", "--queue", "bad queue"),
        q("list", "--tag", "="),
        q("output", "1", "--stream", "stdou"),
        q("output", "1", "--raw"),
        q("feedback", "1", "--stream", "x"),
        q("events", "--wait", "--follow"),
        q("work", "--once", "--drain"),
        q("work", "--worker-id", "", "--once"),
        q("work", "--queue", "bad queue", "--once"),
        q("prune"),
        q("prune", "--older-than", "1d"),
        q("prune", "--older-than", "1d", "--yes", "--dry-run"),
        q("prune", "--older-than", "1d", "--state", "queued", "--dry-run"),
        q("prune", "--older-than", "1d", "--state", "bogus", "--dry-run"),
        q("cancel", "1", "--yes"),
        q("events", "--max-events", "5"),
        q("events", "--follow", "--limit", "5"),
    ]
    steps += [q("prune", "--older-than", v, "--dry-run") for v in BAD_DURATIONS]
    for verb, flag in (
        ("wait", "--timeout"),
        ("wait", "--poll-interval"),
        ("events", "--wait-timeout"),
        ("work", "--poll-interval"),
    ):
        ids = ("1",) if verb == "wait" else ()
        steps += [
            q(verb, *ids, flag, value)
            for value in ("0" if flag.endswith("interval") else "-1", *BAD_SECONDS)
        ]
    steps += [
        q("wait", "1", "--timeout", "86401"),
        q("events", "--wait", "--wait-timeout", "86401"),
    ]
    steps.append(q("status", pins=STATUS_PINS))
    return Scenario("option-input", tuple(steps))


def config_files() -> Scenario:
    """Project config files: valid, malformed, unreadable, wrong shapes."""
    cases = {
        "valid": '{"version": 1, "db_path": "here.db"}',
        "not-json": "{nope",
        "array": "[]",
        "version-2": '{"version": 2}',
        "version-string": '{"version": "1"}',
        "db-path-number": '{"db_path": 5}',
        "db-path-empty": '{"db_path": ""}',
        "unknown-key": '{"version": 1, "colour": "blue"}',
        "empty-file": "",
    }
    steps: list[Step] = []
    for text in cases.values():
        steps += [
            config(text),
            bare("config-validate", "--json"),
            bare("config-show", "--json"),
            bare("status", "--json"),
            bare("doctor", "--json", pins=("data.ready",)),
            bare("status", "--json", "--db", "{dir}/elsewhere.db"),
            bare("config-validate", ".spoolctl/config.json", "--json"),
            bare("config-validate"),
        ]
    steps += [
        file(".spoolctl/config.json", remove=True),
        file("dir-config/config.json", mkdir=True),
        bare("config-validate", "dir-config/config.json", "--json"),
        bare("config-validate", "dir-config/config.json"),
        bare("config-validate", "missing.json", "--json"),
        bare("config-validate", "dir-config", "--json"),
    ]
    steps += [
        bare("status", "--json", env={"SPOOLCTL_DB": ""}),
        bare("status", "--json", "--db", ""),
        bare("status", "--json", env={"SPOOLCTL_DB": "{dir}/env/queue.db"}),
        bare("config-show", "--json", env={"SPOOLCTL_DB": "{dir}/env/queue.db"}),
        bare("status", "--json", "--db", "{dir}/dir-config"),
        bare("add", "--json", "--db", "{dir}/dir-config", "--", "true"),
    ]
    return Scenario("config-files", tuple(steps))


def undecodable_config() -> Scenario:
    """A config file whose bytes are not UTF-8."""
    return Scenario(
        "undecodable-config",
        (
            file(".spoolctl/config.json", hex="fffe7b7d"),
            bare("config-validate", "--json"),
            bare("config-show", "--json"),
            bare("status", "--json"),
            bare("config-validate", "--json", ".spoolctl/config.json"),
            bare("status", "--json", "--db", "{dir}/q.db"),
        ),
    )


def worker_knobs() -> Scenario:
    """Bad test knobs are refused when a worker starts."""
    steps = [q("add", "--", "true")]
    for knob in ("SPOOLCTL_TEST_HEARTBEAT_INTERVAL", "SPOOLCTL_TEST_REAP_THRESHOLD"):
        steps += [q("work", "--once", env={knob: v}) for v in ("abc", "0", "-1", "nan", "inf")]
    steps.append(q("status", pins=STATUS_PINS))
    return Scenario("worker-knobs", tuple(steps))


def timeout() -> Scenario:
    """A job that runs past its --timeout, beside one that exits 3: 0.4.11
    records no exit code for the timed-out attempt (null, everywhere it shows)."""
    ended = (
        "data.job.state",
        "data.job.last_exit_code",
        "data.job.last_failure_reason",
        *(f"data.attempts[0].{k}" for k in ("state", "exit_code", "failure_reason")),
    )
    listed = tuple(f"data.jobs[{i}].{k}" for i in (0, 1) for k in ("state", "last_exit_code"))
    waited = tuple(f"data.jobs.{i}.{k}" for i in (1, 2) for k in ("state", "last_exit_code"))
    return Scenario(
        "timeout",
        (
            q("add", "--timeout", "1", "--max-retries", "0", "--", "sleep", "30", pins=ADD_PINS),
            q("add", "--max-retries", "0", "-c", "exit 3", pins=ADD_PINS),
            q("work", "--drain", pins=("data.drained", "data.executed")),
            q("show", "1", pins=ended),
            q("show", "2", pins=ended),
            q("list", pins=("data.count", *listed)),
            q("list", "--state", "dead", pins=("data.count", *listed)),
            q("wait", "1", "2", "--timeout", "5", pins=("data.all_succeeded", *waited)),
            q("feedback", "1", pins=FEEDBACK_PINS),
            q("feedback", "2", pins=FEEDBACK_PINS),
            q("events", "--job", "1", pins=("data.count", "data.events[[]*[]].event")),
            q("status", pins=STATUS_PINS),
            bare("show", "1", "--db", DB),
            bare("feedback", "1", "--db", DB),
        ),
    )


def missing_database() -> Scenario:
    """A --db naming no database yet: in a folder that is missing too, in one
    that exists, and a file of zero bytes. doctor runs first (0.4.11's reading
    verbs create the file, ours create nothing: the stat steps show it)."""
    steps: list[Step] = [file("there", mkdir=True), file("zero/queue.db", text="")]
    for db in ("{dir}/nowhere/queue.db", "{dir}/there/queue.db", "{dir}/zero/queue.db"):
        steps += [
            bare("doctor", "--json", "--db", db, pins=("data.ready",)),
            bare("doctor", "--db", db),
            bare("status", "--json", "--db", db, pins=STATUS_PINS),
            bare("list", "--json", "--db", db, pins=("data.count",)),
            bare("show", "1", "--json", "--db", db),
            bare("status", "--db", db),
        ]
    steps += [file("nowhere", stat=True), file("there/queue.db", stat=True)]
    return Scenario("missing-database", tuple(steps))


FOREIGN_SQLITE = (
    "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT);"
    "INSERT INTO notes (body) VALUES ('not a queue');"
)
RANDOM_BYTES = random.Random(20).randbytes(4096).hex()
FOREIGN_VERBS = (
    ("status",),
    ("list",),
    ("add", "--", "true"),
    ("migrate", "--status"),
    ("doctor",),
)


def foreign_file() -> Scenario:
    """--db naming a file that is no queue: another program's SQLite database,
    and 4 KiB of random bytes. Each verb gets a fresh copy, so what it answers
    is not what an earlier verb made of the file (0.4.11 writes its tables
    into the other program's database)."""
    steps: list[Step] = []
    for kind, setup in (("sqlite", {"sqlite": FOREIGN_SQLITE}), ("random", {"hex": RANDOM_BYTES})):
        for verb, *args in FOREIGN_VERBS:
            path = f"{kind}/{verb}.db"
            pins = ("data.ready",) if verb == "doctor" else ()
            run = bare(verb, "--json", "--db", f"{{dir}}/{path}", *args, pins=pins)
            steps += [file(path, **setup), run]
    return Scenario("foreign-file", tuple(steps))


def follow() -> Scenario:
    """events --follow --json, bounded so it ends: from a --since-id it replays
    what follows it; without one it starts at the current end of the ledger
    (as `tail -f`), so on a queue with no new events it ends idle, empty."""
    kinds = ("frames[[]*[]].event", "frames[[]*[]].control.reason")
    return Scenario(
        "follow",
        (
            q("add", "--", "true"),
            q("add", "--max-retries", "0", "-c", "exit 3"),
            q("work", "--drain", pins=("data.executed",)),
            q("events", "--follow", "--since-id", "0", "--max-events", "3", pins=kinds),
            q("events", "--follow", "--since-id", "2", "--idle-timeout", "0.3", pins=kinds),
            q(
                "events",
                "--follow",
                "--since-id",
                "0",
                "--max-events",
                "100",
                "--idle-timeout",
                "0.3",
                pins=kinds,
            ),
            q("events", "--follow", "--idle-timeout", "0.3", pins=kinds),
            q("events", "--follow", "--max-events", "1", "--idle-timeout", "0.3", pins=kinds),
            q("events", "--follow", "--job", "1", "--idle-timeout", "0.3", pins=kinds),
        ),
    )


SCENARIOS: tuple[Scenario, ...] = (
    empty_queue(),
    self_description(),
    lifecycle(),
    finished_only(),
    running_job(),
    add_input(),
    id_input(),
    option_input(),
    config_files(),
    undecodable_config(),
    worker_knobs(),
    timeout(),
    missing_database(),
    foreign_file(),
    follow(),
)
