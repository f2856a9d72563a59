"""Runs asked for, not scheduled: ``rsched trigger NAME`` and ``run cron B --after A``.

Both become a **run request** in the cron's own hash slot (``cron-trigger-5``):
a JSON member of the ``triggers`` ZSET (``id``, ``by`` (the host that asked),
``cause`` (``manual`` | ``after A``), ``after_token``, ``exp``) plus an entry
on the ``twake`` stream. An idle runner does not sleep but blocks in
``XREAD BLOCK`` on ``twake`` (for as long as it would have slept: its idle
cost stays one heartbeat and one blocking read per 10 s, and one ``ZRANGE``
of the requests after each heartbeat, which also picks up a request whose
wake-up a runner missed while reconnecting). Every live runner wakes; each
calls ``cron-trigger-claim-8`` on the request, and only the one whose ``ZREM``
removed it acts on it: it applies the pause switch and the concurrency policy
at the server's now and, like a tick, takes the run lock and a new fencing
token in the same script; the job then runs like a tick's (watchdog,
history, run log), its record carrying ``cause``, ``triggered_by``,
``trigger`` (the request id) and, after A, ``after_token``.

Bounds. A manual request expires ``TAKE_MS`` (15 s: more than a runner's
heartbeat, so a runner that was reconnecting still sees it) after it was
asked; the asker waits that long for a runner's answer (``BLPOP`` on a reply
list of the request), then withdraws the request (``ZREM``; when that finds it
gone a runner took it that very moment and its answer is read) and exits 3:
a request is never left to fire later. An ``--after`` request expires
``AFTER_MS`` (1 h) after A's run finished.

Concurrency. ``forbid``: a trigger while a run holds the run lock is refused,
recorded ``skipped`` (cause ``manual``) like a tick, and ``trigger`` exits 4
naming the running run: a manual run is asked for now, and queueing it behind
a long job would run it at a time nobody asked for. ``allow``: it runs beside
the running job. ``replace``: the running job is stopped and the triggered run
takes its place (the same hand-over as a tick's; ``_admit.lua`` is the policy of
both). The waiting run's record fields wait beside it (state ``replace_extra``), so
that a run that could not take over (the old one did not stop in time, or a newer
tick superseded it) is recorded ``skipped`` with its cause and request id, and
``--wait`` reports it at once (exit 4).

``--after`` (B after A): each of B's runners follows A's history stream
(``XREAD BLOCK`` on a client of its own; no change to A's runners or
scripts). For each record of A with result ``ok`` it asks for a run of B with
``cron-trigger-5``, which keeps a cursor (``after:A`` = the stream id of A's
record) in B's state: of all B's runners only the first to present a record
queues a request, once; the others get ``seen``. A runner of B that starts
reads A's records from that cursor, so runs of A that finished while no
runner of B was alive are caught up on, as long as they are still in A's
history (its cap) and finished at most ``AFTER_MS`` ago; older ones are
skipped (logged). The first runner of B ever starts from A's newest record.
A sharded A has one record per shard: B runs once per tick of A whose shards all
ended ok, after the last of them (each runner of B reads back over A's latest
records at that one: ``_tick_ok``). A broadcast A has one record per runner and no
count of them: B runs after each ok one.

Sharded and broadcast crons (``trigger`` of them, or B sharded): the request carries
``fire`` (the server's now: every item's fire_ms) and ``items`` (the shard count) or
``runners`` (the runner ids live when asked); it stays queued until every item is
claimed, each once across the runners (``cron-trigger-items-8``, ``HSETNX`` in the
request's ``titems`` hash): a sharded cron's items by rank among the live runners,
and ``STEAL_MS`` later every runner that saw the request takes the items nobody
claimed (a runner that died, as a tick's). Each claiming runner answers the asker
with its items; ``--wait`` waits for every run's record and reports the worst.

Lost runs without a run lock (``allow``, items of sharded and broadcast runs): the
job keeps a marker ``mark:TOKEN`` (PX ``--ttl``, renewed every TTL/3, deleted after
the record is written); ``--wait`` reports ``lost`` once it is gone with no record.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from rsched.core import clients, errors, validate
from rsched.core.timeutil import iso
from rsched.core.transient import TRANSIENT
from rsched.locks.lock import new_owner_id
from rsched.lua import calls

if TYPE_CHECKING:  # pragma: no cover
    from rsched.context import Context
    from rsched.core.keys import CronKeys
    from rsched.cron.spec import CronSpec

#: A manual request not claimed within this is withdrawn and reported (exit 3).
TAKE_MS = 15_000
#: An --after request (and a record of A a runner of B catches up on) is good this long.
AFTER_MS = 3_600_000
#: Requests a runner looks at per wake-up.
TAKE_BATCH = 20
#: The longest blocking read (the runner's heartbeat interval).
BLOCK_S = 10.0
#: A sharded cron's items of a run asked for that no runner claimed this long after a
#: runner's own claim are taken over by the runners that saw it (a runner that died).
STEAL_MS = 2_000
#: Lifetime of the claims of a sharded or broadcast run asked for, and of the answers.
ITEMS_KEEP_MS = 60_000
#: A run without a run lock that the asker waits for: its marker not renewed this long
#: after it was taken (at least; the run's --ttl when longer) means it is lost.
MARK_GRACE_MS = 2_000


class _Clock(Protocol):
    def now(self) -> float: ...


class RequestHost(Protocol):
    """What the run requests need of their runner (:class:`rsched.cron.runner.CronRunner`)."""

    rs: Context
    spec: CronSpec
    k: CronKeys
    host: str
    pid: int
    runner_id: str
    stop: threading.Event
    log: Callable[[str], None]
    debug: Callable[[str], None]

    @property
    def clock(self) -> _Clock: ...

    def _start_job(
        self,
        fire: int,
        token: int,
        owner: str,
        started_ms: int,
        shard: tuple[int, int] | None = None,
        since: float | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None: ...

    def start_replace(self, fire: int, owner: str, extra: dict[str, Any] | None = None) -> None: ...


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _extra(req: Mapping[str, Any], rid: str) -> dict[str, Any]:
    """The record fields of a run asked for."""
    extra: dict[str, Any] = {
        "cause": str(req.get("cause") or "manual"),
        "triggered_by": req.get("by"),
        "trigger": rid,
    }
    if req.get("after_token") is not None:
        extra["after_token"] = req["after_token"]
    return extra


class Inbox:
    """A runner's side of run requests: the blocking wait on ``twake`` (instead of
    a sleep) and the claims."""

    def __init__(self, runner: RequestHost):
        self.r = runner
        self.k = runner.k
        self._blocking = _blocking_client(runner)
        self._cursor = "0-0"
        self._stealing: set[str] = set()

    def start(self) -> None:
        """Called after (re)registering: from the stream's newest entry on, and the
        requests already waiting."""
        got = self.r.rs.redis.xrevrange(self.k.trigger_wake, count=1)
        self._cursor = _s(got[0][0]) if got else "0-0"
        self.take()

    def idle(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` (the runner's sleep) for a request; claim what came."""
        if self.r.stop.is_set():
            return
        ms = max(int(timeout_s * 1000), 1)
        got = self._blocking.call(
            lambda c: c.xread({self.k.trigger_wake: self._cursor}, count=100, block=ms)
        )  # None: interrupted by close() at stop
        if got:
            entries = got[0][1]
            self._cursor = _s(entries[-1][0])
            self.take()

    def take(self) -> None:
        """Claim the waiting requests (each at most once across all runners)."""
        r = self.r
        members = r.rs.redis.zrange(self.k.triggers, 0, TAKE_BATCH - 1)
        for m in members:
            text = _s(m)
            try:
                req = json.loads(text)
                rid = str(req["id"])
                validate.name(rid, "request id")
            except (ValueError, KeyError, TypeError, errors.BadInput):
                r.rs.redis.zrem(self.k.triggers, m)  # not ours: never acted on
                continue
            if "items" in req or "runners" in req:
                self._claim_items(text, req, rid, "own")
            else:
                self._claim(text, req, rid)

    def _claim_items(self, text: str, req: Mapping[str, Any], rid: str, mode: str) -> None:
        """A run asked for of a sharded or broadcast cron: this runner's items of it
        (each item once across the runners); a sharded one's unclaimed items are taken
        over STEAL_MS later (a runner that died), as a tick's are."""
        r = self.r
        res = calls.cron_trigger_items(
            r.rs,
            self.k,
            request=text,
            request_id=rid,
            mode=mode,
            runner=r.runner_id,
            history_maxlen=r.rs.history_maxlen,
            name=r.spec.name,
            host=r.host,
            pid=r.pid,
            keep_ms=ITEMS_KEEP_MS,
        )
        extra = _extra(req, rid)
        total = int(req["items"]) if "items" in req else 0
        for item, token in res.items:
            r.log(
                f"cron {r.spec.name}: run asked for ({extra['cause']}, by {req.get('by')}): "
                + (f"running shard {item}" if total else "running it")
                + f", token {token}"
            )
            shard = (int(item), total) if total else (0, 1)
            r._start_job(res.fire_ms, token, "", res.now_ms, shard=shard, extra=extra)
        if res.status in ("paused", "expired"):
            r.log(f"cron {r.spec.name}: run asked for ({extra['cause']}): {res.status}")
        if res.status == "ok" and mode == "own" and total and rid not in self._stealing:
            self._stealing.add(rid)
            t = threading.Timer(STEAL_MS / 1000, self._steal, args=(text, req, rid))
            t.daemon = True
            t.start()

    def _steal(self, text: str, req: Mapping[str, Any], rid: str) -> None:
        try:
            if not self.r.stop.is_set():
                self._claim_items(text, req, rid, "steal")
        except Exception as exc:  # noqa: BLE001 - the next heartbeat's take() retries
            self.r.debug(f"cron {self.r.spec.name}: taking over items of {rid}: {exc}")
        finally:
            self._stealing.discard(rid)

    def _claim(self, text: str, req: Mapping[str, Any], rid: str) -> None:
        r, s = self.r, self.r.spec
        owner = new_owner_id()
        sent = time.monotonic()
        res = calls.cron_trigger_claim(
            r.rs,
            self.k,
            request=text,
            request_id=rid,
            owner=owner,
            ttl_ms=s.ttl_ms,
            host=r.host,
            pid=r.pid,
            concurrency=s.concurrency,
            history_maxlen=r.rs.history_maxlen,
            name=s.name,
        )
        extra = _extra(req, rid)
        what = f"cron {s.name}: run asked for ({extra['cause']}, by {req.get('by')})"
        st = res.status
        if st == "run":
            assert res.token is not None
            r.log(f"{what}: running it, token {res.token}")
            r._start_job(
                res.now_ms,
                res.token,
                owner if s.concurrency != "allow" else "",
                res.now_ms,
                since=sent,
                extra=extra,
            )
        elif st == "replace":
            r.log(f"{what}: the running job is asked to stop")
            r.start_replace(res.now_ms, owner, extra)
        elif st in ("skipped", "paused", "expired"):
            r.log(f"{what}: {st}")

    def close(self) -> None:
        """Interrupt a blocked wait (at stop), whenever it comes."""
        self._blocking.close()


