"""Shared options, parameter types and the command class of every verb.

Parameter types call the rules in `spoolctl.validate`, and describe their
bounds through `contract_info`, so `capabilities` and the docs are generated
from the same objects that parse the command line.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any, TypeVar

import click
from click.core import ParameterSource

from spoolctl import validate
from spoolctl.cli.render import SpoolUsage
from spoolctl.errors import InvalidInput

F = TypeVar("F", bound=Callable[..., Any])


class SpoolCommand(click.Command):
    """A verb: click's command plus the annotations the contract publishes.

    exclusive: pairs of parameter names that cannot be given together.
    traits: mutates / destructive / idempotent; a string says when (e.g. destructive
    "only with --running"), as 0.4.11 published it.
    examples: command lines shown in --help and the docs.
    for_people: the options that only shape what a person reads on a terminal
    (the width, a live view, the worker's job lines): `brief`, written for
    programs that read --json, leaves them out.
    """

    def __init__(
        self,
        *args: Any,
        exclusive: tuple[tuple[str, str], ...] = (),
        traits: dict[str, bool | str] | None = None,
        examples: tuple[str, ...] = (),
        for_people: tuple[str, ...] = (),
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("context_settings", {}).setdefault("help_option_names", ["-h", "--help"])
        super().__init__(*args, **kwargs)
        self.exclusive = exclusive
        self.traits = traits or {"mutates": False, "destructive": False, "idempotent": True}
        self.examples = examples
        self.for_people = for_people
        if examples and self.help is not None:
            lines = "\n".join(f"  {e}" for e in examples)
            self.help = inspect.cleandoc(self.help) + "\n\n\b\nExamples:\n" + lines

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["explicit_boundary"] = "--" in args
        rest = super().parse_args(ctx, args)
        for first, second in self.exclusive:
            if _given(ctx, first) and _given(ctx, second):
                raise SpoolUsage(
                    InvalidInput(
                        f"{_flag(self, first)} and {_flag(self, second)} cannot be used together",
                        conflicting=[_flag(self, first), _flag(self, second)],
                    )
                )
        return rest


def _given(ctx: click.Context, name: str) -> bool:
    source = ctx.get_parameter_source(name)
    if source is not ParameterSource.COMMANDLINE:
        return False
    value = ctx.params.get(name)
    return value not in (None, False, ())


def _flag(command: click.Command, name: str) -> str:
    for param in command.params:
        if param.name == name and isinstance(param, click.Option):
            return max(param.opts, key=len)
    return name


def verb(
    name: str | None = None,
    *,
    exclusive: tuple[tuple[str, str], ...] = (),
    mutates: bool = False,
    destructive: bool | str = False,
    idempotent: bool | str = True,
    examples: tuple[str, ...] = (),
    for_people: tuple[str, ...] = (),
    **kwargs: Any,
) -> Callable[[F], SpoolCommand]:
    """Declare a verb with its contract annotations."""
    return click.command(
        name,
        cls=SpoolCommand,
        exclusive=exclusive,
        traits={"mutates": mutates, "destructive": destructive, "idempotent": idempotent},
        examples=examples,
        for_people=for_people,
        **kwargs,
    )


def json_option(fn: F) -> F:
    return click.option(
        "--json", "as_json", is_flag=True, help="Print one JSON envelope on stdout."
    )(fn)


def db_option(fn: F) -> F:
    return click.option(
        "--db",
        "db",
        type=BoundedText("path", validate.LIMITS["db"]["max_length"]),
        default=None,
        help="Queue database (default: SPOOLCTL_DB, .spoolctl/config.json, ./.spoolctl/queue.db).",
    )(fn)


class _Validated(click.ParamType[Any, Any]):
    """Turns InvalidInput from a validate rule into click's usage error."""

    def check(self, value: Any) -> Any:
        raise NotImplementedError

    def contract_info(self) -> dict[str, Any]:
        """click's description of the type plus our bounds, for `capabilities`."""
        return dict(self.to_info_dict())

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return self.check(value)
        except InvalidInput as exc:
            where = (
                f"{param.get_error_hint(ctx)}: " if param is not None and ctx is not None else ""
            )
            error = InvalidInput(f"Invalid value for {where}{exc.message}", **exc.detail)
            raise SpoolUsage(error) from None


class Duration(_Validated):
    """`<number>[s|m|h|d]` or bare seconds."""

    name = "duration"

    def __init__(self, maximum: float = validate.MAX_DURATION_S) -> None:
        self.maximum = maximum

    def check(self, value: str) -> float:
        return validate.duration(value, maximum=self.maximum)

    def contract_info(self) -> dict[str, Any]:
        grammar = "<number>[s|m|h|d] or bare seconds; finite"
        return {
            **super().contract_info(),
            "min": 0,
            "max": self.maximum,
            "units": "s|m|h|d",
            "grammar": grammar,
        }


class Timestamp(_Validated):
    """Epoch seconds or ISO-8601; a past time means now."""

    name = "timestamp"

    def check(self, value: str) -> float:
        return validate.timestamp(value)

    def contract_info(self) -> dict[str, Any]:
        grammar = "epoch seconds or ISO-8601 (naive is local time); past means now"
        bound = validate.MAX_DURATION_S
        return {**super().contract_info(), "min": -bound, "max": bound, "grammar": grammar}


class Seconds(_Validated):
    """A plain float of seconds in (low, high]; finite."""

    name = "seconds"

    def __init__(self, low: float, high: float, *, low_inclusive: bool = False) -> None:
        self.low, self.high, self.low_inclusive = low, high, low_inclusive

    def check(self, value: str) -> float:
        try:
            number = float(validate.ascii_number(value, "seconds"))
        except ValueError:
            raise InvalidInput(f"expected a number of seconds, got {value!r}") from None
        low_ok = number >= self.low if self.low_inclusive else number > self.low
        if not (math.isfinite(number) and low_ok and number <= self.high):
            bound = ">=" if self.low_inclusive else ">"
            raise InvalidInput(
                f"must be finite, {bound} {self.low:g} and <= {self.high:g}, got {value!r}"
            )
        return number

    def contract_info(self) -> dict[str, Any]:
        key = "min" if self.low_inclusive else "min_exclusive"
        grammar = f"finite float {'>=' if self.low_inclusive else '>'} {self.low:g}"
        return {**super().contract_info(), key: self.low, "max": self.high, "grammar": grammar}


class BoundedInt(_Validated):
    """A whole number in [low, high]; an open end is SQLite's signed 64-bit
    range, so no number reaches the database out of range."""

    name = "integer"

    def __init__(self, low: int | None = None, high: int | None = None) -> None:
        self.low = validate.INT64_MIN if low is None else low
        self.high = validate.INT64_MAX if high is None else high

    def check(self, value: str) -> int:
        return validate.int_in_range(value, "value", self.low, self.high)

    def contract_info(self) -> dict[str, Any]:
        return {**super().contract_info(), "min": self.low, "max": self.high}


class BoundedText(_Validated):
    name = "text"

    def __init__(self, what: str, maximum: int) -> None:
        self.what, self.maximum = what, maximum

    def check(self, value: str) -> str:
        return validate.bounded_text(value, self.what, self.maximum)

    def contract_info(self) -> dict[str, Any]:
        return {
            **super().contract_info(),
            "min_length": 1,
            "max_length": self.maximum,
            "charset": "any character but NUL",
        }


class QueueName(_Validated):
    """A lane's name (or a schedule's: the same grammar). The contract
    publishes this class's name as the type of `--queue`, so it keeps the
    contract's word."""

    name = "queue"

    def check(self, value: str) -> str:
        return validate.lane_name(value)

    def contract_info(self) -> dict[str, Any]:
        return {
            **super().contract_info(),
            **validate.LIMITS["queue"],
            "charset": validate.LANE_RE.pattern,
        }


class KeyValue(_Validated):
    """KEY=VALUE, split on the first '='; the bounds are published (checked by
    validate.env_map / tag_map on the whole set)."""

    name = "key=value"

    def __init__(
        self, key_max: int, value_max: int, max_items: int | None = None, *, bare_key: bool = False
    ) -> None:
        self.key_max, self.value_max, self.max_items = key_max, value_max, max_items
        self.bare_key = bare_key

    def check(self, value: str) -> tuple[str, str | None]:
        """KEY=VALUE; a bare KEY (value None) where `bare_key` allows it (a filter)."""
        if self.bare_key and "=" not in value:
            return validate.key_value(value + "=", "value")[0], None
        return validate.key_value(value, "value")

    def contract_info(self) -> dict[str, Any]:
        info = {
            **super().contract_info(),
            "key_maximum": self.key_max,
            "value_maximum": self.value_max,
            "grammar": "K=V split on the first '='; key non-empty; no NUL",
        }
        if self.max_items is not None:
            info["maximum_items"] = self.max_items
        return info


ENV_PAIR = KeyValue(validate.ENV_KEY_MAX, validate.ENV_VALUE_MAX)
TAG_PAIR = KeyValue(validate.TAG_KEY_MAX, validate.TAG_VALUE_MAX, validate.TAG_MAX_COUNT)
TAG_FILTER = KeyValue(
    validate.TAG_KEY_MAX, validate.TAG_VALUE_MAX, validate.TAG_MAX_COUNT, bare_key=True
)


class StateList(_Validated):
    """One state or several, comma-separated (`done,dead`)."""

    name = "states"

    def __init__(self, choices: list[str]) -> None:
        self.choices = choices

    def check(self, value: str) -> tuple[str, ...]:
        states = tuple(dict.fromkeys(s.strip() for s in value.split(",")))
        unknown = [s for s in states if s not in self.choices]
        if not value.strip() or unknown:
            raise InvalidInput(
                f"states must be comma-separated from {', '.join(self.choices)}; got {value!r}"
            )
        return states

    def contract_info(self) -> dict[str, Any]:
        return {**super().contract_info(), "choices": list(self.choices), "separator": ","}

    def shell_complete(
        self, ctx: click.Context, param: click.Parameter, incomplete: str
    ) -> list[click.shell_completion.CompletionItem]:
        """The states, after any already typed (`done,de` -> `done,dead`)."""
        typed, _, last = incomplete.rpartition(",")
        prefix = typed + "," if typed else ""
        return [
            click.shell_completion.CompletionItem(prefix + state)
            for state in self.choices
            if state.startswith(last)
        ]


class Rule(_Validated):
    """A string checked by one rule of spoolctl.validate."""

    def __init__(self, name: str, rule: Callable[[str], Any], info: dict[str, Any]) -> None:
        self.name = name
        self.rule = rule
        self.info = info

    def check(self, value: str) -> Any:
        return self.rule(value)

    def contract_info(self) -> dict[str, Any]:
        return {**super().contract_info(), **self.info}


JOB_ID = BoundedInt(1, None)
JOB_ID.name = "id"
