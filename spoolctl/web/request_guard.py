"""Who may use the dashboard, and which requests it believes.

- Without a token the server listens on loopback only (the CLI refuses any
  other address), and every request must name a loopback host in its Host
  header (any port: a tunnel may forward another): a page on another site
  that rebinds its own name to 127.0.0.1 gets nothing.
- With a token every request carries it, as `Authorization: Bearer TOKEN`
  or as the session cookie a one-time login link sets (the link's code works
  once; the token itself never appears in a URL).
- A state-changing request is a POST whose Origin (or Sec-Fetch-Site, or
  Referer) is this server, carrying the process's CSRF secret both in a
  hidden form field and in a SameSite=Strict cookie.
- Every response forbids framing, sniffing, cross-site referrers and caching; its
  Content-Security-Policy allows this server's own scripts and styles only.
"""

from __future__ import annotations

import hmac
import secrets
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

SECURITY_HEADERS: dict[str, str] = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
}
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


def _hostname(host: str) -> str:
    """A Host header without its port (`[::1]:80` -> `[::1]`)."""
    if host.startswith("["):
        return host.partition("]")[0] + "]"
    return host.partition(":")[0]


def _same(given: str | None, expected: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


@dataclass
class Guard:
    """The secrets of one server process and the checks that use them."""

    port: int
    token: str | None = None
    allowed_hosts: frozenset[str] | None = None
    """Host names (the Host header without its port, which a tunnel may change)
    accepted; None accepts any (a token guards the server)."""
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    session: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    once: str | None = field(default_factory=lambda: secrets.token_urlsafe(24))
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def loopback(cls, port: int, extra_names: tuple[str, ...] = ()) -> Guard:
        """A server without a token: only loopback Host headers are accepted."""
        return cls(port, None, frozenset(name.lower() for name in (*LOOPBACK_NAMES, *extra_names)))

    @property
    def csrf_cookie(self) -> str:
        """Cookies are not kept apart by port: each server names its own."""
        return f"spoolctl_csrf_{self.port}"

    @property
    def session_cookie(self) -> str:
        return f"spoolctl_session_{self.port}"

    @property
    def login_path(self) -> str | None:
        """The one-time login link's path, while it is unused (token servers only)."""
        if self.token is None or self.once is None:
            return None
        return f"/login?once={self.once}"

    def host_ok(self, host: str | None) -> bool:
        if self.allowed_hosts is None:
            return True
        return host is not None and _hostname(host.lower()) in self.allowed_hosts

    def authorized(self, authorization: str | None, cookies: Mapping[str, str]) -> bool:
        if self.token is None:
            return True
        scheme, _, credential = (authorization or "").partition(" ")
        if scheme.lower() == "bearer" and _same(credential.strip(), self.token):
            return True
        return _same(cookies.get(self.session_cookie), self.session)

    def redeem(self, code: str | None) -> bool:
        """Whether `code` is the one-time login code; it works once."""
        with self._lock:
            if self.token is None or self.once is None or not _same(code, self.once):
                return False
            self.once = None
            return True

    def same_origin(self, headers: Mapping[str, str]) -> bool:
        """A browser says where a request comes from: it must be this server,
        the host and port the request was sent to (whatever the scheme: a
        proxy in front may add TLS)."""
        host = headers.get("host", "").lower()
        origin = headers.get("origin")
        if origin is not None:
            return origin != "null" and urlsplit(origin).netloc.lower() == host
        site = headers.get("sec-fetch-site")
        if site is not None:
            return site in ("same-origin", "none")
        referer = headers.get("referer")
        if referer is not None:
            return urlsplit(referer).netloc.lower() == host
        return True  # not a browser: the CSRF secret below still has to match

    def csrf_ok(self, submitted: str | None, cookie: str | None) -> bool:
        return _same(submitted, self.csrf) and _same(cookie, self.csrf)
