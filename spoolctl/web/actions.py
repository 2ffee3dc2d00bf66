"""The actions: retry, cancel, pause and resume, and the requests to a running
job's worker (suspend, continue, a signal), through the same service
functions as the verbs, each ledgered with who asked (`web: user@host (pid N),
client ADDRESS`). Only with --allow-actions, only as a POSTed form whose CSRF
secret matches (the Origin checks ran in the middleware before). A request
to a running job is written and answered at once: its worker delivers it."""

from __future__ import annotations

import signal as signals
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from spoolctl import validate
from spoolctl.errors import InvalidInput
from spoolctl.services import control, lanes, schedules
from spoolctl.services.cancel import cancel
from spoolctl.services.deadletter import requeue
from spoolctl.states import ControlAction
from spoolctl.web.access import QueueAccess
from spoolctl.web.common import SIGNALS, Refused, Settings, job_id_of
from spoolctl.web.request_guard import Guard

FORM_MAX_BYTES = 16_384
REASON_MAX = 1000


def safe_next(raw: str | None, default: str) -> str:
    """A page of this server to go back to (never another site)."""
    if (
        raw is None
        or not raw.startswith("/")
        or raw.startswith("//")
        or any(c in raw for c in "\\\r\n\t")
    ):
        return default
    return raw


def with_notice(path: str, notice: str) -> str:
    return f"{path}{'&' if '?' in path else '?'}done={notice}"


class Actions:
    """The POST handlers."""

    def __init__(self, access: QueueAccess, guard: Guard, settings: Settings) -> None:
        self.access = access
        self.guard = guard
        self.settings = settings

    async def checked_form(self, request: Request) -> dict[str, str]:
        """The POSTed form, once actions are on and its CSRF secret matches."""
        if not self.settings.allow_actions:
            raise Refused(403, "actions are off: start spoolctl web with --allow-actions")
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind != "application/x-www-form-urlencoded":
            raise Refused(415, "send the form as application/x-www-form-urlencoded")
        body = bytearray()
        async for piece in request.stream():
            body += piece
            if len(body) > FORM_MAX_BYTES:
                raise Refused(413, "form too large")
        try:
            fields = parse_qs(
                body.decode("utf-8", "replace"), keep_blank_values=True, max_num_fields=16
            )
        except ValueError:
            raise Refused(400, "too many form fields") from None
        form = {key: values[-1] for key, values in fields.items()}
        if not self.guard.csrf_ok(form.get("csrf"), request.cookies.get(self.guard.csrf_cookie)):
            raise Refused(403, "the form's CSRF token does not match: reload the page, try again")
        return form

    def actor(self, request: Request) -> str:
        client = request.client.host if request.client is not None else "unknown"
        return f"{self.settings.actor}, client {client}"

    async def change(self, fn: Callable[[Any, float], Any]) -> None:
        await run_in_threadpool(self.access.write, fn)

    async def retry(self, request: Request) -> Response:
        job_id = job_id_of(request)
        form = await self.checked_form(request)
        actor = self.actor(request)
        await self.change(
            lambda conn, now: requeue(conn, job_id, force=False, now=now, actor=actor)
        )
        return RedirectResponse(
            with_notice(safe_next(form.get("next"), f"/jobs/{job_id}"), "retry"), 303
        )

    async def cancel(self, request: Request) -> Response:
        job_id = job_id_of(request)
        form = await self.checked_form(request)
        running_ok, actor = form.get("running") == "yes", self.actor(request)
        await self.change(
            lambda conn, now: cancel(conn, job_id, running_ok=running_ok, now=now, actor=actor)
        )
        return RedirectResponse(
            with_notice(safe_next(form.get("next"), f"/jobs/{job_id}"), "cancel"), 303
        )

    async def suspend(self, request: Request) -> Response:
        return await self.ask(request, ControlAction.SUSPEND)

    async def resume_job(self, request: Request) -> Response:
        """`continue` of a suspended job (`resume` names a lane's)."""
        return await self.ask(request, ControlAction.CONTINUE)

    async def signal(self, request: Request) -> Response:
        return await self.ask(request, ControlAction.SIGNAL)

    async def ask(self, request: Request, action: ControlAction) -> Response:
        """Write a request to the running job's worker (`services/control.py`);
        CONFLICT when the job is not running (or already suspended, or not)."""
        job_id = job_id_of(request)
        form = await self.checked_form(request)
        number = signal_number(form.get("signal")) if action is ControlAction.SIGNAL else None
        actor = self.actor(request)
        await self.change(
            lambda conn, now: control.request(
                conn, job_id, action, now=now, signal=number, actor=actor
            )
        )
        next_page = safe_next(form.get("next"), f"/jobs/{job_id}")
        return RedirectResponse(with_notice(next_page, action.value), 303)

    async def pause(self, request: Request) -> Response:
        lane = validate.lane_name(request.path_params["lane"])
        form = await self.checked_form(request)
        reason = form.get("reason", "").strip() or None
        if reason is not None:
            reason = validate.bounded_text(reason, "reason", REASON_MAX)
        actor = self.actor(request)
        await self.change(
            lambda conn, now: lanes.pause_lanes(conn, [lane], by=actor, reason=reason, now=now)
        )
        return RedirectResponse(with_notice(safe_next(form.get("next"), "/"), "pause"), 303)

    async def resume(self, request: Request) -> Response:
        lane = validate.lane_name(request.path_params["lane"])
        form = await self.checked_form(request)
        actor = self.actor(request)
        await self.change(lambda conn, now: lanes.resume_lanes(conn, [lane], by=actor, now=now))
        return RedirectResponse(with_notice(safe_next(form.get("next"), "/"), "resume"), 303)

    async def schedule_pause(self, request: Request) -> Response:
        name = validate.lane_name(request.path_params["name"])
        form = await self.checked_form(request)
        reason = form.get("reason", "").strip() or None
        if reason is not None:
            reason = validate.bounded_text(reason, "reason", REASON_MAX)
        reason = f"{reason or 'paused'} ({self.actor(request)})"
        await self.change(lambda conn, now: schedules.pause(conn, name, reason, now))
        next_page = safe_next(form.get("next"), "/schedules")
        return RedirectResponse(with_notice(next_page, "schedule_pause"), 303)

    async def schedule_resume(self, request: Request) -> Response:
        name = validate.lane_name(request.path_params["name"])
        form = await self.checked_form(request)
        await self.change(lambda conn, now: schedules.resume(conn, name, now))
        next_page = safe_next(form.get("next"), "/schedules")
        return RedirectResponse(with_notice(next_page, "schedule_resume"), 303)


def signal_number(name: str | None) -> int:
    """One of SIGNALS by name (with or without SIG), as its number."""
    bare = (name or "").strip().upper().removeprefix("SIG")
    if bare not in SIGNALS:
        raise InvalidInput(f"signal must be one of {', '.join(SIGNALS)}", value=name)
    return int(signals.Signals[f"SIG{bare}"])
