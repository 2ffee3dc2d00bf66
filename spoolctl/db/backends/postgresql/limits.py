"""The bounds a PostgreSQL session of spoolctl's works within: how long it
may take to connect, how long the network may stay silent, and how long a
transaction may sit idle or last in all; and how a write transaction's
statements are planned (PLAN_SETTINGS). The transaction's settings are set by
each transaction for itself (`set_config(…, true)`), never on the session,
so a pooled server session carries nothing of ours to its next client."""

from __future__ import annotations

from typing import Any

CONNECT_TIMEOUT_S = 10
IDLE_IN_TRANSACTION_MAX_S = 10.0
TRANSACTION_MAX_S = 60.0
"""PostgreSQL 17+: the longest a write transaction of ours may last
(`transaction_timeout`; migrate and copy-to are not bounded)."""
TRANSACTION_TIMEOUT_SINCE = 170000
BOUNDS_OPTION = "spoolctl_bounds"
"""Where a pooled connection keeps the settings each of its transactions takes."""
NETWORK_TIMEOUT_MAX_S = 10.0
PLAN_SETTINGS = {"enable_seqscan": "off", "plan_cache_mode": "force_generic_plan"}
"""How the server plans the statements of an ordinary write transaction of
ours (set in each, like the bounds; migrate and copy-to keep the server's
defaults). Each such statement finds its rows by key or by an index's order:
- `enable_seqscan`: a plan made while a table was a few pages long (a
  connection's prepared statement, the server's cached foreign-key checks)
  would otherwise scan the whole table for as long as it is kept;
- `plan_cache_mode`, where statements are prepared: once the backlog had
  statistics the server judged a fresh plan of the claim cheaper than its
  generic one and planned it again on every run, 0.4 to 0.6 ms of its CPU a
  job (docs/postgresql.md)."""


def idle_limit_ms() -> int:
    """How long the server lets a session sit idle inside a transaction: a
    quarter of the lease (at least 1 s, at most 10 s), so a frozen worker's
    locks are released well before its jobs could be requeued."""
    from spoolctl.config import Timing

    hang = Timing.from_env().hang_threshold_s
    if hang <= 0:
        return int(IDLE_IN_TRANSACTION_MAX_S * 1000)
    return int(min(IDLE_IN_TRANSACTION_MAX_S, max(1.0, hang / 4)) * 1000)


def transaction_limit_ms(busy_timeout_s: float) -> int:
    """How long a write transaction may last in all (PostgreSQL 17+): a minute,
    or four lock waits at the busy timeout if that is longer. An event shows
    in the ledger when its transaction commits: this bounds how late."""
    return int(max(TRANSACTION_MAX_S, 4 * busy_timeout_s) * 1000)


def network_bounds() -> dict[str, Any]:
    """libpq settings that bound how long a call can hang on a dead network:
    unacknowledged data fails after `tcp_user_timeout`, an idle connection is
    probed by keepalives. Scaled to the lease (SPOOLCTL_HANG_THRESHOLD): a
    worker must notice a lost server well within half of it, when it fences
    itself, since others requeue its jobs after the whole of it."""
    from spoolctl.config import Timing

    hang = Timing.from_env().hang_threshold_s
    bound = NETWORK_TIMEOUT_MAX_S if hang <= 0 else min(NETWORK_TIMEOUT_MAX_S, max(0.5, hang / 8))
    return {
        "connect_timeout": max(2, min(CONNECT_TIMEOUT_S, int(bound))),
        "tcp_user_timeout": int(bound * 1000),
        "keepalives": 1,
        "keepalives_idle": max(1, int(bound / 2)),
        "keepalives_interval": 1,
        "keepalives_count": 2,
    }


def transaction_bounds(total: bool, busy_timeout_s: float) -> dict[str, str]:
    """The server settings that end a transaction of ours left open: idle
    inside it a quarter of the lease, and (PostgreSQL 17+, write engines that
    are bounded) longer than transaction_limit_ms in all."""
    bounds = {"idle_in_transaction_session_timeout": f"{idle_limit_ms()}ms"}
    if total:
        bounds["transaction_timeout"] = f"{transaction_limit_ms(busy_timeout_s)}ms"
    return bounds


_PLAN_WORDS = frozenset(PLAN_SETTINGS.values())


def setting_sql(settings: dict[str, str]) -> str:
    """One SELECT that sets each setting for this transaction only
    (set_config's is_local), parameters named after the settings."""
    calls = ", ".join(f"set_config('{name}', %({name})s, true)" for name in settings)
    return f"SELECT {calls}"


def plan_settings(prepared: bool) -> dict[str, str]:
    """PLAN_SETTINGS for a write engine; without `plan_cache_mode` where
    nothing is prepared (a transaction pooler), since a statement planned once
    is best planned for its values."""
    if prepared:
        return dict(PLAN_SETTINGS)
    return {k: v for k, v in PLAN_SETTINGS.items() if k != "plan_cache_mode"}


def setting_literals(settings: dict[str, str]) -> str:
    """`setting_sql` with the values written in (a statement without
    parameters can share one round trip with the BEGIN after it). The values
    are our own durations (`5000ms`) and PLAN_SETTINGS' words: anything else
    is refused."""
    for name, value in settings.items():
        duration = value.endswith("ms") and value[:-2].isdigit()
        if not (name.replace("_", "").isalpha() and (duration or value in _PLAN_WORDS)):
            raise ValueError(f"not a setting of ours: {name}={value!r}")
    calls = ", ".join(f"set_config('{name}', '{value}', true)" for name, value in settings.items())
    return f"SELECT {calls}"
