"""`rsched run cron`: a cron runner that fires each tick exactly once across
any number of runners and hosts.

How a tick is fired (see ``lua/cron-tick-8.lua``):

1. Every runner computes the next tick (``rsched.core.cronexpr``, in the cron's
   time zone and dialect) and sleeps until it **by the server's clock**:
   the offset ``server - local`` is measured from every reply that carries
   the server's ``TIME`` (claims and heartbeats), so a host whose clock is
   off neither fires early nor late.
2. At the tick every runner calls the claim script. It compares the tick
   with the server's ``TIME`` (a tick in the future is refused, ``early``),
   and claims ``(cron, fire_ms)`` with ``ZADD NX`` into the ``ticks`` set
   plus a high-water mark ``last_tick``: one runner wins, once ever.
3. The winner applies the cron's policies atomically in the same script:
   paused (recorded ``skipped``, also for a tick that fell inside the last
   pause and is only now caught up on), too late (``missed``), concurrency
   ``forbid`` (previous run still holds the run lock: ``skipped``),
   ``replace`` (see below), ``allow``; then takes the run lock with a new
   fencing token and runs the job in a thread, with a watchdog renewing the
   lease.

``--concurrency replace``: the tick that finds the run lock held becomes the
one waiting to replace it (``replace_fire`` in the state hash; a tick already
waiting is superseded and recorded ``skipped``), sets the lock's ``cancel``
field and wakes the holder: the holder's watchdog does not sleep between
renewals but blocks in ``BZPOPMIN`` on the cron's ``wake`` key, so it renews
at once, learns it must stop and stops its job (SIGTERM, SIGKILL after the
grace). The waiting runner polls ``cron-start-5`` (every 20-100 ms, only
while it waits) and takes the lock, with a new fencing token, once the old
run released it: the runs never overlap. Cost of a running job in Redis: one
renewal plus one ``BZPOPMIN`` that timed out per TTL/3 (``--ttl 30s``: 2
requests, 6 commands counting the 5 the renewal script runs, per 10 s; measured
with INFO commandstats), and one connection of the runner blocked in
``BZPOPMIN``; ``forbid`` jobs keep the plain sleep (1 renewal, 5 commands, per
TTL/3). The waiting runner's polls cost 10-50 requests a second, only for as
long as the old job takes to exit.

The main loop never blocks on a job, never fires a tick it could not claim,
and survives Redis outages: errors back off and retry, and ticks that passed
meanwhile follow the misfire policy. Of the ticks that passed only the latest
may run; the ones it overtook are recorded ``missed`` (a backlog run back to
back would make the on-time ticks after it find the run lock held: ``skipped``).
The latest runs when on time: within 5 s (``--starting-deadline``) and within
half the gap to the next tick, so a job shorter than half its interval never
costs the next tick. Later than that, ``skip`` records it ``missed``;
``run-once`` runs it once, late (within ``--starting-deadline`` when given),
unless the next tick is due within 5 s: then that tick is the catch-up.

Sharding (``--shards N``): each tick has N items; the live runners
(heartbeat registry) split them by rank (item ``i`` goes to rank
``i % live``), and shortly after the tick every runner takes over items no
one claimed (a runner that died before its registration expired). Each item
is claimed once (``HSETNX`` in a per-tick hash). ``--broadcast``: every live
runner runs every tick once.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis

from rsched.core import cronexpr, errors, validate
from rsched.core.errors import map_error
from rsched.core.timeutil import iso, parse_duration
from rsched.core.transient import TRANSIENT
from rsched.locks.lock import DEFAULT_TTL_MS, MIN_TTL_MS, Watchdog, new_owner_id
from rsched.runtime import proc, systemd

if TYPE_CHECKING:  # pragma: no cover
    from rsched.context import Context
    from rsched.core.replication import WaitPolicy

CONCURRENCY = ("forbid", "allow", "replace")
MISFIRE = ("skip", "run-once")
ON_LOCK_LOST = ("kill", "continue")

#: A tick claimed at most this late counts as on time (unless --starting-deadline says
#: otherwise), and at most half the gap to the next tick (see CronRunner._deadline).
ON_TIME_MS = 5_000
#: --misfire run-once: no catch-up run of a missed tick when the next tick is this close
#: (that tick runs on time instead, and is the catch-up).
CATCH_UP_FOLD_MS = 5_000
#: Runner registry entries live this long; refreshed by every claim and by heartbeats.
RUNNER_TTL_MS = 30_000
#: A waiting runner talks to Redis at least this often (heartbeat + clock offset).
HEARTBEAT_S = 10.0
#: Ticks older than this many intervals (at least MIN_KEEP_MS) are trimmed from the ticks set.
MIN_KEEP_MS = 3_600_000
#: Missed ticks recorded one by one after an outage at most (older ones are only counted).
MAX_BACKLOG = 100

_CONFIG_KEYS = {
    "schedule",
    "tz",
    "dialect",
    "command",
    "ttl",
    "concurrency",
    "misfire",
    "starting_deadline",
    "timeout",
    "jitter",
    "shards",
    "broadcast",
    "on_lock_lost",
    "grace",
}


@dataclass
class CronSpec:
    name: str
    schedule: cronexpr.Schedule
    command: list[str]
    ttl_ms: int = DEFAULT_TTL_MS
    concurrency: str = "forbid"
    misfire: str = "skip"
    starting_deadline_ms: int | None = None
    timeout_ms: int | None = None
    jitter_ms: int = 0
    shards: int | None = None
    broadcast: bool = False
    on_lock_lost: str = "kill"
    grace_s: float = 5.0

    @property
    def sharded(self) -> bool:
        return bool(self.shards) or self.broadcast


def make_spec(
    name: str,
    schedule: str,
    command: str | Sequence[str],
    *,
    tz: str = "UTC",
    dialect: str | None = None,
    ttl: str | int | None = None,
    concurrency: str = "forbid",
    misfire: str = "skip",
    starting_deadline: str | int | None = None,
    timeout: str | int | None = None,
    jitter: str | int | None = None,
    shards: int | None = None,
    broadcast: bool = False,
    on_lock_lost: str = "kill",
    grace: str | int | None = None,
    prefix: str = "--",
) -> CronSpec:
    """Check every option (naming the field) before anything touches Redis."""

    def f(opt: str) -> str:
        return f"{prefix}{opt}" if prefix == "--" else f"{prefix}{opt.replace('-', '_')}"

    def dur(v: str | int | None, opt: str) -> int | None:
        if v is None:
            return None
        if isinstance(v, int) and not isinstance(v, bool):
            if v <= 0:
                raise errors.BadInput(f(opt), f"{v} is not a positive duration")
            return v
        return parse_duration(str(v), f(opt))

    validate.name(name, "NAME")
    sched = cronexpr.parse(
        schedule,
        tz or "UTC",
        field=f("schedule"),
        tz_field=f("tz"),
        dialect=dialect,
        dialect_field=f("dialect"),
    )
    argv = proc.split_command(command, f("command") if prefix != "--" else "CMD")
    if concurrency not in CONCURRENCY:
        raise errors.BadInput(
            f("concurrency"), f"{concurrency!r} is not one of {', '.join(CONCURRENCY)}"
        )
    if misfire not in MISFIRE:
        raise errors.BadInput(f("misfire"), f"{misfire!r} is not one of {', '.join(MISFIRE)}")
    if on_lock_lost not in ON_LOCK_LOST:
        raise errors.BadInput(
            f("on-lock-lost"), f"{on_lock_lost!r} is not one of {', '.join(ON_LOCK_LOST)}"
        )
    ttl_ms = dur(ttl, "ttl") or DEFAULT_TTL_MS
    if ttl_ms < MIN_TTL_MS:
        raise errors.BadInput(f("ttl"), f"must be at least {MIN_TTL_MS}ms")
    if shards is not None:
        if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= 10_000:
            raise errors.BadInput(f("shards"), f"{shards!r} is not a whole number from 1 to 10000")
        if broadcast:
            raise errors.BadInput(f("broadcast"), "cannot be combined with --shards")
    if (shards or broadcast) and concurrency != "forbid":
        raise errors.BadInput(
            f("concurrency"),
            "sharded and broadcast crons run every item of every tick; "
            "--concurrency does not apply to them",
        )
    g = dur(grace, "grace")
    return CronSpec(
        name=name,
        schedule=sched,
        command=argv,
        ttl_ms=ttl_ms,
        concurrency=concurrency,
        misfire=misfire,
        starting_deadline_ms=dur(starting_deadline, "starting-deadline"),
        timeout_ms=dur(timeout, "timeout"),
        jitter_ms=dur(jitter, "jitter") or 0,
        shards=shards,
        broadcast=bool(broadcast),
        on_lock_lost=on_lock_lost,
        grace_s=(g / 1000) if g else 5.0,
    )


def spec_from_config(name: str, table: Mapping[str, Any]) -> CronSpec:
    """A ``[cron.NAME]`` table of the config file."""
    if not isinstance(table, Mapping):
        raise errors.ConfigError(f"[cron.{name}] must be a table")
    unknown = set(table) - _CONFIG_KEYS
    if unknown:
        raise errors.ConfigError(
            f"[cron.{name}]: unknown key(s) {', '.join(sorted(unknown))} "
            f"(known: {', '.join(sorted(_CONFIG_KEYS))})"
        )
    for req in ("schedule", "command"):
        if req not in table:
            raise errors.ConfigError(f"[cron.{name}]: {req} is required")
    try:
        return make_spec(
            name,
            table["schedule"],
            table["command"],
            tz=table.get("tz", "UTC"),
            dialect=table.get("dialect"),
            ttl=table.get("ttl"),
            concurrency=table.get("concurrency", "forbid"),
            misfire=table.get("misfire", "skip"),
            starting_deadline=table.get("starting_deadline"),
            timeout=table.get("timeout"),
            jitter=table.get("jitter"),
            shards=table.get("shards"),
            broadcast=bool(table.get("broadcast", False)),
            on_lock_lost=table.get("on_lock_lost", "kill"),
            grace=table.get("grace"),
            prefix=f"cron.{name}.",
        )
    except errors.BadInput as exc:
        raise errors.ConfigError(f"config: {exc}") from None


class ServerClock:
    """Estimates the server's clock from local time plus a measured offset."""

    def __init__(self) -> None:
        self.offset_ms = 0.0
        self.measured = False
        self._lock = threading.Lock()

    def observe(self, server_ms: int, local_before: float, local_after: float) -> None:
        mid = (local_before + local_after) / 2 * 1000
        with self._lock:
            self.offset_ms = server_ms - mid
            self.measured = True

    def now(self) -> float:
        return time.time() * 1000 + self.offset_ms


