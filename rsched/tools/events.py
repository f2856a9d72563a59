"""Events and alerts (SPEC §4): what happened, told to someone, once.

Recording. An event is written by the Lua script that records its cause, in
the same step, into the ``events`` stream beside the source's history (same
hash tag: works on Redis Cluster): ``cron-finish-6`` (run.failed, run.lost,
run.recovered), ``cron-tick-9`` (tick.missed), ``fail-10`` (task.dead),
``lock-release-5`` (an ``exec`` run's run.failed / run.lost) and
``event-silent-2`` (cron.silent, written by whichever live loop or
``rsched check`` notices the silence first; the cron's state field
``silent_fire`` makes it one per silence). A runner killed right after the
cause loses nothing: the event is already in Redis. Each stream is capped
(``EVENTS_MAXLEN`` entries, approximate trimming).

Delivery. Each sink has an id (a digest of its definition, secrets left out)
and one consumer group of that id on every events stream it serves. Every
process configured with the sink (the same ``[[alerts]]`` table, or the same
quick-use flag for the same names) is a consumer of that group: XREADGROUP
hands each new event to exactly one of them, so a sink gets an event once,
not once per runner. A failed attempt stays in the group's pending list (its
delivery count is the attempt number); it is retried when it has been idle
for the backoff (1 s doubling: 1, 2, 4 ... 64 s, 8 attempts over 127 s),
by its owner, or by another consumer once also the sink's timeout has passed
(the owner died). After the 8th failure it is acknowledged and recorded
``failed``. Delivery runs in a thread: it never blocks a run loop.

Quiet. The thread does not poll: one ``XREAD BLOCK`` (10 s) over every events
stream it serves, shared by all its sinks, wakes it when one has something
new, and only then does it read that stream's groups. It looks at pending
entries only when it knows of some (its own failed attempt's backoff; those a
scan finds when it starts serving a stream; a woken stream's, once the sink's
timeout passed: a dead owner's). See :class:`Deliverer`.

Outcomes: an event the group has read and not pending is ``delivered``
(after one attempt), unless ``evdone`` says otherwise (outcomes that took a
retry or failed, trimmed with the stream). A sink only takes events recorded
after it was first seen (``{ns}:alert-sinks``), so a new sink does not
replay the past.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rsched.core.defaults import EVENTS_MAXLEN, host_id
from rsched.core.errors import BadInput
from rsched.core.timeutil import iso

if TYPE_CHECKING:  # pragma: no cover
    from rsched.context import Context as Rsched

#: The event names (SPEC §4).
EVENTS = ("run.failed", "run.lost", "tick.missed", "task.dead", "cron.silent", "run.recovered")
#: The fields of an event's JSON, in order (absent values are null).
FIELDS = (
    "event",
    "event_id",
    "at",
    "at_ms",
    "kind",
    "name",
    "queue",
    "type",
    "id",
    "fire_at",
    "result",
    "exit_code",
    "error",
    "host",
    "attempt",
    "token",
)
#: Attempts before a delivery is ``failed``, and the first retry's delay (doubling).
MAX_ATTEMPTS = 8
BACKOFF_BASE_MS = 1000
DEFAULT_TIMEOUT_MS = 5000
ALERT_KEYS = {"events", "match", "command", "url", "timeout", "secret_file", "secret_env"}
#: Consumer group prefix of a sink on an events stream.
GROUP_PREFIX = "alert:"


def backoff_ms(attempts: int) -> int:
    """The idle time before attempt ``attempts + 1``: 1 s doubling."""
    base = int(os.environ.get("RSCHED_TEST_ALERT_BACKOFF_MS") or BACKOFF_BASE_MS)
    return base * (1 << max(0, min(attempts, 20) - 1))


# --- sinks ---------------------------------------------------------------------


@dataclass
class Sink:
    """One alert sink: a command (argv, event JSON on stdin) or a webhook."""

    command: list[str] | None = None
    url: str | None = None
    events: tuple[str, ...] | None = None  # None: all
    match: str = "*"
    timeout_ms: int = DEFAULT_TIMEOUT_MS
    secret: bytes | None = field(default=None, repr=False)
    #: Quick-use flags: the source tags ("c:NAME", "q:QUEUE", "l:NAME") served; None: all.
    sources: frozenset[str] | None = None

    def __repr__(self) -> str:  # never the secret
        return f"Sink({self.describe()!r})"

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "command" if self.command else "url",
            "target": self.command[0] if self.command else _redact(self.url or ""),
            "events": list(self.events) if self.events else None,
            "match": self.match,
            "sources": sorted(self.sources) if self.sources is not None else None,
        }

    @property
    def id(self) -> str:
        ident = json.dumps(
            [self.command, self.url, self.events, self.match, sorted(self.sources or [])]
        )
        return hashlib.sha256(ident.encode()).hexdigest()[:16]

    def wants(self, ev: Mapping[str, Any]) -> bool:
        if self.events is not None and ev.get("event") not in self.events:
            return False
        target = ev.get("name") or ev.get("type") or ""
        return fnmatch.fnmatchcase(str(target), self.match)

    def deliver(self, body: bytes, event: str) -> str | None:
        """One attempt: None when delivered, else why not (one line, no secret)."""
        t = self.timeout_ms / 1000
        if self.command:
            try:
                p = subprocess.run(
                    self.command,
                    input=body,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    timeout=t,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                return f"timed out after {t:g}s"
            except OSError as exc:
                return f"cannot run {self.command[0]}: {exc.strerror}"
            if p.returncode != 0:
                tail = p.stderr.decode("utf-8", "replace").strip().splitlines()[-1:]
                return f"exit {p.returncode}" + (f": {tail[0][:200]}" if tail else "")
            return None
        import urllib.error
        import urllib.request

        headers = {"Content-Type": "application/json", "X-Rsched-Event": event}
        if self.secret is not None:
            sig = hmac.new(self.secret, body, hashlib.sha256).hexdigest()
            headers["X-Rsched-Signature"] = f"sha256={sig}"
        req = urllib.request.Request(str(self.url), data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=t) as resp:  # noqa: S310 - http(s) checked
                if 200 <= resp.status < 300:
                    return None
                return f"HTTP {resp.status}"
        except urllib.error.HTTPError as exc:
            return f"HTTP {exc.code}"
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            return f"POST failed: {str(reason)[:200]}"


def _redact(url: str) -> str:
    from urllib.parse import urlsplit

    try:
        u = urlsplit(url)
    except ValueError:
        return "?"
    host = u.hostname or ""
    port = f":{u.port}" if u.port else ""
    return f"{u.scheme}://{host}{port}{u.path}"


def check_url(url: Any, where: str) -> str:
    from urllib.parse import urlsplit

    rule = "an http:// or https:// URL with a host"
    if not isinstance(url, str):
        raise BadInput(where, f"{url!r} is not {rule}")
    try:
        u = urlsplit(url)
        _ = u.port
    except ValueError:
        raise BadInput(where, f"{url!r} is not {rule}") from None
    if u.scheme not in ("http", "https") or not u.hostname:
        raise BadInput(where, f"{_redact(url)!r} is not {rule}")
    return url


def _read_secret(table: Mapping[str, Any], where: str) -> bytes | None:
    if "secret_file" in table and "secret_env" in table:
        raise BadInput(f"{where}.secret_file", "give secret_file or secret_env, not both")
    if "secret_file" in table:
        p = table["secret_file"]
        try:
            text = Path(str(p)).read_text(encoding="utf-8")
        except OSError as exc:
            raise BadInput(f"{where}.secret_file", f"cannot read {p} ({exc.strerror})") from None
    elif "secret_env" in table:
        var = table["secret_env"]
        text = os.environ.get(str(var)) or ""
        if not text:
            raise BadInput(f"{where}.secret_env", f"${var} is not set or empty")
    else:
        return None
    if text.endswith("\n"):
        text = text[:-1]
    return text.encode("utf-8")


def parse_alerts(tables: Any, path: Path | None) -> list[Sink]:
    """``[[alerts]]`` tables -> sinks; a bad one is :class:`BadInput` naming it."""
    from rsched.core.timeutil import parse_duration
    from rsched.runtime.proc import split_command

    if tables is None:
        return []
    if not isinstance(tables, list):
        raise BadInput(f"config {path}: alerts", "must be [[alerts]] tables")
    out = []
    for i, t in enumerate(tables, 1):
        where = f"config {path}: alerts[{i}]"
        if not isinstance(t, dict):
            raise BadInput(where, "must be a table")
        unknown = sorted(set(t) - ALERT_KEYS)
        if unknown:
            raise BadInput(
                f"{where}.{unknown[0]}", f"not a setting (known: {', '.join(sorted(ALERT_KEYS))})"
            )
        if ("command" in t) == ("url" in t):
            raise BadInput(where, 'give one sink: command = ["argv", ...] or url = "https://..."')
        s = Sink()
        if "command" in t:
            s.command = split_command(t["command"], f"{where}.command")
        else:
            s.url = check_url(t["url"], f"{where}.url")
            s.secret = _read_secret(t, where)
        if "events" in t:
            ev = t["events"]
            if not isinstance(ev, list) or not ev or any(e not in EVENTS for e in ev):
                raise BadInput(f"{where}.events", f"{ev!r} must be a list of: {', '.join(EVENTS)}")
            s.events = tuple(ev)
        if "match" in t:
            if not isinstance(t["match"], str) or not t["match"]:
                raise BadInput(f"{where}.match", f"{t['match']!r} must be a glob like 'nightly-*'")
            s.match = t["match"]
        if "timeout" in t:
            s.timeout_ms = parse_duration(t["timeout"], f"{where}.timeout")
            if s.timeout_ms <= 0:
                raise BadInput(f"{where}.timeout", "must be more than 0")
        out.append(s)
    return out


def quick_sinks(commands: Sequence[str], urls: Sequence[str], sources: Iterable[str]) -> list[Sink]:
    """``--alert-command`` / ``--alert-url``: every event of the loop's own names."""
    from rsched.runtime.proc import split_command

    src = frozenset(sources)
    out = [Sink(command=split_command(c, "--alert-command"), sources=src) for c in commands]
    out += [Sink(url=check_url(u, "--alert-url"), sources=src) for u in urls]
    return out


