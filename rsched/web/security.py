"""Who may see and do what in the web console.

- With a token configured (``--token-file`` or ``RSCHED_WEB_TOKEN``; never
  argv), every page and endpoint but ``/healthz``, ``/login`` and the static
  files needs it: ``Authorization: Bearer TOKEN``, or the session cookie that
  ``POST /login`` sets (``HttpOnly; SameSite=Strict``; kept in this process's
  memory, gone at restart). Tokens are compared in constant time
  (:func:`hmac.compare_digest`).
- Without a token the server listens on loopback only (the CLI refuses
  anything else, exit 78), and a request whose ``Host`` is not a loopback name
  is refused: a DNS-rebinding page cannot read the console.
- An action (a POST) needs the bearer token, or the page's CSRF token
  (``X-CSRF-Token`` or the form field ``csrf_token``): per session, or one per
  process when no token is configured. ``--read-only``: every action 403.
- Failed logins and wrong bearer tokens are counted per client address: after
  :data:`FAIL_LIMIT` failures within :data:`FAIL_WINDOW_S` seconds, that
  address's logins and bearer calls answer 429 with ``Retry-After`` until the
  oldest failure leaves the window (a correct token does not get through
  meanwhile: guessing stays at 10 a minute). The address is the TCP peer's:
  the server does not believe ``X-Forwarded-For`` (anyone could rotate it), so
  behind a reverse proxy its clients share one budget.
- ``--secure-cookie`` (behind a TLS-terminating proxy) adds ``Secure`` to the
  session cookie, so a browser never sends it over plain HTTP.
- Every answer carries the security headers of :data:`HEADERS` (a CSP without
  inline scripts or styles: the pages load ``/static/console.js`` and
  ``console.css`` only).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections import deque
from dataclasses import dataclass, field

SESSION_COOKIE = "rsched_session"
SESSION_TTL_S = 12 * 3600
#: failed logins / wrong bearer tokens per client address within FAIL_WINDOW_S, then 429
FAIL_LIMIT = 10
FAIL_WINDOW_S = 60.0

HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "Cross-Origin-Opener-Policy": "same-origin",
}

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1", "[::1]")


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ``::1`` and ``localhost``."""
    h = host.strip("[]")
    return h in ("localhost", "::1") or h.startswith("127.")


def host_of(header: str) -> str:
    """The name in a ``Host`` header, without its port."""
    if header.startswith("["):
        return header.split("]", 1)[0] + "]"
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass
class Who:
    """The caller of one request: ``how`` is bearer, session or open (no token
    configured), ``ident`` a short non-secret name for the log."""

    how: str
    ident: str
    csrf: str | None  # the CSRF token of its pages (None for bearer calls)


@dataclass
class Guard:
    token: str | None
    read_only: bool = False
    #: sha256(session id) -> (csrf token, expiry)
    _sessions: dict[str, tuple[str, float]] = field(default_factory=dict)
    _open_csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    _lock: threading.Lock = field(default_factory=threading.Lock)
    #: client address -> monotonic times of its recent failures
    _failures: dict[str, deque[float]] = field(default_factory=dict)

    def retry_after(self, addr: str) -> int | None:
        """Seconds until ``addr`` may try a token again, or None when it may now."""
        with self._lock:
            got = self._failures.get(addr)
            if got is None:
                return None
            now = time.monotonic()
            while got and got[0] <= now - FAIL_WINDOW_S:
                got.popleft()
            if not got:
                del self._failures[addr]
                return None
            if len(got) < FAIL_LIMIT:
                return None
            return max(1, int(got[0] + FAIL_WINDOW_S - now + 0.999))

    def failed(self, addr: str) -> None:
        """Count one failed login or wrong bearer token of ``addr``."""
        with self._lock:
            now = time.monotonic()
            if len(self._failures) > 10_000:  # many addresses: forget the quiet ones
                for k in [k for k, d in self._failures.items() if d[-1] <= now - FAIL_WINDOW_S]:
                    del self._failures[k]
            got = self._failures.setdefault(addr, deque())
            got.append(now)
            while len(got) > FAIL_LIMIT:
                got.popleft()

    def check_token(self, given: str) -> bool:
        if not self.token:
            return False
        return hmac.compare_digest(given.encode("utf-8"), self.token.encode("utf-8"))

    def login(self) -> tuple[str, str]:
        """A new session: (session id for the cookie, its CSRF token)."""
        sid, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        with self._lock:
            now = time.monotonic()
            for k in [k for k, (_, exp) in self._sessions.items() if exp < now]:
                del self._sessions[k]
            self._sessions[_digest(sid)] = (csrf, now + SESSION_TTL_S)
        return sid, csrf

    def logout(self, sid: str | None) -> None:
        if sid:
            with self._lock:
                self._sessions.pop(_digest(sid), None)

    def who(self, authorization: str | None, cookie: str | None) -> Who | None:
        """The caller, or None when a token is configured and none was given."""
        if not self.token:
            return Who("open", "local", self._open_csrf)
        if authorization and authorization[:7].lower() == "bearer ":
            return Who("bearer", "bearer", None) if self.check_token(authorization[7:]) else None
        if cookie:
            d = _digest(cookie)
            with self._lock:
                got = self._sessions.get(d)
            if got and got[1] >= time.monotonic():
                return Who("session", "session:" + d[:8], got[0])
        return None

    def csrf_ok(self, who: Who, given: str | None) -> bool:
        if who.how == "bearer":
            return True
        if not given or who.csrf is None:
            return False
        return hmac.compare_digest(given.encode("utf-8"), who.csrf.encode("utf-8"))