def _is_redis_down(exc: BaseException) -> bool:
    return isinstance(exc, TRANSIENT)


@dataclass
class _Active:
    run: JobRun
    thread: threading.Thread


class CronRunner:
    """One cron's runner loop (``run()`` blocks until ``stop`` is set)."""

    def __init__(
        self,
        rs: Context,
        spec: CronSpec,
        stop: threading.Event | None = None,
        log: Callable[[str], None] | None = None,
        debug: Callable[[str], None] | None = None,
        wait: WaitPolicy | None = None,
    ):
        self.rs = rs
        self.spec = spec
        self.wait = wait  # --wait-replicas: WAIT after each tick claim
        self.k = rs.keys.cron(spec.name)
        self.stop = stop or threading.Event()
        self.log = log or (lambda _m: None)
        self.debug = debug or (lambda _m: None)
        ident = rs.identity()
        self.host, self.pid = str(ident["host"]), int(ident["pid"])
        self.runner_id = f"{self.host}:{self.pid}:{new_owner_id()[:8]}"
        self.clock = ServerClock()
        self.cursor: int | None = None  # the latest tick this runner has dealt with
        self.active: list[_Active] = []
        self._active_lock = threading.Lock()
        self.commands = 0  # Redis round trips, for the idle-cost test
        self._last_contact = 0.0
        self._down_since: float | None = None
        self._keep: int | None = None
        #: concurrency replace: the holder's watchdog blocks on this ZSET (see cron-start-5).
        self.wake_key = self.k.wake
        self._blocking: Any = None  # a client for the watchdogs' BZPOPMIN (replace only)
        self._blocking_lock = threading.Lock()
        self._replacers: list[threading.Thread] = []

    # --- Redis calls (each also measures the server clock) ------------------------
    def _script(self, name: str, keys: list[str], args: list[Any]) -> Any:
        t0 = time.time()
        if self.wait and name in ("cron-tick-8", "cron-shard-7"):
            res = self._claim_and_wait(name, keys, args)
        else:
            res = self.rs.scripts(name, keys, args)
        t1 = time.time()
        self.commands += 1
        self._last_contact = time.monotonic()
        if (
            isinstance(res, list)
            and len(res) > 1
            and name in ("cron-tick-8", "cron-shard-7", "cron-heartbeat-1")
        ):
            self.clock.observe(int(res[1]), t0, t1)
        return res

    def _claim_and_wait(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """A tick claim and WAIT on one connection; a shortfall is logged, the job runs."""
        from rsched.core.replication import script_and_wait

        assert self.wait is not None
        res, acked = script_and_wait(self.rs, name, keys, args, self.wait)
        won = str(res[0]) == "run" if name == "cron-tick-8" else len(res) > 2
        short = (
            self.wait.shortfall(acked, f"cron {self.spec.name}: the tick claim") if won else None
        )
        if short:
            self.log(f"rsched: warning: {short}; running the job anyway")
        return res

    def _heartbeat(self) -> None:
        self._script("cron-heartbeat-1", [self.k.runners], [self.runner_id, RUNNER_TTL_MS])

    def _keep_ms(self, now: int) -> int:
        if self._keep is None:
            try:
                self._keep = max(3 * self.spec.schedule.interval_ms(now), MIN_KEEP_MS)
            except errors.BadInput:  # pragma: no cover
                self._keep = MIN_KEEP_MS
        return self._keep

    def register(self) -> None:
        s = self.spec
        before = self.rs.redis.hmget(self.k.state, "schedule", "tz", "registered_by", "dialect")
        mine = (s.schedule.expr, s.schedule.tz, s.schedule.dialect)
        theirs = (before[0], before[1], before[3] or cronexpr.dialect_of(before[0] or "", None))
        if before[0] is not None and theirs != mine:
            self.log(
                f"cron {s.name}: warning: runner {before[2]} registered it with schedule "
                f"{before[0]!r} ({before[1]}, {theirs[2]}); this runner uses "
                f"{s.schedule.expr!r} ({s.schedule.tz}, {s.schedule.dialect}). "
                "Runners of one cron should share its schedule."
            )
        pipe = self.rs.redis.pipeline(transaction=False)
        pipe.sadd(self.rs.keys.crons, s.name)
        pipe.hset(
            self.k.state,
            mapping={
                "schedule": s.schedule.expr,
                "tz": s.schedule.tz,
                "dialect": s.schedule.dialect,
                "concurrency": s.concurrency,
                "misfire": s.misfire,
                "shards": s.shards or 0,
                "broadcast": int(s.broadcast),
                "ttl_ms": s.ttl_ms,
                "registered_ms": int(self.clock.now()),
                "registered_by": self.runner_id,
            },
        )
        pipe.execute()
        self.commands += 1

    def unregister(self) -> None:
        try:
            self.rs.redis.zrem(self.k.runners, self.runner_id)
        except redis.RedisError:
            pass

    # --- the loop --------------------------------------------------------------------
    def run(self) -> None:
        backoff = 0.2
        registered = False
        while not self.stop.is_set():
            try:
                if not registered:
                    self._heartbeat()
                    self.register()
                    registered = True
                if self.cursor is None:
                    self._start_cursor()
                self._step()
                if self._down_since is not None:
                    self.log(
                        f"cron {self.spec.name}: Redis is back after "
                        f"{time.monotonic() - self._down_since:.1f}s"
                    )
                    self._down_since = None
                backoff = 0.2
            except Exception as exc:  # noqa: BLE001 - a runner never exits because Redis blinked
                if not _is_redis_down(exc) and not isinstance(exc, redis.RedisError):
                    if isinstance(exc, errors.RschedError) and not isinstance(
                        exc, errors.RedisUnavailable
                    ):
                        self.log(f"cron {self.spec.name}: error: {exc}")
                    else:
                        self.log(
                            f"cron {self.spec.name}: unexpected error: {type(exc).__name__}: {exc}"
                        )
                registered = False  # Redis may have restarted empty: register again
                if self._down_since is None:
                    self._down_since = time.monotonic()
                    why = map_error(exc)
                    what = (
                        why if isinstance(why, errors.RedisFull) else f"Redis unavailable ({exc})"
                    )
                    self.log(f"cron {self.spec.name}: {what}; retrying with backoff")
                self.stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
        self.shutdown()

    def _start_cursor(self) -> None:
        t0 = time.time()
        now = self.rs.now_ms()
        self.clock.observe(now, t0, time.time())
        last = self.rs.redis.hget(self.k.state, "last_tick")
        self.commands += 2
        if last is not None and int(last) < now:
            # Ticks since the last one any runner handled are the backlog (misfire policy),
            # limited to the latest MAX_BACKLOG of them.
            backlog = self.spec.schedule.ticks_between(int(last), now, limit=MAX_BACKLOG)
            self.cursor = backlog[0] - 1 if backlog else now
            if backlog:
                self.debug(
                    f"cron {self.spec.name}: {len(backlog)} tick(s) since the last one handled"
                )
        else:
            self.cursor = now

    def _wait_until(self, target_ms: int) -> bool:
        """Sleep until the server's clock reaches ``target_ms``; False when stopping."""
        while not self.stop.is_set():
            remaining = target_ms - self.clock.now()
            if remaining <= 0:
                return True
            since = time.monotonic() - self._last_contact
            if since >= HEARTBEAT_S:
                self._heartbeat()  # keeps the registration and re-measures the clock offset
                continue
            self.stop.wait(min(remaining / 1000, HEARTBEAT_S - since))
        return False

    def _step(self) -> None:
        assert self.cursor is not None
        s = self.spec
        nxt = s.schedule.next_after(self.cursor)
        if not self._wait_until(nxt):
            return
        now_est = int(self.clock.now())
        due = s.schedule.ticks_between(self.cursor, max(now_est, nxt), limit=MAX_BACKLOG)
        if not due:  # pragma: no cover - nxt <= now_est always
            due = [nxt]
        for i, t in enumerate(due):
            if self.stop.is_set():
                return
            if i < len(due) - 1:
                # Overtaken: a later tick is due too. Only the latest may run (never
                # a backlog back to back, whose runs would cost the on-time ticks).
                mode, deadline = "missed", -1
            else:
                mode, deadline = "fire", self._deadline(t)
            st = self._handle(t, mode, deadline)
            if st == "early":
                return  # our clock estimate ran ahead; it was just re-measured
            self.cursor = t

    def _deadline(self, fire: int) -> int:
        """How late (ms, by the server's clock, judged in the claim script) tick
        ``fire`` may still start; later it is recorded ``missed``.

        On time: within ``--starting-deadline`` (default ON_TIME_MS) and within
        half the gap to the next tick, so that a job shorter than half its
        interval never overlaps the next tick (a late run would cost it, as
        ``skipped``). Never once the next tick is due: that one runs instead.
        ``--misfire run-once`` also runs a later tick (a catch-up), unless the
        next tick comes within CATCH_UP_FOLD_MS: that one is the catch-up."""
        s = self.spec
        gap = s.schedule.next_after(fire) - fire
        sd = s.starting_deadline_ms
        on_time = min(sd, gap - 1) if sd else min(ON_TIME_MS, gap // 2)
        if s.misfire != "run-once":
            return on_time
        catch_up = gap - CATCH_UP_FOLD_MS
        if sd:
            catch_up = min(catch_up, sd)
        return max(on_time, catch_up)

    def _handle(self, fire: int, mode: str, deadline: int) -> str:
        s = self.spec
        if s.sharded:
            return self._handle_sharded(fire, mode, deadline)
        owner = new_owner_id()
        sent = time.monotonic()  # a run lock taken here has its lease from then at the latest
        res = self._script(
            "cron-tick-8",
            [
                self.k.ticks,
                self.k.state,
                self.k.run_lock,
                self.k.fence,
                self.k.paused,
                self.k.history,
                self.k.runners,
                self.wake_key,
            ],
            [
                fire,
                mode,
                self.runner_id,
                owner,
                s.ttl_ms,
                self.host,
                self.pid,
                s.concurrency,
                deadline,
                self._keep_ms(fire),
                self.rs.history_maxlen,
                s.name,
                RUNNER_TTL_MS,
            ],
        )
        st, now = str(res[0]), int(res[1])
        self.debug(f"cron {s.name}: tick {iso(fire)}: {st}")
        if st == "run":
            self._start_job(
                fire, int(res[2]), owner if s.concurrency != "allow" else "", now, since=sent
            )
        elif st == "replace":
            self.log(f"cron {s.name}: tick {iso(fire)}: the running job is asked to stop")
            t = threading.Thread(
                target=self._replace,
                args=(fire, owner),
                daemon=True,
                name=f"rsched-replace-{s.name}",
            )
            self._replacers = [r for r in self._replacers if r.is_alive()] + [t]
            t.start()
        elif st == "missed":
            self.log(f"cron {s.name}: tick {iso(fire)} missed (recorded)")
        elif st in ("paused", "skipped"):
            self.debug(f"cron {s.name}: tick {iso(fire)} skipped ({st})")
        return st

    def _replace(self, fire: int, owner: str) -> None:
        """Wait for the asked-to-stop holder to let go, then run this tick; stop waiting
        when a newer tick takes this one's place (it records this one ``skipped``)."""
        s = self.spec
        give_up_at = time.monotonic() + s.ttl_ms / 1000 + s.grace_s + 2
        delay = 0.02
        while True:
            give_up = ""
            stopping = self.stop.is_set()
            if stopping:
                give_up = "the runner stopped before the running job did"
            elif time.monotonic() >= give_up_at:
                give_up = "the running job did not stop in time to be replaced"
            sent = time.monotonic()
            try:
                res = self._script(
                    "cron-start-5",
                    [self.k.run_lock, self.k.fence, self.k.state, self.k.history, self.wake_key],
                    [
                        fire,
                        owner,
                        s.ttl_ms,
                        self.host,
                        self.pid,
                        give_up,
                        self.rs.history_maxlen,
                        s.name,
                        0 if stopping else 1,
                    ],
                )
            except Exception as exc:  # noqa: BLE001
                if self.stop.is_set() or not _is_redis_down(exc):
                    self.log(f"cron {s.name}: replace of tick {iso(fire)} failed: {exc}")
                    return
                self.stop.wait(0.5)
                continue
            st = str(res[0])
            if st == "run":
                self._start_job(fire, int(res[2]), owner, int(res[1]), since=sent)
                return
            if st == "superseded":
                self.log(f"cron {s.name}: tick {iso(fire)} skipped: superseded by a newer tick")
                return
            if st == "skipped":
                self.log(f"cron {s.name}: tick {iso(fire)} skipped: {give_up}")
                return
            self.stop.wait(delay)  # held: the holder was woken and is stopping its job
            delay = min(delay * 1.5, 0.1)

    def blocking_client(self) -> Any:
        """A client of its own for the watchdogs' blocking ``BZPOPMIN`` (whose wait is
        longer than the shared client's socket timeout may be)."""
        with self._blocking_lock:
            if self._blocking is None:
                self._blocking = _blocking_clone(self.rs.redis, self.spec.ttl_ms / 3000 + 10)
            return self._blocking

    def _handle_sharded(self, fire: int, mode: str, deadline: int) -> str:
        s = self.spec
        keys = [
            self.k.ticks,
            self.k.state,
            self.k.shards(fire),
            self.k.runners,
            self.k.paused,
            self.k.history,
            self.k.fence,
        ]
        total = 1 if s.broadcast else int(s.shards or 1)

        def call(m: str) -> Any:
            return self._script(
                "cron-shard-7",
                keys,
                [
                    fire,
                    m,
                    self.runner_id,
                    total,
                    deadline if mode == "fire" else 0,
                    self._keep_ms(fire),
                    self.rs.history_maxlen,
                    s.name,
                    self.host,
                    self.pid,
                    RUNNER_TTL_MS,
                ],
            )

        res = call("broadcast" if s.broadcast else "own")
        st, now = str(res[0]), int(res[1])
        if st != "ok":
            if st != "early":
                self.debug(f"cron {s.name}: tick {iso(fire)}: {st}")
            return st
        self._start_items(fire, res, now)
        if s.broadcast:
            return st
        # Take over items of runners that died before claiming theirs.
        delay = min(max(s.schedule.interval_ms(fire) // 3, 200), 2000)
        if self._wait_until(fire + delay):
            res = call("steal")
            if str(res[0]) == "ok":
                self._start_items(fire, res, int(res[1]), stolen=True)
        return st

    def _start_items(self, fire: int, res: list[Any], now: int, stolen: bool = False) -> None:
        s = self.spec
        for j in range(2, len(res), 2):
            item, token = str(res[j]), int(res[j + 1])
            shard = 0 if s.broadcast else int(item)
            total = 1 if s.broadcast else int(s.shards or 1)
            if stolen:
                self.log(f"cron {s.name}: tick {iso(fire)}: took over shard {item}")
            self._start_job(fire, token, "", now, shard=(shard, total))

    # --- jobs --------------------------------------------------------------------------
    def _start_job(
        self,
        fire: int,
        token: int,
        owner: str,
        started_ms: int,
        shard: tuple[int, int] | None = None,
        since: float | None = None,
    ) -> None:
        run = JobRun(self, fire, token, owner, started_ms, shard, since=since)
        t = threading.Thread(
            target=run.run, name=f"rsched-job-{self.spec.name}-{fire}", daemon=True
        )
        with self._active_lock:
            self.active = [a for a in self.active if a.thread.is_alive()]
            self.active.append(_Active(run, t))
        t.start()

    def shutdown(self) -> None:
        """Stop running jobs gracefully (SIGTERM, then SIGKILL after the grace) and record them."""
        for t in self._replacers:  # a tick waiting to replace records itself skipped
            t.join(timeout=10)
        with self._active_lock:
            active = list(self.active)
        for a in active:
            a.run.cancel("runner shutting down")
        for a in active:
            a.thread.join(timeout=self.spec.grace_s + 15)
        self.unregister()
        if self._blocking is not None:
            _close_client(self._blocking)


def _blocking_clone(client: Any, socket_timeout: float) -> Any:
    """Another client to the same server(s) with ``socket_timeout`` (as the consumer's
    wake-up listener makes its own)."""
    from rsched.core.conn import cluster_clone, is_cluster

    if is_cluster(client):
        return cluster_clone(client, socket_timeout=socket_timeout)
    pool = client.connection_pool
    kwargs = dict(pool.connection_kwargs)
    kwargs["socket_timeout"] = socket_timeout
    return redis.Redis(
        connection_pool=redis.ConnectionPool(
            connection_class=pool.connection_class, max_connections=8, **kwargs
        )
    )


def _close_client(client: Any) -> None:
    from rsched.core.conn import is_cluster

    try:
        if is_cluster(client):
            client.disconnect_connection_pools()
        else:
            client.connection_pool.disconnect()
    except Exception:  # noqa: BLE001 - best effort at exit
        pass


class JobRun:
    """One run of a cron job: child process, watchdog, execution record."""

    def __init__(
        self,
        runner: CronRunner,
        fire: int,
        token: int,
        owner: str,
        started_ms: int,
        shard: tuple[int, int] | None,
        since: float | None = None,
    ):
        self.r = runner
        #: Monotonic send time of the call that took the run lock (its lease runs from then).
        self.since = since
        self.fire = fire
        self.token = token
        self.owner = owner
        self.started_ms = started_ms  # server time of the claim; moved to the child's start
        self._claimed = time.monotonic()
        self.shard = shard
        self.child: proc.Child | None = None
        self.stop_reason: str | None = None
        self._cancel = threading.Event()
        self.lost = threading.Event()
        self.dog: Watchdog | None = None
        #: The run's watchdog blocks on the cron's wake key (replace): finish wakes it.
        self._wakes = bool(owner) and runner.spec.concurrency == "replace"

    def _waiter(self) -> Callable[[float], object]:
        """The watchdog's wait between renewals (replace): ``BZPOPMIN`` on the wake key,
        so that a runner asking this run to stop is heard at once, at no cost while idle."""
        r = self.r
        client = r.blocking_client()

        def wait(timeout_s: float) -> object:
            popped = client.bzpopmin([r.wake_key], timeout=timeout_s)
            if popped and popped[1] in ("w", b"w") and self.dog is not None and self.dog.stopped:
                # This run ended meanwhile: the wake-up is meant for the next holder.
                r.rs.redis.zadd(r.wake_key, {"w": float(popped[2])})
            return popped

        return wait

    def cancel(self, reason: str, grace_s: float | None = None) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
        self._cancel.set()
        if self.child is not None:
            self.child.stop(reason, self.r.spec.grace_s if grace_s is None else grace_s)

    def run(self) -> None:
        r, s = self.r, self.r.spec
        try:
            self._run()
        except Exception as exc:  # noqa: BLE001 - report, never kill the runner
            r.log(
                f"cron {s.name}: job for tick {iso(self.fire)} failed to run: {type(exc).__name__}: {exc}"
            )

    def _run(self) -> None:
        r, s = self.r, self.r.spec
        dog: Watchdog | None = None
        if self.owner:

            def renew() -> int:
                return int(r.rs.scripts("lock-renew-1", [r.k.run_lock], [self.owner, s.ttl_ms])[0])

            def on_lost(reason: str) -> None:
                self.lost.set()
                r.log(
                    f"cron {s.name}: run lock of tick {iso(self.fire)} lost ({reason})"
                    + ("; stopping the job" if s.on_lock_lost == "kill" else "; the job continues")
                )
                if s.on_lock_lost == "kill" and dog is not None:
                    # SIGKILL before the lease can have expired (the grace is cut to fit)
                    self.cancel("lock lost", dog.stop_grace(s.grace_s))

            def on_cancel() -> None:
                r.log(
                    f"cron {s.name}: a newer tick replaces the run of {iso(self.fire)}; stopping it"
                )
                self.cancel("replaced by a newer tick")

            wait = None
            if s.concurrency == "replace":
                wait = self._waiter()
            dog = Watchdog(
                renew,
                s.ttl_ms,
                on_lost=on_lost,
                on_cancel=on_cancel,
                name=f"rsched-watchdog-{s.name}",
                wait=wait,
            ).start(since=self.since)
            self.dog = dog
        if s.jitter_ms:
            self._cancel.wait(random.uniform(0, s.jitter_ms) / 1000)
        env = {
            "RSCHED_NAME": s.name,
            "RSCHED_FIRE_AT": iso(self.fire) or "",
            "RSCHED_FENCING_TOKEN": str(self.token),
        }
        if self.shard is not None and not s.broadcast:
            env["RSCHED_SHARD_INDEX"] = str(self.shard[0])
            env["RSCHED_SHARD_TOTAL"] = str(self.shard[1])
        t0 = time.monotonic()
        self.started_ms += int((t0 - self._claimed) * 1000)  # after jitter, by the server's clock
        if self._cancel.is_set():
            result = proc.ChildResult(143, False, self.stop_reason, "", 0)
        else:
            self.child = proc.Child(s.command, env=proc.child_env(env))
            if self._cancel.is_set():  # cancelled while starting
                self.child.stop(self.stop_reason or "cancelled", s.grace_s)
            result = self.child.wait(s.timeout_ms / 1000 if s.timeout_ms else None, s.grace_s)
        if dog is not None:
            # A blocking watchdog (replace) is woken by cron-finish-5, then joined.
            dog.stop(join=not self._wakes)
        if self.lost.is_set():
            outcome = "lost"
        elif result.timed_out:
            outcome = "timeout"
        elif result.ok:
            outcome = "ok"
        else:
            outcome = "failed"
        rec: dict[str, Any] = {
            "kind": "cron",
            "name": s.name,
            "fire_ms": self.fire,
            "started_ms": self.started_ms,
            "duration_ms": int((time.monotonic() - t0) * 1000),
            "result": outcome,
            "exit_code": result.exit_code,
            "host": r.host,
            "pid": r.pid,
            "attempt": 1,
            "token": self.token,
        }
        if self.shard is not None and not s.broadcast:
            rec["shard"], rec["shard_total"] = self.shard
        if outcome != "ok":
            rec["error"] = result.describe()
        (r.debug if outcome == "ok" else r.log)(
            f"cron {s.name}: tick {iso(self.fire)} {outcome}"
            + (f" ({rec.get('error')})" if outcome != "ok" else "")
            + f" in {rec['duration_ms']} ms"
        )
        self._finish(rec)

    def _finish(self, rec: dict[str, Any]) -> None:
        r = self.r
        payload = json.dumps(rec, separators=(",", ":"), ensure_ascii=False)
        delay = 0.2
        deadline = time.monotonic() + 300
        while True:
            try:
                r.rs.scripts(
                    "cron-finish-5",
                    [r.k.run_lock, r.k.state, r.k.history, r.k.stats, r.wake_key],
                    [self.owner, r.rs.history_maxlen, payload, int(self._wakes)],
                )
                break
            except Exception as exc:  # noqa: BLE001
                if not _is_redis_down(exc) or time.monotonic() > deadline:
                    r.log(f"cron {r.spec.name}: could not record tick {iso(self.fire)}: {exc}")
                    break
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
        if self.dog is not None and self._wakes:
            self.dog.join(2)


def run_runners(
    rs: Context,
    specs: Sequence[CronSpec],
    stop: threading.Event,
    log: Callable[[str], None],
    debug: Callable[[str], None] | None = None,
    wait: WaitPolicy | None = None,
) -> list[CronRunner]:
    """Run one runner thread per spec until ``stop`` is set; returns the runners when all ended."""
    runners = [CronRunner(rs, sp, stop, log, debug, wait) for sp in specs]
    threads = [
        threading.Thread(target=r.run, name=f"rsched-cron-{r.spec.name}", daemon=True)
        for r in runners
    ]
    for t in threads:
        t.start()
    systemd.ready(f"cron runner for {', '.join(r.spec.name for r in runners)}")
    wd = systemd.watchdog_interval_s()
    tick = min(1.0, wd / 2) if wd else 1.0
    while not stop.is_set():
        stop.wait(tick)
        if wd and all(t.is_alive() for t in threads):
            systemd.watchdog()
    systemd.stopping()
    for t in threads:
        t.join(timeout=60)
    return runners


# --- pause / resume / listing ------------------------------------------------------------
def pause(rs: Context, name: str) -> bool:
    """Pause cron ``name``; returns whether any runner ever registered it."""
    validate.name(name, "NAME")
    k = rs.keys.cron(name)
    known = bool(rs.redis.sismember(rs.keys.crons, name))
    rs.scripts("cron-pause-2", [k.paused, k.state], ["pause"])
    return known


def resume(rs: Context, name: str) -> bool:
    """Resume cron ``name``; returns whether it was paused. The pause's span is kept
    (state ``pause_from_ms`` / ``pause_to_ms``): ticks inside it that a runner only
    catches up on later are recorded ``skipped`` (paused), not ``missed``."""
    validate.name(name, "NAME")
    k = rs.keys.cron(name)
    return int(rs.scripts("cron-pause-2", [k.paused, k.state], ["resume"])[0]) == 1


@dataclass
class CronInfo:
    name: str
    schedule: str | None
    tz: str | None
    next_fire_ms: int | None
    last_fire_ms: int | None
    last_result: str | None
    last_host: str | None
    runners: int
    paused: bool
    running: bool
    dialect: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "schedule": self.schedule,
            "tz": self.tz,
            "dialect": self.dialect,
            "next_fire_at": iso(self.next_fire_ms),
            "next_fire_ms": self.next_fire_ms,
            "last_fire_at": iso(self.last_fire_ms),
            "last_fire_ms": self.last_fire_ms,
            "last_result": self.last_result,
            "last_host": self.last_host,
            "runners": self.runners,
            "paused": self.paused,
            "running": self.running,
        }


def list_crons(rs: Context) -> list[CronInfo]:
    names = sorted(rs.redis.smembers(rs.keys.crons))
    now = rs.now_ms()
    if not names:
        return []
    pipe = rs.redis.pipeline(transaction=False)
    for n in names:
        k = rs.keys.cron(n)
        pipe.hgetall(k.state)
        pipe.exists(k.paused)
        pipe.zcount(k.runners, now, "+inf")
        pipe.exists(k.run_lock)
    res = pipe.execute()
    out = []
    for i, n in enumerate(names):
        st, paused, runners, running = res[4 * i : 4 * i + 4]
        nxt = None
        dialect = st.get("dialect") or (
            cronexpr.dialect_of(st["schedule"], None) if st.get("schedule") else None
        )
        if st.get("schedule"):
            try:
                nxt = cronexpr.parse(
                    st["schedule"], st.get("tz") or "UTC", dialect=dialect
                ).next_after(now)
            except errors.BadInput:
                nxt = None
        lf = st.get("last_run_fire")
        out.append(
            CronInfo(
                n,
                st.get("schedule"),
                st.get("tz"),
                nxt,
                int(lf) if lf else None,
                st.get("last_result"),
                st.get("last_host"),
                int(runners),
                bool(paused),
                bool(running),
                dialect,
            )
        )
    return out
