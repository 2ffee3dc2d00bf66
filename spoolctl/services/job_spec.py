"""A job's attributes, declared once: `FIELDS`, and `JobSpec`, what one
submission asks for.

Each `JobField` says, for one attribute: its name on `JobSpec`, its column
in `jobs` (which is also its key in `show` and `list` JSON and in a
schedule's stored job), its default, its `add` flag (the flag, its help and
the rule that reads the flag's text), its key in an `add --batch` line and
the rule that reads the line's JSON value, whether a schedule keeps it for
its occurrences (and so whether a flag given beside `--batch` is every
line's default), whether it is part of what makes two submissions under one
key the same job, whether `list` shows it, and the label people read it by.

`add` and `schedule add` build their flags from FIELDS (`cli/job_flags.py`),
`add --batch` reads its lines by it (`cli/batch.py`), a schedule stores and
reads its job by it (`services/schedules.py`), `submit` writes the row and
compares idempotent submissions by it, `list` picks its columns by it
(`services/query.py`), `schema` describes them by it (`cli/schemas.py`), and
`show` and the web's job page list the labelled ones. `copy-to` copies every
column of `jobs` as it is. Adding an attribute: a JobField here, its field on
JobSpec, its column in `db/tables.py` and a revision in `migrations/`.

The fields without a flag of their own (`Custom`: the command, the run time,
tags, env, the jobs waited for) are read by hand where they are special;
their place in FIELDS is their flags' place in `add`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from spoolctl import validate
from spoolctl.db import codec
from spoolctl.errors import InvalidInput
from spoolctl.states import JobState
from spoolctl.text import size_text

DEFAULT_TIMEOUT_S = 300
DEFAULT_MAX_RETRIES = 3
DEFAULT_LANE = "default"
DEFAULT_MAX_REQUEUES = 10
"""How many times a job is requeued on a `--requeue-exit` code unless
`--max-requeues` says otherwise: enough for a long run checkpointed at
each timeout, few enough to stop a job that only ever checkpoints."""
MAX_WEIGHT = 1024
"""`--weight`'s bound: `resources.MAX_WEIGHT`, kept here too because the lean
path cannot import resources (dataclasses); tests/unit/test_job_request.py
holds the two equal."""
GPU_MODEL_LIMITS = {"min_length": 1, "max_length": 200}
NO_GPUS = "0"
"""`--gpus 0` as kept: no GPUs, said so (a default's --gpu-model does not
make the job ask for one)."""


class Whole(NamedTuple):
    """A whole number in [low, high]; an open end (None) is, for a flag,
    SQLite's signed 64-bit range, and for a batch line no bound at all."""

    low: int | None = None
    high: int | None = None


class Checked(NamedTuple):
    """Text read by one rule of `spoolctl.validate`. `kind` and `bounds` are
    what the contract publishes of the flag; `numbers`: a batch line may
    give the value as a JSON number too."""

    kind: str
    rule: Callable[[str], Any]
    bounds: Mapping[str, Any]
    numbers: bool = False


