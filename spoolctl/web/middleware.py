"""The checks every request passes before a route sees it (see `request_guard`), and
the last resort that turns an unexpected error into a plain 500."""

from __future__ import annotations

import logging

from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from spoolctl.web.request_guard import SECURITY_HEADERS, Guard

log = logging.getLogger("spoolctl.web")


class GuardMiddleware:
    """Checks every request before a route sees it (see `request_guard`), and adds the
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
        if request.method == "POST" and not self.guard.same_origin(headers):
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
