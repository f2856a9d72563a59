"""CLI for the web console: `rsched web`. Checks its flags and the token, then
serves :mod:`rsched.web` with uvicorn."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from collections.abc import Iterator
from typing import Any

import click

from rsched.cli.main import App, pass_app
from rsched.cli.params import AsciiIntRange
from rsched.core.errors import ConfigError, ExitCode

TOKEN_ENV = "RSCHED_WEB_TOKEN"


def _token(token_file: str | None) -> str | None:
    """The console's token: the file's content (one line), else the environment's
    (an empty variable is no token). Never from argv."""
    if token_file is not None:
        try:
            with open(token_file, encoding="utf-8") as f:
                text = f.read().strip()
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise ConfigError(f"--token-file {token_file}: cannot read it ({why})") from None
        if not text:
            raise ConfigError(f"--token-file {token_file}: is empty (one line: the token)")
        return text
    return os.environ.get(TOKEN_ENV) or None


def _listen(host: str, port: int) -> socket.socket:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigError(
            f"--host {host}: not an address of this machine ({exc.strerror})"
        ) from None
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"--host {host} --port {port}: cannot listen ({exc.strerror})") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


@click.command("web")
@click.option(
    "--host", default="127.0.0.1", show_default=True, metavar="H", help="Address to listen on."
)
@click.option(
    "--port",
    type=AsciiIntRange(1, 65535),
    default=8790,
    show_default=True,
    metavar="P",
    help="Port to listen on (1-65535).",
)
@click.option(
    "--read-only", is_flag=True, help="Show everything, change nothing: every action answers 403."
)
@click.option(
    "--token-file",
    metavar="F",
    help=f"File holding the token that pages and the API need (else ${TOKEN_ENV}).",
)
@click.option(
    "--secure-cookie",
    is_flag=True,
    help="Mark the session cookie Secure (behind a TLS-terminating proxy: HTTPS only).",
)
@pass_app
def web(
    app: App, host: str, port: int, read_only: bool, token_file: str | None, secure_cookie: bool
) -> None:
    """The web console: queues, crons, locks, history and events, with actions.

    Needs the web extra (pip install 'rsched[web]'; without it: exit 78).
    Listens on 127.0.0.1 by default; any other address needs a token
    (--token-file F or RSCHED_WEB_TOKEN; never on the command line), else exit
    78. With a token, pages and /api need `Authorization: Bearer TOKEN` or the
    session cookie of the login form; an action (a POST) needs the bearer token
    or the page's CSRF token. /api/... answers with the CLI's --json objects.

    Ten failed logins or wrong bearer tokens within a minute from one client
    address: that address gets 429 (with Retry-After) until a minute after the
    oldest. The address is the TCP peer's (X-Forwarded-For is not believed), so
    behind a reverse proxy its clients share that budget; there, with TLS at
    the proxy, give --secure-cookie. Every action is recorded in the audit
    trail (rsched history --actions; /api/audit).
    """
    from rsched.core.config import strip_password
    from rsched.web import require
    from rsched.web.security import is_loopback

    token = _token(token_file)
    if not is_loopback(host) and not token:
        raise ConfigError(
            f"--host {host}: a console other hosts can reach needs a token: "
            f"--token-file F or {TOKEN_ENV} (or listen on 127.0.0.1)"
        )
    require()
    if token and len(token) < 16:
        app.info("rsched web: warning: the token has fewer than 16 characters (easy to guess)")
    sock = _listen(host, port)
    try:
        import uvicorn

        from rsched.web.app import WebConfig, create_app

        settings = app.settings
        rs = app.rs
        shown = strip_password(settings.redis_url) if settings.redis_url else "?"
        asgi = create_app(
            rs,
            WebConfig(
                token=token,
                read_only=read_only,
                redis_shown=shown,
                namespace=settings.namespace,
                loopback=is_loopback(host),
                secure_cookie=secure_cookie,
            ),
            log=app.log,
            config_crons=settings.crons,
        )
        where = f"[{host}]" if ":" in host else host
        app.info(
            f"rsched web: http://{where}:{port}/ ({shown}, namespace {settings.namespace}"
            + (", read-only" if read_only else "")
            + (", token required" if token else "")
            + ")"
        )
        server = _server_class(uvicorn)(
            uvicorn.Config(
                asgi,
                log_level="warning",
                access_log=False,
                server_header=False,
                lifespan="off",
                # the client address is the TCP peer's: X-Forwarded-* would let any
                # client choose the address its failures and audit records count under
                proxy_headers=False,
            )
        )
        server.run(sockets=[sock])
    finally:
        sock.close()
    if getattr(server, "stopped_by", None) == signal.SIGINT:
        raise SystemExit(int(ExitCode.INTERRUPTED))


def _server_class(uvicorn: Any) -> Any:
    """uvicorn's server, stopping on SIGTERM (exit 0) or SIGINT (exit 130) like
    the run loops, instead of re-raising the signal at the end (uvicorn's own)."""

    class Server(uvicorn.Server):  # type: ignore[misc, name-defined]
        stopped_by: int | None = None

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            def stop(sig: int, frame: Any) -> None:
                if getattr(self, "should_exit", False):  # a second signal: at once
                    self.force_exit = True
                self.stopped_by = sig
                self.should_exit = True

            old = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for s, h in old.items():
                    signal.signal(s, h)

    return Server