# --- recorded events -----------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """A stream of events: a cron ("c"), a queue ("q") or a lock / exec ("l").
    ``tag`` names the stream ("q:orders#3" for a partition: event ids use it);
    ``owner`` is what a quick-use sink serves ("q:orders" for every partition)."""

    tag: str
    events: str
    done: str
    owner: str = ""

    @property
    def serves(self) -> str:
        return self.owner or self.tag


def source(rs: Rsched, tag: str) -> Source:
    """The source of one tag ("c:NAME", "q:QUEUE" or "q:QUEUE#i", "l:NAME")."""
    from rsched.core.keys import logical_queue

    kind, _, n = tag.partition(":")
    if kind == "q":
        q = rs.keys.queue(n)
        return Source(tag, q.events, q.events_done, f"q:{logical_queue(n)}")
    k = rs.keys.cron(n) if kind == "c" else rs.keys.lock(n)
    return Source(tag, k.events, k.events_done, tag)


def sources(rs: Rsched) -> list[Source]:
    """Every source of the namespace: each registered cron, lock and queue (a
    partitioned queue as its partitions, ``queue-config``)."""
    from rsched.core.keys import partition_name

    pipe = rs.redis.pipeline(transaction=False)
    pipe.smembers(rs.keys.crons)
    pipe.smembers(rs.keys.queues)
    pipe.smembers(rs.keys.locks)
    pipe.hgetall(rs.keys.queue_config)
    crons, queues, locks, config = pipe.execute()
    counts = {_s(q): _s(n) for q, n in (config or {}).items()}
    tags = [f"c:{n}" for n in sorted(_s(x) for x in crons)]
    for q in sorted(_s(x) for x in queues):
        n = int(counts[q]) if counts.get(q, "").isdigit() else 1
        tags += [f"q:{q}"] if n <= 1 else [f"q:{partition_name(q, i)}" for i in range(n)]
    tags += [f"l:{n}" for n in sorted(_s(x) for x in locks)]
    return [source(rs, t) for t in tags]


def _s(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def render(src: Source, entry_id: str, raw: Any) -> dict[str, Any]:
    """A stream entry -> the event's JSON object (SPEC field order, nulls)."""
    try:
        f = json.loads(_s(raw))
    except ValueError:
        f = {}
    out: dict[str, Any] = dict.fromkeys(FIELDS)
    for k in FIELDS:
        if k in f:
            out[k] = f[k]
    out["event_id"] = f"{src.tag}/{entry_id}"
    out["at"] = iso(f.get("at_ms"))
    fire = f.get("fire_ms")
    out["fire_at"] = iso(int(fire)) if fire is not None else None
    if out["kind"] == "task" and out["queue"] is None and src.tag.startswith("q:"):
        out["queue"] = src.tag[2:]
    return out


