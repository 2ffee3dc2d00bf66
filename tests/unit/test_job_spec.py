"""The one declaration of a job's attributes (spoolctl/services/job_spec.py)
agrees with JobSpec, the schema, `add`'s and `schedule add`'s flags, batch
lines and a schedule's stored job: an attribute added there reaches them all."""

from __future__ import annotations

import time
from types import SimpleNamespace

import click
import pytest

from spoolctl.cli.batch import BATCH_FIELDS, spec_from_object
from spoolctl.cli.contract import verb_commands
from spoolctl.db.tables import jobs
from spoolctl.errors import InvalidInput
from spoolctl.services import job_spec
from spoolctl.services.job_spec import FIELDS, FLAGGED, SCHEDULED, STORED, JobSpec
from spoolctl.services.schedules import job_json, job_of

SAMPLES = {
    "timeout_seconds": ("90", 90),
    "max_retries": ("7", 7),
    "max_crashes": ("2", 2),
    "priority": ("-4", -4),
    "lane": ("gpu", "gpu"),
    "idempotency_key": ("k1", "k1"),
    "note": ("a note", "a note"),
    "cwd": ("/tmp", "/tmp"),
    "memory_bytes": ("512M", 512 << 20),
    "cpus": ("1.5", 1.5),
    "signal_before_timeout": ("usr1@1m30s", "SIGUSR1@90"),
    "max_requeues": ("5", 5),
    "weight": ("3", 3),
    "gpus": ("1/2", "0.5"),
    "gpu_memory_bytes": ("40G", 40 << 30),
    "gpu_model": ("A100", "A100"),
}
"""A flag's text and the value it reads to, per declared attribute with a value."""


def test_jobspec_has_exactly_the_declared_attributes() -> None:
    names = set(JobSpec._fields)
    assert names - {"after_lines", "after_lines_any"} == {f.name for f in FIELDS}
    defaults = JobSpec._field_defaults
    for field in FIELDS:
        if field.name != "argv":
            assert defaults[field.name] == field.default, field.name


def test_every_stored_attribute_has_its_column() -> None:
    assert {f.key for f in STORED} <= set(jobs.c.keys())
    row = JobSpec(["true"]).row(1.0)
    assert set(row) <= set(jobs.c.keys())


def options_of(verb: str) -> dict[str, click.Option]:
    command = verb_commands()[verb]
    return {p.name or "": p for p in command.params if isinstance(p, click.Option)}


@pytest.mark.parametrize("field", FLAGGED, ids=lambda f: f.name)
def test_each_flag_is_add_s_and_a_schedule_s_as_declared(field: job_spec.JobField) -> None:
    """add takes every declared flag, schedule add the scheduled ones, under
    the parameter name the contract publishes (the column)."""
    option = options_of("add")[field.key]
    assert option.opts == [field.flag] and option.help == field.help
    assert (field.key in options_of("schedule add")) == field.scheduled
    assert field.line_key in BATCH_FIELDS


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_a_batch_line_reads_an_attribute_as_its_flag_does(name: str) -> None:
    field = job_spec.BY_NAME[name]
    raw, value = SAMPLES[name]
    option = options_of("add")[field.key]
    assert option.type.convert(raw, option, None) == value
    line = {"argv": ["true"], field.line_key: raw}
    assert getattr(spec_from_object(line, time.time()), name) == value


def test_the_samples_cover_every_attribute_read_from_a_value() -> None:
    one_value = (job_spec.Switch, job_spec.Several)
    valued = {f.name for f in FLAGGED if not isinstance(f.reading, one_value)}
    assert valued == set(SAMPLES)


def test_a_repeatable_flag_and_a_batch_line_s_list_read_alike() -> None:
    """--requeue-exit 75 --requeue-exit 3 --requeue-exit 75 and a line's
    "requeue_exits": [75, 3, 75] are both the sorted distinct codes."""
    several = [f for f in FLAGGED if isinstance(f.reading, job_spec.Several)]
    assert [f.name for f in several] == ["requeue_exits"]
    option = options_of("add")["requeue_exits"]
    assert option.multiple and option.callback is not None
    read = option.callback(None, option, (75, 3, 75))  # type: ignore[call-arg]
    line = {"argv": ["true"], "requeue_exits": [75, 3, 75]}
    assert read == spec_from_object(line, time.time()).requeue_exits == [3, 75]
    assert option.callback(None, option, ()) is None  # type: ignore[call-arg]
    for bad in ([0], [256], ["x"], 75):
        with pytest.raises(InvalidInput):
            spec_from_object({"argv": ["true"], "requeue_exits": bad}, time.time())


def test_a_warning_is_kept_in_two_columns_and_checked_against_the_timeout() -> None:
    row = JobSpec(["true"], timeout_seconds=60, signal_before_timeout="SIGUSR1@30").row(1.0)
    assert (row["signal_before_timeout"], row["signal_before_timeout_s"]) == ("SIGUSR1", 30)
    assert JobSpec(["true"]).row(1.0)["signal_before_timeout_s"] is None
    for timeout in (0, 30, 10):
        with pytest.raises(InvalidInput):
            JobSpec(["true"], timeout_seconds=timeout, signal_before_timeout="SIGUSR1@30").check()
    with pytest.raises(InvalidInput):
        JobSpec(["true"], max_requeues=3).check()
    JobSpec(["true"], max_requeues=3, requeue_exits=[75]).check()


def test_a_schedule_keeps_its_job_s_scheduled_attributes() -> None:
    values = {name: value for name, (_, value) in SAMPLES.items()}
    spec = JobSpec(
        argv=["echo", "hi"],
        tags={"team": "ops"},
        env={"A": "1"},
        require_limits=True,
        requeue_exits=[3, 75],
        **{k: v for k, v in values.items() if job_spec.BY_NAME[k].scheduled},
    )
    kept = job_of(SimpleNamespace(job=job_json(spec), name="s"))
    assert kept == spec
    assert set(spec.scheduled()) == {f.key for f in SCHEDULED}
    assert "queue" in spec.scheduled() and "lane" not in spec.scheduled()


def test_a_labelled_attribute_is_listed_by_its_label(monkeypatch: pytest.MonkeyPatch) -> None:
    """What `show`'s text and the web's job page list (no attribute has a label yet)."""
    weight = job_spec.JobField("weight", job_spec.Whole(1, 9), label="Weight")
    monkeypatch.setattr(job_spec, "LABELLED", (weight,))
    assert job_spec.labelled({"weight": 3, "queue": "x"}) == [("Weight", 3)]
    assert job_spec.labelled({"weight": None}) == []
