"""The dashboard's pages, the fragments and JSON their script polls to stay
live, and the app that routes them (actions in `actions`, the request checks
in `middleware`)."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from spoolctl.config import Timing
from spoolctl.errors import (
    Conflict,
    InvalidInput,
    Locked,
    MissingRequired,
    NotFound,
    SafetyBlock,
    SpoolError,
)
from spoolctl.services import metrics as metric_data
from spoolctl.services import schedules
from spoolctl.services.totals import EndedTotals
from spoolctl.web import views
from spoolctl.web.access import QueueAccess
from spoolctl.web.actions import Actions
from spoolctl.web.common import Refused, Settings, job_id_of, whole_number
from spoolctl.web.middleware import GuardMiddleware, LastResort
from spoolctl.web.render import make_environment
from spoolctl.web.request_guard import Guard

STATIC = Path(__file__).parent / "static"
NOTICES = {
    "retry": "Retried: the job is back in the queue with a fresh budget.",
    "cancel": "Canceled.",
    "pause": "Lane paused: workers stop claiming from it; running jobs finish.",
    "resume": "Lane resumed.",
    "suspend": "Suspend requested: the job's worker stops its processes, and its timeout, "
    "within its pickup latency.",
    "continue": "Continue requested: the job's worker lets its processes go on.",
    "signal": "Signal requested: the job's worker sends it to every process of the job.",
    "schedule_pause": "Schedule paused: it fires no more jobs until resumed.",
    "schedule_resume": "Schedule resumed: it fires again from its next fire time.",
}
JOB_PARTS = {"head": "_job_head.html", "history": "_job_history.html"}
"""The parts of a job page its script refreshes while the job is not finished."""
STATUS_OF: dict[type[SpoolError], int] = {
    InvalidInput: 400,
    MissingRequired: 400,
    NotFound: 404,
    SafetyBlock: 403,
    Conflict: 409,
    Locked: 503,
}


def partial(request: Request) -> bool:
    return request.query_params.get("partial") == "1"


class Dashboard:
    """The handlers, around one queue, one guard and the settings."""

    def __init__(self, access: QueueAccess, guard: Guard, settings: Settings) -> None:
        self.access = access
        self.guard = guard
        self.settings = settings
        self.env = make_environment()
        self.totals = EndedTotals()
        """The ended attempts' totals, kept up between scrapes of /metrics."""

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
        root, reader = self.access.output_root, self.access.output()
        if root is None or reader is None:
            return None, now
        detail = self.access.read(
            lambda conn: views.job_page(conn, job_id, attempt, root, reader, now), None
        )
        return detail, now

    async def output(self, request: Request) -> Response:
        job_id = job_id_of(request)
        attempt = whole_number(request.query_params.get("attempt"), "attempt")
        offset = whole_number(request.query_params.get("offset"), "offset", 0) or 0
        stream = request.query_params.get("stream", "stdout")
        if stream not in ("stdout", "stderr"):
            raise InvalidInput("stream must be stdout or stderr")
        root, reader = self.access.output_root, self.access.output()
        if root is None or reader is None:
            raise NotFound(f"no job {job_id}", job_id=job_id)
        chunk = await run_in_threadpool(
            self.access.read,
            lambda conn: views.output_chunk(conn, job_id, attempt, stream, offset, root, reader),
            None,
        )
        return JSONResponse(chunk)

    async def schedules(self, request: Request) -> Response:
        now = await run_in_threadpool(self.access.now)
        found = await run_in_threadpool(
            self.access.read, lambda conn: schedules.listing(conn, now), []
        )
        return self.page(request, "schedules.html", title="Schedules", now=now, schedules=found)

    async def events(self, request: Request) -> Response:
        before = whole_number(request.query_params.get("before"), "before")
        job_id = whole_number(request.query_params.get("job"), "job")
        empty: dict[str, Any] = {"events": [], "older": None, "cursor": 0}
        data = await run_in_threadpool(
            self.access.read_ledger, lambda conn: views.events_page(conn, before, job_id), empty
        )
        now = await run_in_threadpool(self.access.now)
        return self.page(
            request, "events.html", title="Events", before=before, job=job_id, now=now, **data
        )

    async def events_live(self, request: Request) -> Response:
        cursor = whole_number(request.query_params.get("cursor"), "cursor", 0) or 0
        job_id = whole_number(request.query_params.get("job"), "job")
        data = await run_in_threadpool(
            self.access.read_ledger,
            lambda conn: views.events_after(conn, cursor, job_id),
            {"events": [], "cursor": cursor},
        )
        rows = self.env.get_template("_event_rows.html").render(events=data["events"])
        return JSONResponse({"cursor": data["cursor"], "count": len(data["events"]), "html": rows})

    async def metrics(self, request: Request) -> Response:
        """The Prometheus exposition `spoolctl metrics` prints (behind the
        token when one is set, as every page); 501 without the metrics extra."""
        try:
            exposition = importlib.import_module("spoolctl.exposition")
        except ModuleNotFoundError as exc:
            raise Refused(
                501,
                f"/metrics needs the metrics extra ({exc.name} is missing): "
                "pip install 'spoolctl[metrics]'",
            ) from None
        snapshot = await run_in_threadpool(self.read_metrics)
        return Response(exposition.render(snapshot), media_type=exposition.CONTENT_TYPE)

    def read_metrics(self) -> metric_data.MetricsSnapshot:
        now = self.access.now()
        live_within_s = Timing.from_env().reap_threshold_s
        return self.access.read(
            lambda conn: metric_data.collect(
                conn, now, live_within_s=live_within_s, totals=self.totals
            ),
            metric_data.empty_snapshot(now),
        )

    async def login(self, request: Request) -> Response:
        if not self.guard.redeem(request.query_params.get("once")):
            raise Refused(
                401,
                "this login link is wrong or was already used: restart spoolctl web for a new "
                "one, or send the token as 'Authorization: Bearer TOKEN'",
            )
        response = RedirectResponse("/", 303)
        response.set_cookie(
            self.guard.session_cookie,
            self.guard.session,
            httponly=True,
            samesite="strict",
            path="/",
        )
        return response

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


def create_app(access: QueueAccess, guard: Guard, settings: Settings) -> Starlette:
    board = Dashboard(access, guard, settings)
    actions = Actions(access, guard, settings)
    routes = [
        Route("/", board.overview),
        Route("/jobs", board.jobs),
        Route("/jobs/{job_id}", board.job),
        Route("/jobs/{job_id}/output", board.output),
        Route("/jobs/{job_id}/retry", actions.retry, methods=["POST"]),
        Route("/jobs/{job_id}/cancel", actions.cancel, methods=["POST"]),
        Route("/jobs/{job_id}/suspend", actions.suspend, methods=["POST"]),
        Route("/jobs/{job_id}/continue", actions.resume_job, methods=["POST"]),
        Route("/jobs/{job_id}/signal", actions.signal, methods=["POST"]),
        Route("/lanes/{lane}/pause", actions.pause, methods=["POST"]),
        Route("/lanes/{lane}/resume", actions.resume, methods=["POST"]),
        Route("/schedules", board.schedules),
        Route("/schedules/{name}/pause", actions.schedule_pause, methods=["POST"]),
        Route("/schedules/{name}/resume", actions.schedule_resume, methods=["POST"]),
        Route("/events", board.events),
        Route("/events/live", board.events_live),
        Route("/login", board.login),
        Route("/metrics", board.metrics),
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
