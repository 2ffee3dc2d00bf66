"""The dashboard's routes: pages, the fragments and JSON their script polls to
stay live, and the actions (retry, cancel, pause, resume) when allowed."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from spoolctl import validate
from spoolctl.errors import (
    Conflict,
    InvalidInput,
    Locked,
    MissingRequired,
    NotFound,
    SafetyBlock,
    SpoolError,
)
from spoolctl.services import lanes
from spoolctl.services.cancel import cancel
from spoolctl.services.deadletter import requeue
from spoolctl.web import views
from spoolctl.web.access import QueueAccess
from spoolctl.web.guard import SECURITY_HEADERS, Guard
from spoolctl.web.render import make_environment

log = logging.getLogger("spoolctl.web")
STATIC = Path(__file__).parent / "static"
FORM_MAX_BYTES = 16_384
REASON_MAX = 1000
NOTICES = {
    "retry": "Retried: the job is back in the queue with a fresh budget.",
    "cancel": "Canceled.",
    "pause": "Lane paused: workers stop claiming from it; running jobs finish.",
    "resume": "Lane resumed.",
}
JOB_PARTS = {"head": "_job_head.html", "history": "_job_history.html"}
"""The parts of a job page its script refreshes while the job is not finished."""
STATUS_OF: dict[type[SpoolError], int] = {
    InvalidInput: 400, MissingRequired: 400, NotFound: 404, SafetyBlock: 403, Conflict: 409,
    Locked: 503,
}  # fmt: skip


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


def partial(request: Request) -> bool:
    return request.query_params.get("partial") == "1"


def whole_number(raw: str | None, what: str, low: int = 1) -> int | None:
    if raw is None or raw == "":
        return None
    return validate.int_in_range(raw, what, low, validate.INT64_MAX)


def job_id_of(request: Request) -> int:
    found = whole_number(request.path_params["job_id"], "job id")
    assert found is not None  # the route matched a non-empty segment
    return found


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


class Dashboard:
    """The handlers, around one queue, one guard and the settings."""

    def __init__(self, access: QueueAccess, guard: Guard, settings: Settings) -> None:
        self.access = access
        self.guard = guard
        self.settings = settings
        self.env = make_environment()

    # -- responses -----------------------------------------------------------------

    def page(self, request: Request, template: str, status: int = 200, **context: Any) -> Response:
        html = self.env.get_template(template).render(
            path=request.url.path,
            queue_display=self.access.display,
            actions=self.settings.allow_actions,
            csrf=self.guard.csrf,
            notice=NOTICES.get(request.query_params.get("done", "")),
            **context,
        )
        response = HTMLResponse(html, status)
        response.set_cookie(
            self.guard.csrf_cookie, self.guard.csrf, httponly=True, samesite="strict", path="/"
        )
        return response

    def error_page(self, request: Request, status: int, message: str) -> Response:
        return self.page(
            request, "error.html", status, title=str(status), code=status, message=message, now=None
        )

    # -- pages ---------------------------------------------------------------------

    async def overview(self, request: Request) -> Response:
        data = await run_in_threadpool(self.read_overview)
        template = "_overview.html" if partial(request) else "overview.html"
        return self.page(request, template, title="Overview", **data)

    def read_overview(self) -> dict[str, Any]:
        now = self.access.now()
        return self.access.read(lambda conn: views.overview(conn, now), views.empty_overview(now))

    async def jobs(self, request: Request) -> Response:
        params = {k: request.query_params.getlist(k) for k in request.query_params}
        filters = views.parse_filters(params)
        empty: dict[str, Any] = {"jobs": [], "pagination": {"cursor": 0, "truncated": False}}
        data = await run_in_threadpool(
            self.access.read, lambda conn: views.job_list(conn, filters), empty
        )
        now = await run_in_threadpool(self.access.now)
        return self.page(request, "jobs.html", title="Jobs", filters=filters, now=now, **data)

    async def job(self, request: Request) -> Response:
        job_id = job_id_of(request)
        attempt = whole_number(request.query_params.get("attempt"), "attempt")
        detail, now = await run_in_threadpool(self.read_job, job_id, attempt)
        if detail is None:
            raise NotFound(f"no job {job_id}", job_id=job_id)
        part = request.query_params.get("partial")
        template = JOB_PARTS.get(part or "", "job.html")
        return self.page(request, template, title=f"Job {job_id}", now=now, **detail)

    def read_job(self, job_id: int, attempt: int | None) -> tuple[dict[str, Any] | None, float]:
        now = self.access.now()
        root, stored = self.access.output_root, self.access.is_postgres
        if root is None:
            return None, now
        detail = self.access.read(
            lambda conn: views.job_page(conn, job_id, attempt, root, stored), None
        )
        return detail, now

    async def output(self, request: Request) -> Response:
        job_id = job_id_of(request)
        attempt = whole_number(request.query_params.get("attempt"), "attempt")
        offset = whole_number(request.query_params.get("offset"), "offset", 0) or 0
        stream = request.query_params.get("stream", "stdout")
        if stream not in ("stdout", "stderr"):
            raise InvalidInput("stream must be stdout or stderr")
        root, stored = self.access.output_root, self.access.is_postgres
        if root is None:
            raise NotFound(f"no job {job_id}", job_id=job_id)
        chunk = await run_in_threadpool(
            self.access.read,
            lambda conn: views.output_chunk(conn, job_id, attempt, stream, offset, root, stored),
            None,
        )
        return JSONResponse(chunk)

    async def events(self, request: Request) -> Response:
        before = whole_number(request.query_params.get("before"), "before")
        job_id = whole_number(request.query_params.get("job"), "job")
        empty: dict[str, Any] = {"events": [], "older": None, "cursor": 0}
        data = await run_in_threadpool(
            self.access.read, lambda conn: views.events_page(conn, before, job_id), empty
        )
        now = await run_in_threadpool(self.access.now)
        return self.page(
            request, "events.html", title="Events", before=before, job=job_id, now=now, **data
        )

    async def events_live(self, request: Request) -> Response:
        cursor = whole_number(request.query_params.get("cursor"), "cursor", 0) or 0
        job_id = whole_number(request.query_params.get("job"), "job")
        data = await run_in_threadpool(
            self.access.read,
            lambda conn: views.events_after(conn, cursor, job_id),
            {"events": [], "cursor": cursor},
        )
        rows = self.env.get_template("_event_rows.html").render(events=data["events"])
        return JSONResponse({"cursor": data["cursor"], "count": len(data["events"]), "html": rows})

    async def login(self, request: Request) -> Response:
        if not self.guard.redeem(request.query_params.get("once")):
            raise Refused(
                401,
                "this login link is wrong or was already used: restart spoolctl web for a new "
                "one, or send the token as 'Authorization: Bearer TOKEN'",
            )
        response = RedirectResponse("/", 303)
        response.set_cookie(
            self.guard.session_cookie, self.guard.session, httponly=True, samesite="strict",
            path="/",
        )  # fmt: skip
        return response

    # -- actions -------------------------------------------------------------------

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
            fields = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True,
                              max_num_fields=16)  # fmt: skip
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
        return RedirectResponse(with_notice(safe_next(form.get("next"), f"/jobs/{job_id}"),
                                            "retry"), 303)  # fmt: skip

    async def cancel(self, request: Request) -> Response:
        job_id = job_id_of(request)
        form = await self.checked_form(request)
        running_ok, actor = form.get("running") == "yes", self.actor(request)
        await self.change(
            lambda conn, now: cancel(conn, job_id, running_ok=running_ok, now=now, actor=actor)
        )
        return RedirectResponse(with_notice(safe_next(form.get("next"), f"/jobs/{job_id}"),
                                            "cancel"), 303)  # fmt: skip

    async def pause(self, request: Request) -> Response:
        queue = validate.queue_name(request.path_params["queue"])
        form = await self.checked_form(request)
        reason = form.get("reason", "").strip() or None
        if reason is not None:
            reason = validate.bounded_text(reason, "reason", REASON_MAX)
        actor = self.actor(request)
        await self.change(
            lambda conn, now: lanes.pause_lanes(conn, [queue], by=actor, reason=reason, now=now)
        )
        return RedirectResponse(with_notice(safe_next(form.get("next"), "/"), "pause"), 303)

    async def resume(self, request: Request) -> Response:
        queue = validate.queue_name(request.path_params["queue"])
        form = await self.checked_form(request)
        actor = self.actor(request)
        await self.change(lambda conn, now: lanes.resume_lanes(conn, [queue], by=actor, now=now))
        return RedirectResponse(with_notice(safe_next(form.get("next"), "/"), "resume"), 303)

    # -- errors ----------------------------------------------------------------------

    async def on_spool_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, SpoolError)
        status = next((s for cls, s in STATUS_OF.items() if isinstance(exc, cls)), 500)
        return self.error_page(request, status, f"{exc.code}: {exc.message}")

    async def on_refused(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, Refused)
        return self.error_page(request, exc.status, exc.message)

    async def on_http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return self.error_page(request, exc.status_code, str(exc.detail))


class GuardMiddleware:
    """Checks every request before a route sees it (see `guard`), and adds the
    security headers to every response, refusals included."""

    def __init__(self, app: ASGIApp, guard: Guard) -> None:
        self.app = app
        self.guard = guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers[name] = value
            await send(message)

        refusal = self.refusal(Request(scope))
        await (refusal or self.app)(scope, receive, secured)

    def refusal(self, request: Request) -> Response | None:
        headers = request.headers
        if not self.guard.host_ok(headers.get("host")):
            return PlainTextResponse(
                "unexpected Host header: open the dashboard at the URL spoolctl web printed\n", 421
            )
        if request.method not in ("GET", "HEAD", "POST"):
            return PlainTextResponse("method not allowed\n", 405)
        if request.url.path != "/login" and not self.guard.authorized(
            headers.get("authorization"), request.cookies
        ):
            return PlainTextResponse(
                "this dashboard needs its access token: open the one-time login link "
                "spoolctl web printed, or send 'Authorization: Bearer TOKEN'\n",
                401,
                headers={"www-authenticate": "Bearer"},
            )
        if request.method == "POST" and not self.guard.same_origin(headers, request.url.scheme):
            return PlainTextResponse("cross-site request refused\n", 403)
        return None


class LastResort:
    """An unexpected error answers 500 with one log line, never a traceback."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def tracking(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking)
        except Exception as exc:
            log.error("spoolctl web: unexpected %s: %s", type(exc).__name__, exc)
            if started or scope["type"] != "http":
                return
            response = PlainTextResponse(f"internal error: {type(exc).__name__}\n", 500)
            await response(scope, receive, send)


def create_app(access: QueueAccess, guard: Guard, settings: Settings) -> Starlette:
    board = Dashboard(access, guard, settings)
    routes = [
        Route("/", board.overview),
        Route("/jobs", board.jobs),
        Route("/jobs/{job_id}", board.job),
        Route("/jobs/{job_id}/output", board.output),
        Route("/jobs/{job_id}/retry", board.retry, methods=["POST"]),
        Route("/jobs/{job_id}/cancel", board.cancel, methods=["POST"]),
        Route("/lanes/{queue}/pause", board.pause, methods=["POST"]),
        Route("/lanes/{queue}/resume", board.resume, methods=["POST"]),
        Route("/events", board.events),
        Route("/events/live", board.events_live),
        Route("/login", board.login),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    return Starlette(
        routes=routes,
        middleware=[Middleware(GuardMiddleware, guard=guard), Middleware(LastResort)],
        exception_handlers={
            SpoolError: board.on_spool_error,
            Refused: board.on_refused,
            HTTPException: board.on_http_error,
        },
    )
