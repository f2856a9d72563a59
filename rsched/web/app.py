"""The console's ASGI application: routes, pages, the JSON API and the actions.

Every ``/api/...`` GET answers with exactly what the CLI's ``--json`` prints
(the domain's ``to_json``; :mod:`rsched.tools.actions` for the actions), and
every action goes through the same library call as its CLI command. GET never
changes anything; an action is a POST (JSON or a form; a form is answered
with a redirect back to the page it came from), is logged with who made it,
and is recorded in the audit trail by its action function
(:mod:`rsched.tools.audit`: ``/api/audit`` and the History page show it).
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
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

from rsched.core import errors
from rsched.core.text import printable
from rsched.core.timeutil import human_duration, iso, local_time, relative
from rsched.tools.audit import Actor
from rsched.web import console as C
from rsched.web.security import HEADERS, SESSION_COOKIE, Guard, Who, host_of, is_loopback

if TYPE_CHECKING:  # pragma: no cover
    from rsched.api import Rsched

HERE = Path(__file__).resolve().parent
PAGE_LIMIT = 50


@dataclass
class WebConfig:
    token: str | None
    read_only: bool
    #: the Redis URL as shown (no password) and the namespace
    redis_shown: str
    namespace: str
    #: whether the server listens on loopback only (then Host must be a loopback name)
    loopback: bool = True
    #: the session cookie gets ``Secure`` (--secure-cookie: behind a TLS proxy)
    secure_cookie: bool = False


async def _form(request: Request) -> dict[str, str]:
    """An ``application/x-www-form-urlencoded`` body (what the pages' forms send;
    parsed here: no multipart parser needed)."""
    from urllib.parse import parse_qsl

    raw = await request.body()
    if len(raw) > 64 * 1024:
        raise HttpError(413, "the form is larger than 64 KiB")
    try:
        return dict(parse_qsl(raw.decode("utf-8"), keep_blank_values=True))
    except UnicodeDecodeError:
        raise HttpError(400, "the form is not UTF-8") from None


class HttpError(Exception):
    def __init__(self, status: int, message: str):
        self.status, self.message = status, message
        super().__init__(message)


def _status(exc: Exception) -> int:
    if isinstance(exc, HttpError):
        return exc.status
    if isinstance(exc, errors.BadInput):
        return 400
    if isinstance(exc, errors.NotFound):
        return 404
    if isinstance(exc, errors.Conflict):
        return 409
    if isinstance(exc, errors.RedisUnavailable):
        return 503
    return 500


def _env() -> Environment:
    env = Environment(
        loader=FileSystemLoader(str(HERE / "templates")),
        autoescape=select_autoescape(default=True, default_for_string=True),
    )

    def dur(ms: Any) -> str:
        return human_duration(int(ms)) if isinstance(ms, int | float) else "-"

    env.filters.update(
        iso=lambda ms: iso(ms) or "-",
        dur=dur,
        local=lambda ms, tz: local_time(ms, tz) or "-",
        rel=relative,
        p=lambda v: "-" if v is None else printable(str(v)),
        # several lines (an error, a run's output): each line made printable
        block=lambda v: "\n".join(printable(x.replace("\t", "    ")) for x in str(v).split("\n")),
        pretty=lambda v: json.dumps(v, indent=2, ensure_ascii=False, sort_keys=True),
        q=lambda d: urlencode({k: v for k, v in d.items() if v not in (None, "")}),
    )
    return env


def create_app(
    rs: Rsched,
    config: WebConfig,
    *,
    log: Callable[[str], None] = lambda _m: None,
    config_crons: dict[str, Any] | None = None,
) -> Starlette:
    guard = Guard(config.token, config.read_only)
    con = C.Console(rs, config_crons)
    env = _env()

    # --- plumbing ------------------------------------------------------------------------
    def wants_json(request: Request) -> bool:
        return request.url.path.startswith("/api/")

    def peer_of(request: Request) -> str:
        return request.client.host if request.client else "?"

    def too_many(request: Request, wait: int) -> Response:
        message = f"too many failed logins or wrong tokens from this address: retry in {wait}s"
        resp = fail(request, None, 429, message)
        resp.headers["Retry-After"] = str(wait)
        return resp

    def who_of(request: Request) -> Who | Response | None:
        """The caller; a 429 while its address is over its failures; None when a
        token is needed and none (or a wrong one) was given."""
        auth = request.headers.get("authorization") or ""
        bearer = bool(config.token) and auth[:7].lower() == "bearer "
        if bearer:
            wait = guard.retry_after(peer_of(request))
            if wait is not None:
                return too_many(request, wait)
        who = guard.who(auth or None, request.cookies.get(SESSION_COOKIE))
        if who is None and bearer:
            guard.failed(peer_of(request))
        return who

    def render(
        request: Request, template: str, who: Who | None, status: int = 200, **ctx: Any
    ) -> HTMLResponse:
        html = env.get_template(template).render(
            request=request,
            who=who,
            csrf=who.csrf if who else None,
            read_only=config.read_only,
            redis=config.redis_shown,
            namespace=config.namespace,
            path=request.url.path,
            here=str(request.url.path) + (f"?{request.url.query}" if request.url.query else ""),
            **{"poll_s": C.POLL_S, **ctx},
        )
        return HTMLResponse(html, status_code=status)

    def fail(request: Request, who: Who | None, status: int, message: str) -> Response:
        if wants_json(request):
            return JSONResponse({"error": message}, status_code=status)
        return render(
            request, "error.html", who, status=status, status_code=status, message=message
        )

    Handler = Callable[[Request, Who], Awaitable[Response]]

    def page(fn: Handler) -> Callable[[Request], Awaitable[Response]]:
        """A GET: authenticated, errors as pages (or JSON under /api)."""

        async def endpoint(request: Request) -> Response:
            who = who_of(request)
            if isinstance(who, Response):
                return who
            if who is None:
                if wants_json(request):
                    return JSONResponse(
                        {"error": "authentication required: Authorization: Bearer TOKEN"},
                        status_code=401,
                        headers={"WWW-Authenticate": 'Bearer realm="rsched"'},
                    )
                return RedirectResponse("/login", status_code=303)
            try:
                return await fn(request, who)
            except (errors.RschedError, HttpError) as exc:
                return fail(request, who, _status(exc), str(exc))

        return endpoint

    def action(name: str, fn: Callable[[Request, dict[str, Any], Actor], Any]) -> Any:
        """A POST: authenticated, not --read-only, CSRF-checked; the action function
        records it in the audit trail with who made it (and it is logged)."""

        async def endpoint(request: Request) -> Response:
            who = who_of(request)
            if isinstance(who, Response):
                return who
            if who is None:
                return JSONResponse(
                    {"error": "authentication required: Authorization: Bearer TOKEN"},
                    status_code=401,
                    headers={"WWW-Authenticate": 'Bearer realm="rsched"'},
                )
            form = request.headers.get("content-type", "").startswith(
                "application/x-www-form-urlencoded"
            )
            try:
                body = await _body(request, form)
            except HttpError as exc:
                return JSONResponse({"error": exc.message}, status_code=exc.status)
            if config.read_only:
                return fail(request, who, 403, "the console is read-only (--read-only)")
            given = request.headers.get("x-csrf-token") or body.get("csrf_token")
            if not guard.csrf_ok(who, given if isinstance(given, str) else None):
                return fail(request, who, 403, "missing or wrong CSRF token (X-CSRF-Token)")
            peer = peer_of(request)
            named = {**request.path_params}
            named.update({k: body[k] for k in ("queue", "type", "id") if k in body})
            target = " ".join(f"{k}={printable(str(v))}" for k, v in named.items())
            try:
                obj = await run_in_threadpool(fn, request, body, Actor("web", who.ident, peer))
            except (errors.RschedError, HttpError) as exc:
                log(f"rsched web: {name} {target} by {who.ident} from {peer}: refused: {exc}")
                if form:
                    return render(
                        request,
                        "error.html",
                        who,
                        _status(exc),
                        status_code=_status(exc),
                        message=str(exc),
                    )
                return JSONResponse({"error": str(exc)}, status_code=_status(exc))
            con.changed()
            log(f"rsched web: {name} {target} by {who.ident} from {peer}: done")
            if form:
                back = body.get("next")
                ok = isinstance(back, str) and back.startswith("/") and not back.startswith("//")
                ok = ok and isinstance(back, str) and "\\" not in back
                return RedirectResponse(back if ok and isinstance(back, str) else "/", 303)
            return JSONResponse(obj)

        return endpoint

    async def _body(request: Request, form: bool) -> dict[str, Any]:
        if form:
            return await _form(request)
        raw = await request.body()
        if not raw:
            return {}
        try:
            obj = json.loads(raw)
        except ValueError:
            raise HttpError(400, "the body is not JSON (send a JSON object)") from None
        if not isinstance(obj, dict):
            raise HttpError(400, "the body is not a JSON object")
        return obj

    def field(body: dict[str, Any], name: str) -> str:
        v = body.get(name)
        if not isinstance(v, str) or not v:
            raise errors.BadInput(name, "is required (a string)")
        return v

    def qparam(request: Request, name: str) -> str | None:
        v = request.query_params.get(name)
        return v if v else None

    def limit_of(request: Request, default: int, top: int = 1000) -> int:
        raw = request.query_params.get("limit")
        if raw is None or raw == "":
            return default
        if not raw.isascii() or not raw.isdigit() or not 1 <= int(raw) <= top:
            raise errors.BadInput("limit", f"{raw!r} is not a whole number 1-{top}")
        return int(raw)

    def state_of(request: Request) -> str:
        return qparam(request, "state") or "all"

    def threaded(fn: Callable[..., Any], *args: Any) -> Awaitable[Any]:
        return run_in_threadpool(fn, *args)

    # --- pages ---------------------------------------------------------------------------
    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok\n")

    async def login_form(request: Request) -> Response:
        if not config.token:
            return RedirectResponse("/", status_code=303)
        return render(request, "login.html", None, wrong=False)

    async def login(request: Request) -> Response:
        if not config.token:
            return RedirectResponse("/", status_code=303)
        peer = peer_of(request)
        wait = guard.retry_after(peer)
        if wait is not None:
            log(f"rsched web: login refused from {peer}: too many failures")
            return too_many(request, wait)
        given = (await _form(request)).get("token")
        if not isinstance(given, str) or not guard.check_token(given):
            guard.failed(peer)
            log(f"rsched web: login refused from {peer}")
            return render(request, "login.html", None, status=401, wrong=True)
        sid, _ = guard.login()
        resp = RedirectResponse("/", status_code=303)
        resp.set_cookie(
            SESSION_COOKIE,
            sid,
            httponly=True,
            samesite="strict",
            path="/",
            max_age=12 * 3600,
            secure=config.secure_cookie,
        )
        return resp

    async def logout(request: Request) -> Response:
        guard.logout(request.cookies.get(SESSION_COOKIE))
        resp = RedirectResponse("/login" if config.token else "/", status_code=303)
        resp.delete_cookie(SESSION_COOKIE, path="/")
        return resp

    async def overview(request: Request, who: Who) -> Response:
        snap = await threaded(con.snapshot)
        checks = await threaded(con.doctor)
        return render(
            request, "overview.html", who, snap=snap, checks=checks, poll_s=con.overview_poll_s
        )

    async def queue_page(request: Request, who: Who) -> Response:
        from rsched.queue.specs import task_query

        name = request.path_params["queue"]
        query = task_query(
            name,
            state=state_of(request),
            task_type=qparam(request, "type"),
            limit=limit_of(request, PAGE_LIMIT),
        )
        cursor = qparam(request, "cursor")
        stats = await threaded(con.queue, name)
        got = await threaded(con.page, query, cursor)
        nxt = None
        if got.cursor:
            nxt = {"state": query.state, "type": query.type, "cursor": got.cursor}
        return render(
            request,
            "queue.html",
            who,
            q=stats,
            query=query,
            tasks=got.tasks,
            next=nxt,
            first=cursor is not None,
        )

    async def task_page(request: Request, who: Who) -> Response:
        from rsched.queue.specs import task_ref

        ref = task_ref(
            qparam(request, "type") or "",
            qparam(request, "id") or "",
            qparam(request, "queue") or "default",
        )
        t = await threaded(con.task, ref)
        return render(request, "task.html", who, t=t)

    async def cron_page(request: Request, who: Who) -> Response:
        from rsched.core import validate

        name = validate.name(request.path_params["name"], "NAME")
        c = await threaded(con.cron, name)
        if c is None:
            raise errors.NotFound(f"no cron named {name!r} is registered")
        try:
            ticks = await threaded(con.ticks, name)
        except errors.RschedError:
            ticks = []
        runs = await threaded(con.history, name, None, 50)
        live = await threaded(con.running_token, name) if c.running else None
        return render(request, "cron.html", who, c=c, ticks=ticks, runs=runs, live=live)

    async def run_page(request: Request, who: Who) -> Response:
        from rsched.core import validate

        name = validate.name(request.path_params["name"], "NAME")
        token = request.path_params["token"]
        if not token.isascii() or not token.isdigit():
            raise errors.BadInput("token", f"{token!r} is not a run's token (digits)")
        run = await threaded(con.run_log, name, token)
        return render(request, "run.html", who, name=name, run=run)

    async def locks_page(request: Request, who: Who) -> Response:
        rows = await threaded(con.locks, None)
        return render(request, "locks.html", who, locks=rows)

    async def history_page(request: Request, who: Who) -> Response:
        rows = await threaded(
            con.history, qparam(request, "name"), qparam(request, "queue"), limit_of(request, 100)
        )
        audit = await threaded(con.audit, 50)
        return render(
            request,
            "history.html",
            who,
            runs=rows,
            audit=[r.to_json() for r in audit],
            f=request.query_params,
        )

    async def events_page(request: Request, who: Who) -> Response:
        rows = await threaded(_events, limit_of(request, 100))
        return render(request, "events.html", who, events=rows)

    # --- the JSON API (the CLI's --json objects) ----------------------------------------
    async def api_queues(request: Request, who: Who) -> Response:
        from rsched.queue import ops as tasks

        rows = await threaded(tasks.queue_stats, rs)
        return JSONResponse([r.to_json() for r in rows])

    async def api_crons(request: Request, who: Who) -> Response:
        from rsched.cron.admin import list_crons

        rows = await threaded(list_crons, rs)
        return JSONResponse([r.to_json() for r in rows])

    async def api_locks(request: Request, who: Who) -> Response:
        rows = await threaded(con.locks, qparam(request, "pattern"))
        return JSONResponse([r.to_json() for r in rows])

    async def api_history(request: Request, who: Who) -> Response:
        name, queue = qparam(request, "name"), qparam(request, "queue")
        if name and queue:
            raise errors.BadInput("queue", "give name or queue, not both")
        if name:
            from rsched.core import validate

            validate.name(name, "name")
        rows = await threaded(con.history, name, queue, limit_of(request, 50, 100_000))
        return JSONResponse([r.to_json() for r in rows])

    async def api_audit(request: Request, who: Who) -> Response:
        rows = await threaded(con.audit, limit_of(request, 50, 10_000))
        return JSONResponse([r.to_json() for r in rows])

    def _events(limit: int) -> list[Any]:
        return con.events(limit)

    async def api_events(request: Request, who: Who) -> Response:
        rows = await threaded(_events, limit_of(request, 100, 100_000))
        return JSONResponse(rows)

    async def api_tasks(request: Request, who: Who) -> Response:
        from rsched.queue.specs import task_query

        query = task_query(
            qparam(request, "queue") or "default",
            state=state_of(request),
            task_type=qparam(request, "type"),
            limit=limit_of(request, 100, 100_000),
        )
        got = await threaded(con.page, query, qparam(request, "cursor"))
        headers = {}
        if got.cursor:
            params = {
                "queue": query.queue,
                "state": query.state,
                "type": query.type,
                "limit": query.limit,
                "cursor": got.cursor,
            }
            q = urlencode({k: v for k, v in params.items() if v is not None})
            headers["Link"] = f'</api/tasks?{q}>; rel="next"'
        return JSONResponse([t.to_json() for t in got.tasks], headers=headers)

    # --- actions -------------------------------------------------------------------------
    from rsched.tools import actions as A

    def cron_name(request: Request) -> str:
        from rsched.core import validate

        return validate.name(request.path_params["name"], "NAME")

    def queue_name(request: Request) -> str:
        from rsched.core import validate

        return validate.queue(request.path_params["queue"], "queue")

    Act = Callable[[Request, dict[str, Any], Actor], Any]

    def cron_switch(pausing: bool) -> Act:
        return lambda request, body, by: A.switch(
            rs, cron_name(request), None, pausing, False, by=by
        )[0]

    def queue_switch(pausing: bool) -> Act:
        return lambda request, body, by: A.switch(
            rs, None, queue_name(request), pausing, False, by=by
        )[0]

    def trigger(request: Request, body: dict[str, Any], by: Actor) -> Any:
        return A.trigger(rs, cron_name(request), by=by)

    def task_ref_of(body: dict[str, Any]) -> Any:
        from rsched.queue.specs import task_ref

        return task_ref(field(body, "type"), field(body, "id"), body.get("queue") or "default")

    def task_retry(request: Request, body: dict[str, Any], by: Actor) -> Any:
        ref = task_ref_of(body)
        return A.retry(rs, ref.queue, (ref.type, ref.id), by=by)[0]

    def task_cancel(request: Request, body: dict[str, Any], by: Actor) -> Any:
        return A.cancel(rs, task_ref_of(body), by=by)[0]

    def dead_retry(request: Request, body: dict[str, Any], by: Actor) -> Any:
        return A.retry(rs, queue_name(request), None, by=by)[0]

    def dead_purge(request: Request, body: dict[str, Any], by: Actor) -> Any:
        return A.purge_dead(rs, queue_name(request), by=by)[0]

    def lock_unlock(request: Request, body: dict[str, Any], by: Actor) -> Any:
        from rsched.core import validate

        name = validate.name(request.path_params["name"], "NAME")
        token = body.get("token")
        if isinstance(token, int) and not isinstance(token, bool):
            token = str(token)
        if not isinstance(token, str) or not token.isascii() or not token.isdigit():
            raise errors.BadInput("token", "is required: the lock's fencing token (digits)")
        return A.unlock(rs, name, token, by=by)[0]

    routes = [
        Route("/healthz", healthz),
        Route("/login", login_form, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/", page(overview)),
        Route("/queues/{queue}", page(queue_page)),
        Route("/task", page(task_page)),
        Route("/crons/{name}", page(cron_page)),
        Route("/crons/{name}/runs/{token}", page(run_page)),
        Route("/locks", page(locks_page)),
        Route("/history", page(history_page)),
        Route("/events", page(events_page)),
        Route("/api/queues", page(api_queues)),
        Route("/api/crons", page(api_crons)),
        Route("/api/locks", page(api_locks)),
        Route("/api/history", page(api_history)),
        Route("/api/events", page(api_events)),
        Route("/api/audit", page(api_audit)),
        Route("/api/tasks", page(api_tasks)),
        Route("/api/crons/{name}/pause", action("cron.pause", cron_switch(True)), methods=["POST"]),
        Route(
            "/api/crons/{name}/resume", action("cron.resume", cron_switch(False)), methods=["POST"]
        ),
        Route("/api/crons/{name}/trigger", action("cron.trigger", trigger), methods=["POST"]),
        Route(
            "/api/queues/{queue}/pause", action("queue.pause", queue_switch(True)), methods=["POST"]
        ),
        Route(
            "/api/queues/{queue}/resume",
            action("queue.resume", queue_switch(False)),
            methods=["POST"],
        ),
        Route("/api/queues/{queue}/retry-dead", action("dead.retry", dead_retry), methods=["POST"]),
        Route("/api/queues/{queue}/purge-dead", action("dead.purge", dead_purge), methods=["POST"]),
        Route("/api/tasks/retry", action("task.retry", task_retry), methods=["POST"]),
        Route("/api/tasks/cancel", action("task.cancel", task_cancel), methods=["POST"]),
        Route("/api/locks/{name}/unlock", action("lock.unlock", lock_unlock), methods=["POST"]),
        Mount("/static", app=StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    app = Starlette(routes=routes)
    return _Headers(app, config.loopback and not config.token)  # type: ignore[return-value]


class _Headers:
    """ASGI middleware: the security headers on every answer; with no token
    configured, a Host that is not a loopback name is refused (DNS rebinding)."""

    def __init__(self, app: Any, check_host: bool):
        self.app, self.check_host = app, check_host

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.check_host:
            host = dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1")
            if not is_loopback(host_of(host)):
                resp = PlainTextResponse(
                    "refused: this console answers loopback names only (Host)\n", status_code=421
                )
                await _with_headers(resp)(scope, receive, send)
                return

        t0 = time.perf_counter()

        async def send_with(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers") or [])
                took = (time.perf_counter() - t0) * 1000
                headers.append((b"server-timing", f"app;dur={took:.1f}".encode()))
                have = {k.lower() for k, _ in headers}
                for k, v in HEADERS.items():
                    if k.lower().encode() not in have:
                        headers.append((k.lower().encode(), v.encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with)


def _with_headers(resp: Response) -> Response:
    for k, v in HEADERS.items():
        resp.headers[k] = v
    return resp