def note_silent(rs: Rsched, name: str, fire_ms: int, seen_ms: int) -> bool:
    """Record ``cron.silent`` for ``name``'s unrun tick ``fire_ms`` unless this
    silence (nothing ran since ``seen_ms``) has one already. Whether it was new."""
    from rsched.lua import calls

    return calls.event_silent(
        rs, rs.keys.cron(name), name=name, fire_ms=fire_ms, seen_ms=seen_ms, host=host_id()
    )


def recent(rs: Rsched, limit: int = 50) -> list[dict[str, Any]]:
    """The ``limit`` newest events over every source, newest first, each with
    ``delivery`` (the worst over the sinks that want it) and ``attempts``."""
    srcs = sources(rs)
    if not srcs:
        return []
    pipe = rs.redis.pipeline(transaction=False)
    for s in srcs:
        pipe.xrevrange(s.events, count=limit)
    got = pipe.execute()
    rows: list[tuple[str, Source, dict[str, Any]]] = []
    for s, entries in zip(srcs, got, strict=True):
        for eid, fields in entries or []:
            eid = _s(eid)
            raw = fields.get(b"j", fields.get("j"))
            rows.append((eid, s, render(s, eid, raw)))
    rows.sort(key=lambda r: _id_key(r[0]), reverse=True)
    return _annotate(rs, rows[:limit])