class _Kind:
    """A reading without parameters: equal to any other of its kind."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash(type(self))

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class LaneText(_Kind):
    """A lane's name (the contract's type word `queue`)."""


class Switch(_Kind):
    """A flag without a value: given, the attribute is true."""


class Custom(_Kind):
    """Read by hand: the flags and batch keys of the command, the run time,
    tags, env and the jobs waited for are special."""


class Part(_Kind):
    """Another column of the attribute of the field before it: no flag or
    batch key of its own (`--signal-before-timeout` fills two columns)."""


class Several(NamedTuple):
    """A repeatable flag, each value a whole number in [low, high]; a batch
    line gives a JSON list. Read as the sorted distinct values (None: none)."""

    low: int
    high: int

    def collect(self, values: Any, what: str) -> list[int] | None:
        if values is None:
            return None
        if not isinstance(values, list | tuple):
            raise InvalidInput(f"{what} must be a list of whole numbers, got {values!r:.40}")
        read = {validate.int_in_range(v, what, self.low, self.high) for v in values}
        return sorted(read) or None


Reading = Whole | Checked | LaneText | Switch | Custom | Part | Several


class JobField(NamedTuple):
    name: str
    """The attribute on JobSpec."""
    reading: Reading
    """How a flag's text and a batch line's value are read."""
    default: Any = None
    column: str | None = ""
    """Its column in `jobs` (empty: `name`); None for what is stored
    otherwise (the run time is next_run_at, the jobs waited for are rows of
    job_dependencies)."""
    json: str = "integer"
    """The JSON Schema type of its column's value in `show` and `list`."""
    flag: str = ""
    """`add`'s flag; empty for a Custom field."""
    help: str = ""
    batch: str = ""
    """Its key in a batch line (default: the flag's name with `_` for `-`)."""
    scheduled: bool = True
    """A schedule keeps it for its occurrences, and the flag given beside
    `--batch` is every line's default. An idempotency key names one job: no."""
    identity: bool = False
    """Two submissions under one key must agree on it (else IDEMPOTENCY_CONFLICT)."""
    listed: bool = False
    """`list` shows it (`show` shows every column)."""
    label: str = ""
    """Where set: the line `show`'s text and the web's job page list it under
    (the attributes before labels are laid out by hand there)."""
    stored: Callable[[Any], Any] | None = None
    """Its value as its column holds it (default: as it is)."""
    describe: Callable[[Mapping[str, Any]], Any] | None = None
    """Where labelled: its value as people read it, from the job row (as
    `show` reads it); default: its column's value."""

    @property
    def key(self) -> str:
        """Its column, which is also its key in JSON, in a stored schedule and
        the name of its parameter in the contract."""
        return self.column or self.name

    @property
    def line_key(self) -> str:
        return self.batch or self.flag.removeprefix("--").replace("-", "_")

    def value_of(self, line: Mapping[str, Any]) -> Any:
        """The attribute from a batch line, by the same rule as the flag (the
        default where the line is silent)."""
        key = self.line_key
        if key not in line or (line[key] is None and self.default is None):
            return self.default
        raw, reading = line[key], self.reading
        if isinstance(reading, Whole):
            return validate.int_in_range(raw, key, reading.low, reading.high)
        if isinstance(reading, Checked):
            return reading.rule(str(raw) if reading.numbers else text(raw))
        if isinstance(reading, LaneText):
            return validate.lane_name(text(raw))
        if isinstance(reading, Switch):
            if not isinstance(raw, bool):
                raise InvalidInput(f"{key} must be true or false")
            return raw
        if isinstance(reading, Several):
            return reading.collect(raw, key)
        raise AssertionError(f"{self.name} is read by hand")


def text(value: Any) -> str:
    """A batch line's value that must be a JSON string."""
    if not isinstance(value, str):
        raise InvalidInput(f"expected a string, got {value!r:.40}")
    return value


