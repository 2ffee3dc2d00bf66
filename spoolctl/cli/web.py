"""`web`: the dashboard, served until SIGINT/SIGTERM.

The web stack (Starlette, uvicorn, Jinja2: the `web` extra) is imported here,
inside the verb, so no other verb loads it. The refusal to listen beyond
loopback without a token happens before any socket is made.
"""

from __future__ import annotations

import gc
import ipaddress
from typing import Any

import click

from spoolctl.cli.database import driver_of, open_read, open_write
from spoolctl.cli.options import BoundedInt, BoundedText, db_option, json_option, verb
from spoolctl.cli.reply import Reply, emit, write_json
from spoolctl.errors import ExtraMissing, InvalidInput, SafetyBlock
from spoolctl.services.lanes import operator_identity

TOKEN_MIN = 16
TOKEN_MAX = 1024


@verb(
    "web",
    mutates=True,
    destructive="only with --allow-actions (cancel stops a running job)",
    idempotent=True,
    examples=(
        "spoolctl web",
        "spoolctl web --port 8080 --allow-actions",
        'spoolctl web --host 0.0.0.0 --port 8080 --token "$(openssl rand -hex 16)"',
    ),
)
@click.option(
    "--host",
    type=BoundedText("host", 255),
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on; beyond loopback only with --token.",
)
@click.option(
    "--port",
    type=BoundedInt(0, 65535),
    default=0,
    show_default=True,
    help="TCP port (0: a free one).",
)
@click.option(
    "--allow-actions", is_flag=True, help="Offer retry, cancel, pause and resume on the pages."
)
@click.option(
    "--token",
    type=BoundedText("token", TOKEN_MAX),
    default=None,
    help=f"Access token ({TOKEN_MIN}+ characters) every request must carry.",
)
@db_option
@json_option
def web(
    host: str, port: int, allow_actions: bool, token: str | None, db: str | None, as_json: bool
) -> int:
    """Serve the dashboard: the queue's overview, jobs, output and event ledger, live.

    Prints its URL as the first line, then serves until SIGINT/SIGTERM (exit
    0). Listens on loopback unless given --token; with a token, requests need
    `Authorization: Bearer TOKEN` or the cookie set by the one-time login link
    it prints. Needs the web extra: pip install 'spoolctl[web]'.
    """
    if token is not None and len(token) < TOKEN_MIN:
        raise InvalidInput(f"--token needs at least {TOKEN_MIN} characters", flag="--token")
    try:
        from spoolctl.web import server
        from spoolctl.web.access import QueueAccess
        from spoolctl.web.app import create_app
        from spoolctl.web.common import Settings
        from spoolctl.web.request_guard import Guard
    except ModuleNotFoundError as exc:
        raise ExtraMissing(
            f"spoolctl web needs the web extra ({exc.name} is missing)",
            extra="web",
            missing=exc.name,
        ) from None
    addresses = server.addresses_of(host)
    if token is None and not server.is_loopback(addresses):
        raise SafetyBlock(
            f"refusing to serve the dashboard on {host} ({', '.join(addresses)}), beyond "
            "loopback, without --token: give an access token, or keep the default 127.0.0.1",
            host=host,
            addresses=addresses,
        )
    found = open_read(db)
    if found is not None:
        found.read(lambda conn: None)  # an outdated or foreign queue is refused before listening
    access = QueueAccess(
        lambda: found or open_read(db), lambda: open_write(db), driver_of(db).display
    )
    listener = server.listen(host, addresses[0], port)
    if token is None:
        guard = Guard.loopback(listener.port, (host_header_name(host),))
    else:
        guard = Guard(listener.port, token)
    app = create_app(access, guard, Settings(allow_actions, f"web: {operator_identity()}"))
    login = guard.login_path
    facts = {
        "url": listener.url,
        "login_url": None if login is None else listener.url.rstrip("/") + login,
        "host": host,
        "port": listener.port,
        "queue": access.display,
        "allow_actions": allow_actions,
        "token_required": token is not None,
    }
    announce(facts, as_json)
    gc.freeze()  # a server lives long: collect cycles again, but never rescan what import made
    gc.enable()
    try:
        stopped_by = server.serve(app, listener)
    finally:
        access.close()
    data = {**facts, "stopped_by": stopped_by}
    data.pop("login_url")
    return emit(Reply(data, text=f"spoolctl web: stopped ({stopped_by or 'done'})"), as_json)


def host_header_name(host: str) -> str:
    """How a browser names `host` in its Host header (IPv6 in brackets)."""
    try:
        literal = ipaddress.ip_address(host)
    except ValueError:
        return host.lower()
    return f"[{literal}]" if literal.version == 6 else str(literal)


def announce(facts: dict[str, Any], as_json: bool) -> None:
    """The URL first (one line, flushed), then the one-time login link."""
    if as_json:
        write_json({"listening": facts})
        return
    click.echo(facts["url"])
    if facts["login_url"] is not None:
        click.echo(f"login link (works once): {facts['login_url']}")
    mode = "actions on" if facts["allow_actions"] else "read-only"
    click.echo(f"spoolctl web: serving {facts['queue']} ({mode}); Ctrl-C to stop", err=True)