def follow(rs: Rsched, every_s: float = 0.5) -> Iterable[list[dict[str, Any]]]:
    """After the events there are now, each batch of new ones, oldest first
    (forever; the caller stops). Each poll reads only what is past the last id
    of each stream (one pipeline of XRANGE from there, no re-reading); the
    sources are listed again every 5 s (a new cron or queue is followed from its
    first event)."""
    last: dict[Source, str] = {}
    listed = 0.0
    while True:
        if time.monotonic() - listed >= 5:
            fresh = [x for x in sources(rs) if x not in last]
            if fresh:
                pipe = rs.redis.pipeline(transaction=False)
                for x in fresh:
                    pipe.xrevrange(x.events, count=1)
                for x, got in zip(fresh, pipe.execute(), strict=True):
                    last[x] = _s(got[0][0]) if (got and not listed) else "0-0"
            listed = time.monotonic()
        pipe = rs.redis.pipeline(transaction=False)
        srcs = list(last)
        for x in srcs:
            pipe.xrange(x.events, min=_after(last[x]), count=200)
        rows: list[tuple[str, Source, dict[str, Any]]] = []
        for x, entries in zip(srcs, pipe.execute(), strict=True):
            for eid, fields in entries or []:
                eid = _s(eid)
                last[x] = eid
                rows.append((eid, x, render(x, eid, fields.get(b"j", fields.get("j")))))
        rows.sort(key=lambda r: _id_key(r[0]))
        yield _annotate(rs, rows) if rows else []
        time.sleep(every_s)


def _after(eid: str) -> str:
    """The first stream id after ``eid`` (an exclusive XRANGE start on any server)."""
    ms, seq = _id_key(eid)
    return f"{ms}-{seq + 1}"


def _annotate(
    rs: Rsched, rows: Sequence[tuple[str, Source, dict[str, Any]]]
) -> list[dict[str, Any]]:
    """Each event of ``rows`` with ``delivery`` and ``attempts``."""
    sinks = _known_sinks(rs)
    state = _delivery_state(rs, {s for _, s, _ in rows})
    out = []
    for eid, s, ev in rows:
        worst, attempts = "delivered", 0
        order = {"delivered": 0, "pending": 1, "failed": 2}
        for sid, d in sinks.items():
            if not _sink_takes(d, s, ev):
                continue
            st, n = _outcome(state.get((s.events, sid)), s, eid, sid)
            if order[st] > order[worst]:
                worst = st
            attempts = max(attempts, n)
        ev["delivery"] = worst
        ev["attempts"] = attempts
        out.append(ev)
    return out


def _id_key(eid: str) -> tuple[int, int]:
    a, _, b = eid.partition("-")
    return int(a), int(b or 0)


def _known_sinks(rs: Rsched) -> dict[str, dict[str, Any]]:
    out = {}
    for sid, raw in (rs.redis.hgetall(rs.keys.alert_sinks) or {}).items():
        try:
            out[_s(sid)] = json.loads(_s(raw))
        except ValueError:
            continue
    return out


def _sink_takes(d: Mapping[str, Any], s: Source, ev: Mapping[str, Any]) -> bool:
    if d.get("sources") is not None and s.serves not in d["sources"]:
        return False
    if int(ev.get("at_ms") or 0) < int(d.get("since_ms") or 0):
        return False
    evs = d.get("events")
    if evs and ev.get("event") not in evs:
        return False
    target = ev.get("name") or ev.get("type") or ""
    return fnmatch.fnmatchcase(str(target), str(d.get("match") or "*"))