FIELDS: tuple[JobField, ...] = (
    JobField("argv", Custom(), json="array", identity=True, listed=True, stored=codec.dumps),
    JobField(
        "timeout_seconds",
        Checked("timeout", validate.timeout_seconds, validate.LIMITS["timeout_seconds"], True),
        DEFAULT_TIMEOUT_S,
        flag="--timeout",
        help="Seconds (or a duration: 90m, 1h30m) before the job's process group is killed; "
        "none or 0: never.",
        identity=True,
        listed=True,
    ),
    JobField(
        "max_retries",
        Whole(0),
        DEFAULT_MAX_RETRIES,
        flag="--max-retries",
        help="Job-owned failures retried before dead.",
        identity=True,
        listed=True,
    ),
    JobField(
        "max_crashes",
        Whole(0),
        flag="--max-crashes",
        help="Worker crashes tolerated before dead (default: unbounded).",
        identity=True,
    ),
    JobField(
        "priority",
        Whole(validate.INT32_MIN, validate.INT32_MAX),
        0,
        flag="--priority",
        help="Higher runs first.",
        identity=True,
        listed=True,
    ),
    JobField(
        "lane",
        LaneText(),
        DEFAULT_LANE,
        column="queue",
        json="string",
        flag="--queue",
        help="The lane the job waits in.",
        identity=True,
        listed=True,
    ),
    JobField("run_at", Custom(), column=None, scheduled=False),
    JobField(
        "idempotency_key",
        Checked("key", validate.idempotency_key, validate.LIMITS["key"]),
        json="string",
        flag="--key",
        help="Idempotency key among active jobs.",
        scheduled=False,
        listed=True,
    ),
    JobField("tags", Custom(), {}, json="object", listed=True, stored=codec.dumps),
    JobField(
        "note",
        Checked("note", validate.note, validate.LIMITS["note"]),
        json="string",
        flag="--note",
        help="Free text for people.",
        listed=True,
    ),
    JobField(
        "cwd",
        Checked("path", validate.cwd, validate.LIMITS["cwd"]),
        json="string",
        flag="--cwd",
        help="Working directory of the job (`add` checks it exists where the queue is SQLite).",
        identity=True,
        listed=True,
    ),
    JobField("env", Custom(), {}, json="object", identity=True, stored=codec.dumps),
    JobField("after_jobs", Custom(), (), column=None, scheduled=False),
    JobField("after_jobs_any", Custom(), (), column=None, scheduled=False),
    JobField(
        "memory_bytes",
        Checked("size", validate.memory_size, validate.LIMITS["memory_bytes"], True),
        flag="--memory",
        help="Memory of each attempt (512M, 2G): held of a worker's memory budget where it "
        "has one, and its cgroup's limit (over it, OOM-killed).",
        label="memory",
    ),
    JobField(
        "cpus",
        Checked("cpus", validate.cpus, validate.LIMITS["cpus"], True),
        json="number",
        flag="--cpus",
        help="CPU limit of each attempt (0.5, 2) through its cgroup.",
        label="cpus",
    ),
    JobField(
        "require_limits",
        Switch(),
        False,
        flag="--require-limits",
        help="Only a worker that can enforce --memory/--cpus claims the job.",
        stored=lambda required: 1 if required else None,
    ),
    JobField(
        "weight",
        Whole(1, MAX_WEIGHT),
        1,
        flag="--weight",
        help=f"Slots of a worker the job takes (1-{MAX_WEIGHT}): it starts where that many "
        "are free.",
        listed=True,
        label="needs",
        stored=lambda weight: None if weight == 1 else weight,
        describe=lambda job: needs_text(job),
    ),
    JobField(
        "gpus",
        Checked(
            "gpus", lambda raw: gpus_kept(raw), {"devices_max": 64, "share_divisor_max": 16}, True
        ),
        json="string",
        flag="--gpus",
        help="GPUs the job takes: whole devices (1, 2) or a share of one (0.5, 1/3); 0: none. "
        "It sees only those (CUDA_VISIBLE_DEVICES).",
        listed=True,
        stored=lambda kept: gpus_parts(kept)[0] or None,
    ),
    JobField(
        "gpus",
        Part(),
        column="gpu_share",
        scheduled=False,  # the schedule keeps --gpus once, with the field before
        stored=lambda kept: gpu_share_of(kept),
    ),
    JobField(
        "gpu_memory_bytes",
        Checked("size", lambda raw: gpu_memory(raw), validate.LIMITS["memory_bytes"], True),
        flag="--gpu-memory",
        help="Only GPUs with at least this much memory (40G); without --gpus: --gpus 1.",
        listed=True,
    ),
    JobField(
        "gpu_model",
        Checked("text", lambda raw: gpu_model(raw), GPU_MODEL_LIMITS),
        json="string",
        flag="--gpu-model",
        help="Only GPUs whose model matches (A100, *H100*; no case); without --gpus: --gpus 1.",
        listed=True,
    ),
    JobField(
        "signal_before_timeout",
        Checked("signal_at", validate.timeout_warning, validate.LIMITS["signal_before_timeout"]),
        json="string",
        flag="--signal-before-timeout",
        help="SIG@DURATION (USR1@2m): send SIG to the job that long before its timeout, once.",
        identity=True,
        label="warning",
        stored=lambda kept: None if kept is None else validate.warning_parts(kept)[0],
        describe=lambda job: (
            f"{job['signal_before_timeout']} {job['signal_before_timeout_s']}s before the timeout"
        ),
    ),
    JobField(
        "signal_before_timeout",
        Part(),
        column="signal_before_timeout_s",
        scheduled=False,  # the schedule keeps the attribute once, with the field before
        identity=True,
        stored=lambda kept: None if kept is None else validate.warning_parts(kept)[1],
    ),
    JobField(
        "requeue_exits",
        Several(1, 255),
        json="array",
        flag="--requeue-exit",
        help="Exit code (1-255) that requeues the job at once, its retries kept (repeatable).",
        batch="requeue_exits",
        identity=True,
        label="requeue",
        stored=lambda codes: None if not codes else codec.dumps(codes),
        describe=lambda job: (
            f"on exit {', '.join(map(str, job['requeue_exits'] or []))}: "
            f"{job['requeues']} of {max_requeues_of(job['max_requeues'])} requeues"
        ),
    ),
    JobField(
        "max_requeues",
        Whole(0),
        flag="--max-requeues",
        help=f"Requeues on a --requeue-exit code before it counts as a failure "
        f"(default {DEFAULT_MAX_REQUEUES}).",
        identity=True,
    ),
)
"""Every attribute a submission sets, in the order of `add`'s flags."""

