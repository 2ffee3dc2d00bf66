"""What the dashboard's pages and actions share: its settings, refusals, and
numbers read from a request (bounded like the CLI's)."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import Request

from spoolctl import validate

SIGNALS = ("TERM", "INT", "HUP", "USR1", "USR2")
"""The signals a running job's page offers to send (`spoolctl signal` sends
any other)."""


class Refused(Exception):
    """A request the dashboard will not serve, with its HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Settings:
    allow_actions: bool
    actor: str
    """Who the ledger says acted: `web: user@host (pid N)`; the client's address is added."""


def whole_number(raw: str | None, what: str, low: int = 1) -> int | None:
    if raw is None or raw == "":
        return None
    return validate.int_in_range(raw, what, low, validate.INT64_MAX)


def job_id_of(request: Request) -> int:
    found = whole_number(request.path_params["job_id"], "job id")
    assert found is not None  # the route matched a non-empty segment
    return found