class AfterFollower:
    """One runner of B following A's history: each ok record of A becomes one run
    request of B (once across B's runners: the cursor in cron-trigger-5)."""

    def __init__(self, runner: RequestHost, after: str):
        self.r = runner
        self.after = after
        self.ak = runner.rs.keys.cron(after)
        self._blocking = _blocking_client(runner)
        self.thread = threading.Thread(
            target=self.run, daemon=True, name=f"rsched-after-{runner.spec.name}-{after}"
        )

    def start(self) -> AfterFollower:
        self.thread.start()
        return self

    def _cursor(self) -> str:
        """B's shared cursor on A; the first runner of B ever sets it to A's newest
        record (from then on, runs of A while B is down are caught up on)."""
        r = self.r
        field = f"after:{self.after}"
        cur = r.rs.redis.hget(r.k.state, field)
        if cur is not None:
            return _s(cur)
        got = r.rs.redis.xrevrange(self.ak.history, count=1)
        r.rs.redis.hsetnx(r.k.state, field, _s(got[0][0]) if got else "0-0")
        return _s(r.rs.redis.hget(r.k.state, field) or "0-0")

    def run(self) -> None:
        r = self.r
        cursor: str | None = None
        backoff = 0.2
        while not r.stop.is_set() and not self._blocking.closed:
            try:
                if cursor is None:
                    cursor = self._cursor()
                got = self._blocking.call(partial(_xread, {self.ak.history: cursor}))
                for entry_id, fields in got[0][1] if got else []:
                    cursor = _s(entry_id)
                    self._entry(cursor, fields)
                backoff = 0.2
            except Exception as exc:  # noqa: BLE001 - follows through outages
                if r.stop.is_set() or self._blocking.closed:
                    return
                if not isinstance(exc, TRANSIENT):
                    r.log(f"cron {r.spec.name}: following {self.after}: {exc}")
                cursor = None  # re-read the shared cursor when back
                r.stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)

    def _entry(self, entry_id: str, fields: Mapping[Any, Any]) -> None:
        r = self.r
        raw = fields.get("j", fields.get(b"j"))
        try:
            rec = json.loads(_s(raw))
        except (TypeError, ValueError):
            return
        if not isinstance(rec, dict) or rec.get("kind") != "cron":
            return
        if rec.get("result") != "ok" or rec.get("name") != self.after:
            return
        total = rec.get("shard_total")
        if isinstance(total, int) and not self._tick_ok(entry_id, rec, total):
            return  # a shard of a sharded A: B runs once its tick's last shard ended ok
        token = rec.get("token")
        finished = rec.get("finished_ms")
        if isinstance(finished, int | float) and r.clock.now() - finished > AFTER_MS:
            r.log(
                f"cron {r.spec.name}: run of {self.after} (token {token}) finished "
                f"{iso(int(finished))}, more than an hour ago: not run after it"
            )
            return
        res = calls.cron_trigger(
            r.rs,
            r.k,
            request={
                "id": f"a{new_owner_id()[:16]}",
                "by": r.host,
                "cause": f"after {self.after}",
                "after_token": token,
            },
            ttl_ms=AFTER_MS,
            after=self.after,
            entry=entry_id,
        )
        r.debug(f"cron {r.spec.name}: after {self.after} token {token}: {res.status}")

    def _tick_ok(self, entry_id: str, rec: Mapping[str, Any], total: int) -> bool:
        """Whether every shard of this record's tick (same fire_ms and trigger) has an
        ok record up to ``entry_id``: true for exactly one record of a tick whose
        shards all ended ok (each shard runs once a tick), the last of them. Read
        back from ``entry_id`` (its shards' records are among the latest few)."""
        fire, trig = rec.get("fire_ms"), rec.get("trigger")
        ok: set[int] = set()
        for _eid, fields in self.r.rs.redis.xrevrange(
            self.ak.history, max=entry_id, count=max(8 * total, 200)
        ):
            raw = fields.get("j", fields.get(b"j"))
            try:
                other = json.loads(_s(raw))
            except (TypeError, ValueError):
                continue
            if not isinstance(other, dict) or other.get("name") != self.after:
                continue
            if other.get("fire_ms") != fire or other.get("trigger") != trig:
                continue
            if other.get("result") == "ok" and isinstance(other.get("shard"), int):
                ok.add(int(other["shard"]))
        return len(ok) >= total

    def close(self) -> None:
        self._blocking.close()