BY_NAME = {f.name: f for f in FIELDS if not isinstance(f.reading, Part)}
STORED = tuple(f for f in FIELDS if f.column is not None)
"""The attributes with a column of their own in `jobs`."""
ROW_COLUMNS = (*(f.key for f in STORED), "state", "next_run_at", "created_at")
"""The columns a submission writes (`JobSpec.row`)."""
FLAGGED = tuple(f for f in FIELDS if f.flag)
"""The attributes read from a flag (and a batch key) of their own, by FIELDS' rules."""
SCHEDULED = tuple(f for f in FIELDS if f.scheduled)
IDENTITY = tuple(f.key for f in FIELDS if f.identity)
"""The columns that make two submissions under one key the same job."""
LISTED = tuple(f.key for f in FIELDS if f.listed)
LABELLED = tuple(f for f in FIELDS if f.label)


def labelled(job: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """(label, value) of each labelled attribute a job row (as `show` reads
    it) sets: what `show`'s text and the web's job page list."""
    found = [
        (f.label, job[f.key] if f.describe is None else f.describe(job))
        for f in LABELLED
        if job.get(f.key) is not None
    ]
    return [(label, value) for label, value in found if value is not None]


def gpus_kept(raw: str) -> str:
    """`--gpus` as a job keeps it: as `resources.gpus_text` writes it ("2",
    "0.5", "1/3"), NO_GPUS for none; a malformed one is INVALID_INPUT naming
    the flag. resources is imported only for a job that gives --gpus (the
    lean path of a plain `add` stays without dataclasses)."""
    from spoolctl.resources import BadRequest, gpus_text, parse_gpus

    try:
        devices, share = parse_gpus(raw)
    except BadRequest as exc:
        raise InvalidInput(str(exc), field="gpus", value=raw) from None
    return gpus_text(devices, share) or NO_GPUS


def gpus_parts(kept: str | None) -> tuple[int, int]:
    """Kept --gpus as (devices, share divisor k): (0, 1) for none."""
    if kept is None or kept == NO_GPUS:
        return 0, 1
    from spoolctl.resources import parse_gpus

    return parse_gpus(kept)


def gpu_share_of(kept: str | None) -> int | None:
    """Kept --gpus as its `gpu_share` column: k for a 1/k share, None for whole."""
    share = gpus_parts(kept)[1]
    return share if share > 1 else None


def gpu_memory(raw: str) -> int:
    """`--gpu-memory`: a size, by `--memory`'s rule."""
    try:
        return validate.memory_size(raw)
    except InvalidInput as exc:
        raise InvalidInput(f"gpu {exc.message}", field="gpu_memory", **exc.detail) from None


def gpu_model(raw: str) -> str:
    """`--gpu-model`: a pattern of GPU model names (`resources.model_matches`)."""
    return validate.bounded_text(raw, "gpu model", GPU_MODEL_LIMITS["max_length"])


def needs_text(job: Mapping[str, Any]) -> str | None:
    """What a job asks of a worker beyond one slot and its memory, as `show`
    reads it (`2 GPUs (model A100, 40G memory), weight 2`); None: nothing."""
    parts = []
    gpus = job.get("gpus")
    if gpus:
        kind = []
        if job.get("gpu_model") is not None:
            kind.append(f"model {job['gpu_model']}")
        if job.get("gpu_memory_bytes") is not None:
            kind.append(f"{size_text(job['gpu_memory_bytes'])} memory")
        amount = {"1": "1 GPU"}.get(gpus) or (
            f"{gpus} GPUs" if gpus.isdigit() else f"{gpus} of a GPU"
        )
        parts.append(amount + (f" ({', '.join(kind)})" if kind else ""))
    weight = job.get("weight") or 1
    if weight != 1:
        parts.append(f"weight {weight}")
    return ", ".join(parts) or None


def max_requeues_of(stored: int | None) -> int:
    """A job's bound on requeues (`--max-requeues`; null: the default)."""
    return DEFAULT_MAX_REQUEUES if stored is None else stored


class JobSpec(NamedTuple):
    """One submission: the attributes of FIELDS (with their defaults), and
    in a batch the earlier lines a job waits for."""

    argv: list[str]
    lane: str = DEFAULT_LANE
    priority: int = 0
    timeout_seconds: int = DEFAULT_TIMEOUT_S
    max_retries: int = DEFAULT_MAX_RETRIES
    max_crashes: int | None = None
    run_at: float | None = None
    idempotency_key: str | None = None
    tags: dict[str, str] = {}  # noqa: RUF012 (shared: a spec is never changed in place)
    note: str | None = None
    cwd: str | None = None
    env: dict[str, str] = {}  # noqa: RUF012 (shared: a spec is never changed in place)
    after_jobs: tuple[int, ...] = ()
    """Jobs that must be done before this one is claimable (--after-job)."""
    after_lines: tuple[int, ...] = ()
    """In a batch: positions of earlier specs this one waits for, resolved to
    their ids at insert time."""
    after_jobs_any: tuple[int, ...] = ()
    """Jobs that must have ended, in any way, before this one is claimable
    (--after-job-any)."""
    after_lines_any: tuple[int, ...] = ()
    """In a batch: the same, as positions of earlier specs."""
    memory_bytes: int | None = None
    cpus: float | None = None
    """The job's limits (--memory, --cpus), set through its attempt's cgroup."""
    require_limits: bool = False
    """Only a worker that can enforce the limits claims the job."""
    signal_before_timeout: str | None = None
    """--signal-before-timeout as kept: `SIGUSR1@120` (`validate.warning_parts`)."""
    requeue_exits: list[int] | None = None
    """--requeue-exit: the exit codes that requeue the job (sorted, distinct)."""
    max_requeues: int | None = None
    """--max-requeues (None: DEFAULT_MAX_REQUEUES)."""
    weight: int = 1
    """--weight: the worker's slots it takes."""
    gpus: str | None = None
    """--gpus as kept (`gpus_kept`): "2", "0.5", "1/3", NO_GPUS; None: not given."""
    gpu_memory_bytes: int | None = None
    gpu_model: str | None = None
    """--gpu-memory, --gpu-model: which devices it may take (with --gpus)."""

    def check(self) -> JobSpec:
        """The spec, where its attributes agree with each other (INVALID_INPUT
        where not): a warning before the timeout needs a timeout longer than
        it; --max-requeues needs --requeue-exit. --gpu-memory or --gpu-model
        without --gpus asks for one GPU; with --gpus 0 they are dropped (no
        device to qualify)."""
        if self.signal_before_timeout is not None:
            _, before_s = validate.warning_parts(self.signal_before_timeout)
            if self.timeout_seconds == validate.NO_TIMEOUT:
                raise InvalidInput(
                    "--signal-before-timeout needs a timeout: this job has none (--timeout none)",
                    field="signal_before_timeout",
                )
            if before_s >= self.timeout_seconds:
                raise InvalidInput(
                    f"--signal-before-timeout must come before the timeout: {before_s}s "
                    f"is not shorter than the job's timeout of {self.timeout_seconds}s",
                    field="signal_before_timeout",
                    value=before_s,
                )
        if self.max_requeues is not None and not self.requeue_exits:
            raise InvalidInput(
                "--max-requeues bounds the requeues of --requeue-exit: give one or more "
                "--requeue-exit CODE with it",
                field="max_requeues",
            )
        qualified = self.gpu_memory_bytes is not None or self.gpu_model is not None
        if qualified and self.gpus == NO_GPUS:
            return self._replace(gpu_memory_bytes=None, gpu_model=None)
        if qualified and self.gpus is None:
            return self._replace(gpus="1")
        return self

    def row(self, now: float) -> dict[str, Any]:
        """The job's row in `jobs`, queued (due at its run time, or now)."""
        values = {f.key: (f.stored or _as_is)(getattr(self, f.name)) for f in STORED}
        return {
            **values,
            "state": JobState.QUEUED.value,
            "next_run_at": now if self.run_at is None else max(self.run_at, now),
            "created_at": now,
        }

    def scheduled(self) -> dict[str, Any]:
        """What a schedule keeps of it, by column: its occurrences' job."""
        return {f.key: getattr(self, f.name) for f in SCHEDULED}

    @classmethod
    def of_scheduled(cls, values: Mapping[str, Any]) -> JobSpec:
        """The job a schedule keeps; an attribute it lacks (declared after the
        schedule was stored) takes its default."""
        return cls(**{f.name: values.get(f.key, f.default) for f in SCHEDULED})


def _as_is(value: Any) -> Any:
    return value