def _delivery_state(rs: Rsched, srcs: set[Source]) -> dict[tuple[str, str], Any]:
    """Per (events stream, sink id): (last delivered id, {pending id: count}, done)."""
    out: dict[tuple[str, str], Any] = {}
    for s in srcs:
        try:
            groups = rs.redis.xinfo_groups(s.events)
        except Exception:  # noqa: BLE001 - no stream / no group: nothing delivered yet
            groups = []
        done = {_s(k): _s(v) for k, v in (rs.redis.hgetall(s.done) or {}).items()}
        for g in groups:
            gname = _s(g.get("name"))
            if not gname.startswith(GROUP_PREFIX):
                continue
            sid = gname[len(GROUP_PREFIX) :]
            pend: dict[str, int] = {}
            if int(g.get("pending") or 0):
                for p in rs.redis.xpending_range(s.events, gname, "-", "+", 1000):
                    pend[_s(p["message_id"])] = int(p["times_delivered"])
            out[(s.events, sid)] = (_s(g.get("last-delivered-id")), pend, done)
    return out


def _outcome(st: Any, s: Source, eid: str, sid: str) -> tuple[str, int]:
    if st is None:
        return "pending", 0
    last, pend, done = st
    if eid in pend:
        return "pending", pend[eid]
    d = done.get(f"{eid} {sid}")
    if d:
        what, _, n = d.partition(" ")
        return what, int(n or 0)
    if _id_key(eid) <= _id_key(last):
        return "delivered", 1
    return "pending", 0


# --- the deliverer -------------------------------------------------------------