def _xread(streams: dict[str, str], client: Any) -> Any:
    return client.xread(streams, count=100, block=int(BLOCK_S * 1000))


def _blocking_client(runner: RequestHost) -> clients.Interruptible:
    """The client of a runner's blocking reads, which its stop ends at once."""
    return clients.Interruptible(
        lambda: clients.clone(runner.rs.redis, socket_timeout=BLOCK_S + 10, max_connections=2)
    )


# --- cycles -------------------------------------------------------------------------------
def check_cycles(
    edges: Mapping[str, Sequence[str]], roots: Sequence[str] = (), field: str = "--after"
) -> None:
    """Refuse (BadInput, exit 2) a cycle in the ``B -> [A...]`` "runs after" graph;
    searched from ``roots`` first (the crons being started: the message starts there)."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(n: str) -> None:
        state[n] = 1
        path.append(n)
        for m in edges.get(n, ()):
            if state.get(m) == 1:
                cyc = path[path.index(m) :] + [m]
                raise errors.BadInput(
                    field, f"a cycle of crons running after each other: {' after '.join(cyc)}"
                )
            if m not in state:
                visit(m)
        path.pop()
        state[n] = 2

    for n in [*roots, *sorted(edges)]:
        if n not in state:
            visit(n)


def registered_after(rs: Context, names: Sequence[str]) -> dict[str, list[str]]:
    """What runners registered: cron -> the crons it runs after (state field ``after``),
    for the crons reachable from ``names``."""
    out: dict[str, list[str]] = {}
    todo = list(names)
    while todo:
        n = todo.pop()
        if n in out:
            continue
        raw = rs.redis.hget(rs.keys.cron(n).state, "after")
        deps = [d for d in _s(raw).split(",") if d] if raw else []
        out[n] = deps
        todo.extend(deps)
    return out


# --- the asker ----------------------------------------------------------------------------
def trigger(
    rs: Context,
    name: str,
    *,
    wait: bool = False,
    timeout_ms: int | None = None,
    host: str | None = None,
    on_taken: Callable[[dict[str, Any]], None] | None = None,
    take_ms: int = TAKE_MS,
) -> dict[str, Any]:
    """Ask the cron's live runners to run it now; returns ``{name, id, status, host,
    token, triggered_by}`` once a runner took it, plus with ``wait`` the run's
    ``result``, ``exit_code``, ``error`` and ``timed_out`` (True when ``timeout_ms``
    ran out first). Raises :class:`errors.NotFound` (unknown, no runner, not
    taken in time) or :class:`errors.Conflict` (paused, previous run active)."""
    validate.name(name, "NAME")
    k = rs.keys.cron(name)
    by = host or str(rs.identity()["host"])
    rid = f"m{new_owner_id()[:16]}"
    last = rs.redis.xrevrange(k.history, count=1)
    since = _s(last[0][0]) if last else "0-0"
    res = calls.cron_trigger(
        rs, k, request={"id": rid, "by": by, "cause": "manual"}, ttl_ms=take_ms
    )
    st = res.status
    if st == "unknown":
        raise errors.NotFound(
            f'no cron "{name}": no runner ever registered it (run it once here: '
            f"rsched run cron {name} --once ... -- CMD)"
        )
    if st == "no-runner":
        raise errors.NotFound(
            f"cron {name}: no live runner to run it (start one: rsched run cron {name} ...; "
            f"or run it once here: rsched run cron {name} --once ... -- CMD)"
        )
    if st == "paused":
        raise errors.Conflict(f"cron {name} is paused: rsched resume {name} first")
    # Blocking reads on a client of their own (longer than the shared one's socket timeout).
    client = clients.clone(rs.redis, socket_timeout=max(take_ms / 1000, 30) + 10, max_connections=1)
    try:
        if res.items:
            return _answer_items(
                rs, client, name, k, rid, by, since, res, wait, timeout_ms, on_taken, take_ms
            )
        return _answer(
            rs,
            client,
            name,
            k,
            rid,
            by,
            since,
            res.live_runners,
            wait,
            timeout_ms,
            on_taken,
            take_ms,
        )
    finally:
        clients.close(client)


def _not_taken(name: str, take_ms: int, live: int) -> errors.NotFound:
    return errors.NotFound(
        f"cron {name}: no runner took the run within {take_ms / 1000:g}s "
        f"({live} registered; they may have died); the request was withdrawn"
    )


def _answer(
    rs: Context,
    client: Any,
    name: str,
    k: Any,
    rid: str,
    by: str,
    since: str,
    live: int,
    wait: bool,
    timeout_ms: int | None,
    on_taken: Callable[[dict[str, Any]], None] | None,
    take_ms: int,
) -> dict[str, Any]:
    reply_key = k.trigger_reply(rid)
    got = client.blpop([reply_key], timeout=take_ms / 1000)
    if not got:
        got = _withdraw(rs, client, k, rid, reply_key)
    if not got:
        raise _not_taken(name, take_ms, live)
    ans = json.loads(_s(got[1]))
    out: dict[str, Any] = {
        "name": name,
        "id": rid,
        "status": ans.get("status"),
        "host": ans.get("host"),
        "token": ans.get("token"),
        "triggered_by": by,
    }
    if ans.get("status") == "paused":
        raise errors.Conflict(f"cron {name} is paused: rsched resume {name} first")
    if ans.get("status") == "skipped":
        raise errors.Conflict(f"cron {name}: not run: {ans.get('message')}")
    if on_taken is not None:
        on_taken(out)
    if wait:
        expect: dict[int | None, _Watch] = {}
        if ans.get("status") == "run":
            # The run lock shows a run that ended with no record (its runner died): lost;
            # a run without one (allow) is watched by its marker (see JobRun).
            lockless = rs.redis.hget(k.state, "concurrency") == "allow"
            expect[int(out["token"])] = _Watch("mark" if lockless else "lock", _grace_s(rs, k))
        else:  # replace: the token is known once the old run stopped and this one took the lock
            expect[None] = _Watch("replace", 2.0, fire=ans.get("fire_ms"))
        got_runs = _wait_records(client, k, rid, since, timeout_ms, expect)
        if got_runs is None:
            out.update({"result": None, "exit_code": None, "timed_out": True})
        else:
            run = next(iter(got_runs.values()))
            out.update({kk: run.get(kk) for kk in ("result", "exit_code", "error")})
            out["timed_out"] = False
            if out.get("token") is None:
                out["token"] = run.get("token")
    return out


def _answer_items(
    rs: Context,
    client: Any,
    name: str,
    k: Any,
    rid: str,
    by: str,
    since: str,
    res: calls.CronTriggerReply,
    wait: bool,
    timeout_ms: int | None,
    on_taken: Callable[[dict[str, Any]], None] | None,
    take_ms: int,
) -> dict[str, Any]:
    """A sharded (every shard once) or broadcast (every runner live when asked) cron:
    the answers of every runner that claimed items, until all are claimed or
    ``take_ms`` ran out (then the request is withdrawn: the rest are ``missing``)."""
    reply_key = k.trigger_reply(rid)
    total = res.items
    runs: list[dict[str, Any]] = []

    def absorb(raw: Any) -> None:
        ans = json.loads(_s(raw))
        if ans.get("status") == "paused":
            raise errors.Conflict(f"cron {name} is paused: rsched resume {name} first")
        for run in ans.get("runs") or []:
            runs.append(
                {"item": run.get("item"), "host": ans.get("host"), "token": run.get("token")}
            )

    deadline = time.monotonic() + take_ms / 1000
    withdrawn = False
    while len(runs) < total:
        left = deadline - time.monotonic()
        if left > 0:
            got = client.blpop([reply_key], timeout=max(left, 0.01))
            if got:
                absorb(got[1])
            continue
        if withdrawn:
            break
        withdrawn = True
        if _withdraw(rs, client, k, rid, reply_key, drain=False):
            # Out of the queue: no claim after this; the answers of those before it.
            # (BLPOP with a short timeout: LPOP is not in the least-privilege grant)
            while got := client.blpop([reply_key], timeout=0.05):
                absorb(got[1])
            break
        deadline = time.monotonic() + 2  # all claimed meanwhile: the answers are on the way
    if not runs:
        raise _not_taken(name, take_ms, res.live_runners)
    runs.sort(key=lambda r: int(r["token"]))
    out: dict[str, Any] = {
        "name": name,
        "id": rid,
        "status": "run",
        "host": runs[0]["host"],
        "token": runs[0]["token"],
        "triggered_by": by,
        "runs": runs,
        "missing": total - len(runs),
    }
    if on_taken is not None:
        on_taken(out)
    if not wait:
        return out
    grace = _grace_s(rs, k)
    expect: dict[int | None, _Watch] = {int(r["token"]): _Watch("mark", grace) for r in runs}
    got_runs = _wait_records(client, k, rid, since, timeout_ms, expect)
    if got_runs is None:
        out.update({"result": None, "exit_code": None, "timed_out": True})
        return out
    for r in runs:
        rec = got_runs[int(r["token"])]
        r.update({kk: rec.get(kk) for kk in ("result", "exit_code", "error")})
    results = list(runs)
    if out["missing"]:
        results.append(
            {"result": "missed", "exit_code": None, "error": f"{out['missing']} not taken"}
        )
    worst = max(results, key=_badness)
    out.update({kk: worst.get(kk) for kk in ("result", "exit_code", "error")})
    out["timed_out"] = False
    return out


#: How bad a run's result is, for the worst of several (``trigger --wait`` of a
#: sharded or broadcast cron).
_BAD = {"ok": 0, "skipped": 1, "failed": 2, "timeout": 3, "missed": 4, "lost": 5}


def _badness(run: Mapping[str, Any]) -> tuple[int, int]:
    code = run.get("exit_code")
    return (_BAD.get(str(run.get("result")), 2), code if isinstance(code, int) else 0)


def _grace_s(rs: Context, k: Any) -> float:
    ttl = rs.redis.hget(k.state, "ttl_ms")
    return max(int(ttl or 0), MARK_GRACE_MS) / 1000


def _withdraw(
    rs: Context, client: Any, k: Any, rid: str, reply_key: str, drain: bool = True
) -> Any:
    """Remove our unclaimed request (True without ``drain``); when a runner took it
    meanwhile, its answer (``drain``; else None)."""
    for m in rs.redis.zrange(k.triggers, 0, -1):
        try:
            if json.loads(_s(m)).get("id") == rid and rs.redis.zrem(k.triggers, m):
                return None if drain else True
        except ValueError:
            continue
    return client.blpop([reply_key], timeout=2) if drain else None


class _Watch:
    """How ``--wait`` notices a run that ended with no record: ``lock`` (its run lock
    is no longer of its token), ``mark`` (its marker, renewed while it runs, is gone
    ``grace_s`` after it was taken) or ``replace`` (a run waiting to replace: once
    the run lock carries its fire_ms, as ``lock`` with the token found there)."""

    def __init__(self, how: str, grace_s: float, fire: Any = None):
        self.how = how
        self.grace_s = grace_s
        self.since = time.monotonic()
        self.fire = fire  # replace: the run's fire_ms, in the run lock once it took it
        self.token: str | None = None  # replace: the token found in the run lock
        self._free_since: float | None = None

    def gone(self, client: Any, k: Any, token: int | None) -> bool:
        if self.how == "lock":
            return _s(client.hget(k.run_lock, "token") or "") != str(token)
        if self.how == "replace":
            return self._replace_gone(client, k)
        if self.how == "mark" and token is not None:
            if time.monotonic() - self.since < self.grace_s:
                return False
            return not client.exists(k.run_mark(token))
        return False

    def _replace_gone(self, client: Any, k: Any) -> bool:
        """A run waiting to replace is either waiting (the state's replace_fire is its
        fire_ms), running (the run lock's fire is) or recorded (each step of cron-start-5,
        cron-finish-6 and a superseding tick is one script): neither, with no record,
        means its runner died. Waiting with the lock free for ``grace_s`` (its runner
        polls every 100 ms at most): the waiting runner died."""
        fire, tok = (
            _s(v) if v is not None else None for v in client.hmget(k.run_lock, "fire", "token")
        )
        ours = str(self.fire)
        if fire == ours:
            self.token = tok
            self._free_since = None
            return False
        if _s(client.hget(k.state, "replace_fire") or "") != ours:
            return True
        if tok is not None:  # the old run still holds it
            self._free_since = None
            return False
        now = time.monotonic()
        if self._free_since is None:
            self._free_since = now
        return now - self._free_since >= self.grace_s


def _wait_records(
    client: Any,
    k: Any,
    rid: str,
    since: str,
    timeout_ms: int | None,
    expect: dict[int | None, _Watch],
) -> dict[int | None, dict[str, Any]] | None:
    """Follow the cron's history (XREAD BLOCK) until the record of each expected run
    (by token; ``None``: the request's one run, token not known) appeared; None when
    ``timeout_ms`` ran out. Every 5 s of silence (or the marker's grace, when shorter)
    each run is checked: one that ended with no record (its run lock taken over or
    expired, its marker expired: its runner died) is ``lost`` (cron-finish-6 writes the
    record and frees the lock in one step; a marker goes after the record)."""
    deadline = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000
    cursor = since
    out: dict[int | None, dict[str, Any]] = {}
    gone: set[int | None] = set()
    period = min([5.0, *(max(w.grace_s / 2, 0.5) for w in expect.values() if w.grace_s)])
    while len(out) < len(expect):
        left = period if deadline is None else min(deadline - time.monotonic(), period)
        if left <= 0:
            return None
        block = None if gone else max(int(left * 1000), 1)
        got = client.xread({k.history: cursor}, count=100, block=block)
        if not got and gone:
            for t in gone - set(out):
                w = expect[t]
                out[t] = {
                    "result": "lost",
                    "exit_code": None,
                    "error": "the run ended with no record (its run lock or marker expired): "
                    "its runner died",
                    "token": t if t is not None else (int(w.token) if w.token else None),
                }
            gone = set()
            continue
        if not got:
            gone = {t for t, w in expect.items() if t not in out and w.gone(client, k, t)}
        for entry_id, fields in got[0][1] if got else []:
            cursor = _s(entry_id)
            raw = fields.get("j", fields.get(b"j"))
            try:
                rec = json.loads(_s(raw))
            except (TypeError, ValueError):
                continue
            if not isinstance(rec, dict) or rec.get("trigger") != rid:
                continue
            tok = rec.get("token")
            key: int | None = tok if tok in expect else (None if None in expect else tok)
            if key in expect and key not in out:
                out[key] = {
                    "result": rec.get("result"),
                    "exit_code": rec.get("exit_code"),
                    "error": rec.get("error") or None,
                    "token": tok,
                }
    return out


def exit_status(out: Mapping[str, Any]) -> int:
    """``trigger --wait``'s exit status: the job's (the worst run's, for a sharded or
    broadcast cron); 4 for a run recorded ``skipped`` (under replace the old run did
    not stop in time); 1 when it has none (lost, missed) or --timeout ran out."""
    if out.get("timed_out"):
        return 1
    if out.get("result") == "ok":
        return 0
    if out.get("result") == "skipped":
        return 4
    code = out.get("exit_code")
    return int(code) if isinstance(code, int) and 0 < code < 256 else 1


__all__ = [
    "AFTER_MS",
    "TAKE_MS",
    "AfterFollower",
    "Inbox",
    "check_cycles",
    "exit_status",
    "registered_after",
    "trigger",
]