class Deliverer:
    """A thread that delivers this process's sinks' events and notices silent
    crons. One per run loop; stop() ends it.

    Quiet while idle: the thread blocks in Redis (one ``XREAD BLOCK`` over every
    served events stream, shared by all the sinks) and reads a sink's group only
    for a stream that has something new. On a Cluster a multi-key XREAD must stay
    in one slot: one blocking call when the streams share one, else one pipelined
    non-blocking XREAD per slot every :data:`CLUSTER_POLL_S` (a blocking
    connection and thread per slot would mean one per cron and queue). Pending deliveries are looked at only when this process
    knows of some: its own failed attempt (after the backoff), the pending
    entries of a scan when it starts serving a stream, and, after a stream woke
    it, once the sink's timeout has passed (another consumer that took the event
    and died leaves it pending; one that failed, to retry). The sources are
    listed again every :data:`RELIST_S`; a loop's own sources are watched from
    the start."""

    #: Longest block of the watching XREAD (then it re-arms; ``RSCHED_TEST_EVENTS_BLOCK_MS``).
    BLOCK_S = 10.0
    #: How often the namespace's sources are listed again (new crons, queues, locks).
    RELIST_S = 60.0
    #: Cluster with streams in several slots: one pipelined non-blocking XREAD this often.
    CLUSTER_POLL_S = 1.0
    #: Without an ``every`` that says when to call it next.
    SILENCE_EVERY_S = 15.0

    def __init__(
        self,
        rs: Rsched,
        sinks: Sequence[Sink],
        log: Any = None,
        every: Any = None,
        only: Sequence[str] | None = None,
        own: Iterable[str] = (),
    ) -> None:
        """``every``: the dead-man's switch, called at once and then after the
        seconds it returns (SILENCE_EVERY_S when it returns None);
        ``only``: serve just these source tags (``exec``: its own lock);
        ``own``: the loop's own source tags, watched before they are registered."""
        self.rs = rs
        self.only = list(only) if only is not None else None
        self.own = set(own)
        self.every = every
        self.sinks = list(sinks)
        self.me = f"{host_id()}:{os.getpid()}:{os.urandom(3).hex()}"
        self.log = log or (lambda _line: None)
        self._stop = threading.Event()
        self._since: dict[str, int] = {}
        self._thread: threading.Thread | None = None
        self._srcs: list[Source] = []
        self._srcs_at = 0.0
        self.delivered = 0
        self.failed = 0
        block_ms = os.environ.get("RSCHED_TEST_EVENTS_BLOCK_MS")
        self.block_s = int(block_ms) / 1000 if block_ms else self.BLOCK_S
        #: (sink id, events stream) -> when (monotonic) a pending entry there is due
        self._due: dict[tuple[str, str], float] = {}
        #: events stream -> the id the watching XREAD reads after
        self._ids: dict[str, str] = {}
        self._watch: Any = None  # the watching XREAD's own client

    def start(self) -> Deliverer:
        self.register()
        self._thread = threading.Thread(target=self._run, name="rsched-events", daemon=True)
        self._thread.start()
        return self

    def stop(self, drain_s: float = 0.0) -> None:
        """End the thread; ``drain_s``: first deliver what is due, for that long at most."""
        from rsched.core import clients

        self._stop.set()
        if self._watch is not None:  # shuts the socket down under a blocked XREAD
            clients.close(self._watch)
        if self._thread is not None:
            self._thread.join(timeout=max(1.0, drain_s))
        if drain_s > 0:
            self.drain(drain_s)

    def drain(self, drain_s: float) -> None:
        """Deliver what is due now, for ``drain_s`` at most (passes until one finds
        nothing new to do): a first attempt of each new event; a failed one stays
        pending in the sink's group for any other process with that sink to retry."""
        deadline = time.monotonic() + drain_s
        force = True
        while time.monotonic() < deadline:
            try:
                if not self.poll(force_sources=force):
                    return
            except Exception as exc:  # noqa: BLE001 - best effort at exit
                self.log(f"rsched: events: {exc}")
                return
            force = False

    def drain_budget_s(self) -> float:
        """How long :meth:`drain` may take: one attempt per sink, each bounded by
        its timeout, plus a second for the round trips."""
        return sum(s.timeout_ms for s in self.sinks) / 1000 + 1.0

    def register(self) -> None:
        """Note each sink as seen (``since_ms``: it takes events from now on)."""
        now = self.rs.now_ms()
        pipe = self.rs.redis.pipeline(transaction=False)
        for s in self.sinks:
            d = s.describe() | {"since_ms": now}
            pipe.hsetnx(self.rs.keys.alert_sinks, s.id, json.dumps(d))
        pipe.execute()
        for sid, d in _known_sinks(self.rs).items():
            self._since[sid] = int(d.get("since_ms") or 0)

    # --- the thread -------------------------------------------------------------

    def _run(self) -> None:
        silence_at = 0.0
        listed_at = -1.0
        delay = 0.5
        while not self._stop.is_set():
            try:
                now = time.monotonic()
                if self.every is not None and now >= silence_at:
                    nxt = self.every()
                    silence_at = time.monotonic() + (
                        float(nxt) if nxt is not None else self.SILENCE_EVERY_S
                    )
                if not self.sinks:
                    self._stop.wait(max(0.0, silence_at - time.monotonic()))
                    continue
                if listed_at < 0 or now - listed_at >= self.RELIST_S:
                    self._adopt(first=listed_at < 0)
                    listed_at = time.monotonic()
                now = time.monotonic()
                wake = min(
                    silence_at if self.every is not None else now + self.block_s,
                    listed_at + self.RELIST_S,
                    min(self._due.values(), default=now + self.block_s),
                    now + self.block_s,
                )
                woke = self._wait(max(0.0, wake - now))
                for src in self._srcs:
                    if src.events in woke:
                        for sink in self._serving(src):
                            self._read_new(sink, src)
                            # whoever took an event: delivered, or pending by then
                            later = (sink.timeout_ms + backoff_ms(1) + 1500) / 1000
                            self._note_due(sink, src, time.monotonic() + later)
                self._retry_known()
                delay = 0.5
            except Exception as exc:  # noqa: BLE001 - never end the thread; retry next pass
                if self._stop.is_set():
                    break
                self.log(f"rsched: events: {exc}")
                self._stop.wait(delay)
                delay = min(10.0, delay * 2)

    def _serving(self, src: Source) -> list[Sink]:
        return [s for s in self.sinks if s.sources is None or src.serves in s.sources]

    def _list(self) -> list[Source]:
        """The served sources: ``only``, or the namespace's, with the quick-use
        sinks' own names even before they are registered."""
        if self.only is not None:
            return [source(self.rs, t) for t in self.only]
        listed = sources(self.rs)
        have = {x.events for x in listed}
        own = sorted(self.own | {t for s in self.sinks for t in (s.sources or ())})
        return listed + [x for x in (source(self.rs, t) for t in own) if x.events not in have]

    def _adopt(self, first: bool) -> None:
        """List the sources; watch each new one from now on and read what it holds
        already (the first time: everything, with the pending entries)."""
        srcs = self._list()
        new = [x for x in srcs if x.events not in self._ids]
        self._srcs = [x for x in srcs if self._serving(x)]
        self._srcs_at = time.monotonic()
        new = [x for x in new if self._serving(x)]
        if not new:
            return
        floor = f"{max(0, self.rs.now_ms() - 1)}-0"
        for x in new:
            self._ids[x.events] = floor
        have = self._scan([x.events for x in new])
        for x in new:  # what was recorded before the watch covers it
            if x.events in have:  # (a stream made later wakes the watch)
                for sink in self._serving(x):
                    self._read_new(sink, x)
        if first:
            self._retry_known()

    def _scan(self, streams: Sequence[str]) -> set[str]:
        """Which of ``streams`` exist (returned), and which hold pending deliveries
        of this process's sinks (noted in ``_due``: looked at, retried when due)."""
        have: set[str] = set()
        if not streams:
            return have
        pipe = self.rs.redis.pipeline(transaction=False)
        for k in streams:
            pipe.xinfo_groups(k)
        mine = {GROUP_PREFIX + s.id: s.id for s in self.sinks}
        now = time.monotonic()
        for k, got in zip(streams, pipe.execute(raise_on_error=False), strict=True):
            if isinstance(got, Exception):  # no such stream
                continue
            have.add(k)
            for g in got or []:
                sid = mine.get(_s(g.get("name")))
                if sid is not None and int(g.get("pending") or 0):
                    self._due.setdefault((sid, k), now)
        return have

    def _retry_known(self) -> None:
        """Retry the pending deliveries this process knows are due."""
        now = time.monotonic()
        due = [key for key, at in self._due.items() if at <= now]
        if not due:
            return
        by_id = {s.id: s for s in self.sinks}
        srcs = {x.events: x for x in self._srcs}
        for sid, k in due:
            sink, src = by_id.get(sid), srcs.get(k)
            self._due.pop((sid, k), None)
            if sink is not None and src is not None:
                self._retry_due(sink, src)

    def _wait(self, timeout_s: float) -> set[str]:
        """Block until one of the watched streams has an entry past its id, for
        ``timeout_s`` at most. The streams that have (their ids move on)."""
        from rsched.core import clients
        from rsched.core.conn import is_cluster

        streams = {x.events: self._ids[x.events] for x in self._srcs if x.events in self._ids}
        if not streams or timeout_s < 0.005:
            self._stop.wait(timeout_s)
            return set()
        if self._watch is None:
            self._watch = clients.clone(
                self.rs.redis, socket_timeout=self.block_s + 10.0, max_connections=1
            )
        groups: list[dict[str, str]] = [streams]
        if is_cluster(self.rs.redis):
            by_slot: dict[int, dict[str, str]] = {}
            for k, v in streams.items():
                by_slot.setdefault(self._watch.keyslot(k), {})[k] = v
            groups = list(by_slot.values())
        if len(groups) == 1:
            got = self._watch.xread(groups[0], count=100, block=max(1, int(timeout_s * 1000)))
        else:  # a Cluster, streams in several slots: a pipelined read, then a pause
            pipe = self._watch.pipeline(transaction=False)
            for g in groups:
                pipe.xread(g, count=100)
            got = [r for res in pipe.execute() for r in (res or [])]
            if not got:
                self._stop.wait(min(timeout_s, self.CLUSTER_POLL_S))
        woke = set()
        for stream, entries in got or []:
            k = _s(stream)
            if entries:
                self._ids[k] = _s(entries[-1][0])
                woke.add(k)
        return woke

    # --- one pass over everything (drain, exec) ------------------------------------

    def poll(self, force_sources: bool = False) -> bool:
        """One pass over every (sink, source): new events, then due retries.
        Whether it delivered or attempted anything."""
        if not self.sinks:
            return False
        if force_sources or time.monotonic() - self._srcs_at > 5:
            self._srcs = self._list()
            self._srcs_at = time.monotonic()
        busy = False
        for sink in self.sinks:
            for src in self._srcs:
                if sink.sources is not None and src.serves not in sink.sources:
                    continue
                busy |= self._pass(sink, src)
        return busy

    def _group(self, sink: Sink, src: Source) -> bool:
        try:
            self.rs.redis.xgroup_create(src.events, GROUP_PREFIX + sink.id, id="0")
        except Exception as exc:  # noqa: BLE001
            return "BUSYGROUP" in str(exc)
        return True

    def _pass(self, sink: Sink, src: Source) -> bool:
        busy = self._read_new(sink, src)
        return self._retry_due(sink, src) or busy

    def _read_new(self, sink: Sink, src: Source) -> bool:
        """A first attempt of each new event of ``src`` for ``sink`` (the group is
        made on the stream's first read)."""
        r = self.rs.redis
        g = GROUP_PREFIX + sink.id
        busy, made = False, False
        while True:
            try:
                got = r.xreadgroup(g, self.me, {src.events: ">"}, count=20)
            except Exception as exc:  # noqa: BLE001
                if not made and "NOGROUP" in str(exc) and self._group(sink, src):
                    made = True
                    continue
                return busy
            n = 0
            for _stream, entries in got or []:
                for eid, fields in entries:
                    n += 1
                    self._attempt(sink, src, _s(eid), fields, 1)
            busy |= n > 0
            if n < 20:
                return busy

    def _retry_due(self, sink: Sink, src: Source) -> bool:
        """Retry the pending entries of ``src`` for ``sink`` that are due (ours
        after the backoff, another's once also the sink's timeout passed); note
        when the next one is due."""
        r = self.rs.redis
        g = GROUP_PREFIX + sink.id
        busy = False
        try:
            pending = r.xpending_range(src.events, g, "-", "+", 20)
        except Exception as exc:  # noqa: BLE001 - no stream or group: nothing pending
            if "NOGROUP" in str(exc):
                return False
            raise
        nxt: float | None = None
        for p in pending:
            eid, count = _s(p["message_id"]), int(p["times_delivered"])
            need = backoff_ms(count)
            if _s(p["consumer"]) != self.me:
                need += sink.timeout_ms + 1000
            idle = int(p["time_since_delivered"])
            if idle < need:
                at = time.monotonic() + (need - idle) / 1000
                nxt = at if nxt is None else min(nxt, at)
                continue
            claimed = r.xclaim(src.events, g, self.me, need, [eid])
            for ceid, fields in claimed or []:
                if fields is None:  # trimmed away meanwhile
                    r.xack(src.events, g, ceid)
                    continue
                busy = True
                self._attempt(sink, src, _s(ceid), fields, count + 1)
        if len(pending) >= 20:
            nxt = time.monotonic()
        if nxt is not None:
            self._note_due(sink, src, nxt)
        return busy

    def _note_due(self, sink: Sink, src: Source, at: float) -> None:
        key = (sink.id, src.events)
        self._due[key] = min(at, self._due.get(key, at))

    def _attempt(self, sink: Sink, src: Source, eid: str, fields: Any, attempt: int) -> None:
        r = self.rs.redis
        g = GROUP_PREFIX + sink.id
        ev = render(src, eid, (fields or {}).get(b"j", (fields or {}).get("j")))
        if not sink.wants(ev) or int(ev["at_ms"] or 0) < self._since.get(sink.id, 0):
            r.xack(src.events, g, eid)
            return
        body = json.dumps(ev, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        why = sink.deliver(body, str(ev["event"]))
        # The outcome is written before the XACK, so `rsched events` never sees an
        # event acknowledged without it (a crash between the two: a retry, no loss).
        if why is None:
            if attempt > 1:
                self._done(src, eid, sink, f"delivered {attempt}")
            r.xack(src.events, g, eid)
            self.delivered += 1
            self._count(sink, "delivered")
            return
        what = f"{ev['event']} {ev['event_id']} to {sink.describe()['target']}"
        if attempt >= MAX_ATTEMPTS:
            self._done(src, eid, sink, f"failed {attempt}")
            r.xack(src.events, g, eid)
            self.failed += 1
            self._count(sink, "failed")
            self.log(f"rsched: alert {what} failed after {attempt} attempts: {why}")
            return
        r.xclaim(src.events, g, self.me, 0, [eid], justid=True)  # idle from now
        self._note_due(sink, src, time.monotonic() + backoff_ms(attempt) / 1000)
        self._count(sink, "retried")
        self.log(f"rsched: alert {what} attempt {attempt} failed ({why}); retrying")

    def _count(self, sink: Sink, outcome: str) -> None:
        """Count one attempt's outcome in ``{ns}:alert-stats`` (``rsched metrics``)."""
        self.rs.redis.hincrby(self.rs.keys.alert_stats, f"{sink.id} {outcome}", 1)

    def _done(self, src: Source, eid: str, sink: Sink, outcome: str) -> None:
        r = self.rs.redis
        r.hset(src.done, f"{eid} {sink.id}", outcome)
        if r.hlen(src.done) > 2 * EVENTS_MAXLEN:
            first = r.xrange(src.events, count=1)
            if first:
                low = _id_key(_s(first[0][0]))
                old = [k for k in r.hkeys(src.done) if _id_key(_s(k).split(" ")[0]) < low]
                if old:
                    r.hdel(src.done, *old)


#: The outcomes counted per sink in ``{ns}:alert-stats``.
OUTCOMES = ("delivered", "failed", "retried")


def delivery_stats(rs: Rsched) -> list[tuple[str, str, str, int]]:
    """(sink id, sink target without secrets, outcome, count) of every attempt
    counted so far, for ``rsched_alert_deliveries_total``."""
    pipe = rs.redis.pipeline(transaction=False)
    pipe.hgetall(rs.keys.alert_stats)
    pipe.hgetall(rs.keys.alert_sinks)
    stats, defs = pipe.execute()
    targets = {}
    for sid, raw in (defs or {}).items():
        try:
            targets[_s(sid)] = str(json.loads(_s(raw)).get("target") or "")
        except ValueError:
            continue
    out = []
    for f, n in sorted((stats or {}).items()):
        sid, _, outcome = _s(f).partition(" ")
        if outcome in OUTCOMES:
            out.append((sid, targets.get(sid, ""), outcome, int(n)))
    return out
