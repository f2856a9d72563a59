"""`rsched run cron`: a cron runner that fires each tick exactly once across
any number of runners and hosts.

How a tick is fired (see ``lua/cron-tick-9.lua``):

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

This module is the loop (ticks, claims, the replace hand-over); the spec it
takes is :mod:`rsched.cron.spec`, one run of the job :mod:`rsched.cron.job`,
the listing and the pause switch :mod:`rsched.cron.admin`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis

from rsched.core import clients, cronexpr, errors
from rsched.core.errors import map_error
from rsched.core.timeutil import iso
from rsched.core.transient import TRANSIENT
from rsched.cron.job import JobRun
from rsched.cron.spec import CronSpec
from rsched.cron.trigger import BLOCK_S, AfterFollower, Inbox
from rsched.locks.lock import new_owner_id
from rsched.lua import calls
from rsched.runtime import systemd

if TYPE_CHECKING:  # pragma: no cover
    from rsched.context import Context
    from rsched.core.replication import WaitPolicy


#: A tick claimed at most this late counts as on time (unless --starting-deadline says
#: otherwise), and at most half the gap to the next tick (see CronRunner._deadline).
ON_TIME_MS = 5_000
#: --misfire run-once: no catch-up run of a missed tick when the next tick is this close
#: (that tick runs on time instead, and is the catch-up).
CATCH_UP_FOLD_MS = 5_000
#: Runner registry entries live this long; refreshed by every claim and by heartbeats.
RUNNER_TTL_MS = 30_000
#: A waiting runner talks to Redis at least this often (heartbeat + clock offset).
HEARTBEAT_S = BLOCK_S
#: Ticks older than this many intervals (at least MIN_KEEP_MS) are trimmed from the ticks set.
MIN_KEEP_MS = 3_600_000
#: Missed ticks recorded one by one after an outage at most (older ones are only counted).
MAX_BACKLOG = 100


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
        #: concurrency replace: the holder's watchdog blocks in BZPOPMIN on the cron's
        #: ``wake`` ZSET (see cron-start-5), on a client of its own (blocking_client).
        self._blocking: Any = None
        self._blocking_lock = threading.Lock()
        self._replacers: list[threading.Thread] = []
        #: Run requests (rsched trigger, --after): the idle wait blocks on them.
        self.inbox = Inbox(self)
        self._followers: list[AfterFollower] = []

    # --- Redis calls (each also measures the server clock) ------------------------
    def _contact(self, t0: float, server_ms: int | None = None) -> None:
        """A call sent at ``t0`` (local clock) answered; ``server_ms``: the server's
        clock in its reply."""
        t1 = time.time()
        self.commands += 1
        self._last_contact = time.monotonic()
        if server_ms is not None:
            self.clock.observe(server_ms, t0, t1)

    def _replicas(self, acked: int | None, won: bool) -> None:
        """--wait-replicas: a claim that won and was short of replicas is logged; the job runs."""
        if self.wait and acked is not None and won:
            short = self.wait.shortfall(acked, f"cron {self.spec.name}: the tick claim")
            if short:
                self.log(f"rsched: warning: {short}; running the job anyway")

    def _heartbeat(self) -> None:
        t0 = time.time()
        _live, now = calls.cron_heartbeat(self.rs, self.k, self.runner_id, RUNNER_TTL_MS)
        self._contact(t0, now)

    def _keep_ms(self, now: int) -> int:
        if self._keep is None:
            try:
                sched = self.spec.schedule
                self._keep = max(3 * sched.interval_ms(now), MIN_KEEP_MS) if sched else MIN_KEEP_MS
            except errors.BadInput:  # pragma: no cover
                self._keep = MIN_KEEP_MS
        return self._keep

    def register(self) -> None:
        s = self.spec
        before = self.rs.redis.hmget(self.k.state, "schedule", "tz", "registered_by", "dialect")
        expr, tz, dialect = (
            (s.schedule.expr, s.schedule.tz, s.schedule.dialect) if s.schedule else ("", "UTC", "")
        )
        mine = (expr, tz, dialect)
        theirs = (
            before[0],
            before[1],
            before[3] or (cronexpr.dialect_of(before[0], None) if before[0] else ""),
        )
        if before[0] is not None and theirs != mine:
            self.log(
                f"cron {s.name}: warning: runner {before[2]} registered it with schedule "
                f"{before[0]!r} ({before[1]}, {theirs[2]}); this runner uses "
                f"{expr!r} ({tz}, {dialect}). "
                "Runners of one cron should share its schedule."
            )
        pipe = self.rs.redis.pipeline(transaction=False)
        pipe.sadd(self.rs.keys.crons, s.name)
        pipe.hset(
            self.k.state,
            mapping={
                "schedule": expr,
                "tz": tz,
                "dialect": dialect,
                "after": ",".join(s.after),
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
    def _interrupt_at_stop(self) -> None:
        """The idle wait blocks in Redis (XREAD): end it as soon as ``stop`` is set."""
        self.stop.wait()
        self.inbox.close()
        for f in self._followers:
            f.close()

    def run(self) -> None:
        backoff = 0.2
        registered = False
        threading.Thread(
            target=self._interrupt_at_stop, daemon=True, name=f"rsched-stop-{self.spec.name}"
        ).start()
        while not self.stop.is_set():
            try:
                if not registered:
                    self._heartbeat()
                    self.register()
                    self.inbox.start()
                    registered = True
                    if not self._followers:
                        self._followers = [AfterFollower(self, a).start() for a in self.spec.after]
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
                if self.stop.is_set():
                    break
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
        sched = self.spec.schedule
        t0 = time.time()
        now = self.rs.now_ms()
        self.clock.observe(now, t0, time.time())
        last = self.rs.redis.hget(self.k.state, "last_tick")
        self.commands += 2
        if last is not None and int(last) < now and sched is not None:
            # Ticks since the last one any runner handled are the backlog (misfire policy),
            # limited to the latest MAX_BACKLOG of them.
            backlog = sched.ticks_between(int(last), now, limit=MAX_BACKLOG)
            self.cursor = backlog[0] - 1 if backlog else now
            if backlog:
                self.debug(
                    f"cron {self.spec.name}: {len(backlog)} tick(s) since the last one handled"
                )
        else:
            self.cursor = now

    def _wait_until(self, target_ms: float) -> bool:
        """Sleep until the server's clock reaches ``target_ms``; False when stopping."""
        while not self.stop.is_set():
            remaining = target_ms - self.clock.now()
            if remaining <= 0:
                return True
            since = time.monotonic() - self._last_contact
            if since >= HEARTBEAT_S:
                self._heartbeat()  # keeps the registration and re-measures the clock offset
                self.inbox.take()  # a request whose wake-up this runner missed
                continue
            # Not a sleep: a blocking read of the run requests' wake-up stream.
            self.inbox.idle(min(remaining / 1000, HEARTBEAT_S - since))
        return False

    def _step(self) -> None:
        assert self.cursor is not None
        s = self.spec
        if s.schedule is None:  # runs only when asked (--after, rsched trigger)
            self._wait_until(float("inf"))
            return
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
        assert s.schedule is not None
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
        t0 = time.time()
        res = calls.cron_tick(
            self.rs,
            self.k,
            fire_ms=fire,
            mode=mode,
            runner=self.runner_id,
            owner=owner,
            ttl_ms=s.ttl_ms,
            host=self.host,
            pid=self.pid,
            concurrency=s.concurrency,
            deadline_ms=deadline,
            keep_ms=self._keep_ms(fire),
            history_maxlen=self.rs.history_maxlen,
            name=s.name,
            runner_ttl_ms=RUNNER_TTL_MS,
            wait=self.wait,
        )
        self._contact(t0, res.now_ms)
        self._replicas(res.replicas_acked, res.status == "run")
        st, now = res.status, res.now_ms
        self.debug(f"cron {s.name}: tick {iso(fire)}: {st}")
        if st == "run":
            assert res.token is not None
            self._start_job(
                fire, res.token, owner if s.concurrency != "allow" else "", now, since=sent
            )
        elif st == "replace":
            self.log(f"cron {s.name}: tick {iso(fire)}: the running job is asked to stop")
            self.start_replace(fire, owner)
        elif st == "missed":
            self.log(f"cron {s.name}: tick {iso(fire)} missed (recorded)")
        elif st in ("paused", "skipped"):
            self.debug(f"cron {s.name}: tick {iso(fire)} skipped ({st})")
        return st

    def start_replace(self, fire: int, owner: str, extra: dict[str, Any] | None = None) -> None:
        """Wait (in a thread) for the asked-to-stop holder, then run ``fire``."""
        t = threading.Thread(
            target=self._replace,
            args=(fire, owner, extra),
            daemon=True,
            name=f"rsched-replace-{self.spec.name}",
        )
        self._replacers = [r for r in self._replacers if r.is_alive()] + [t]
        t.start()

    def _replace(self, fire: int, owner: str, extra: dict[str, Any] | None = None) -> None:
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
                res = calls.cron_start(
                    self.rs,
                    self.k,
                    fire_ms=fire,
                    owner=owner,
                    ttl_ms=s.ttl_ms,
                    host=self.host,
                    pid=self.pid,
                    give_up=give_up,
                    history_maxlen=self.rs.history_maxlen,
                    name=s.name,
                    take=not stopping,
                )
                self._contact(0.0)
            except Exception as exc:  # noqa: BLE001
                if self.stop.is_set() or not _is_redis_down(exc):
                    self.log(f"cron {s.name}: replace of tick {iso(fire)} failed: {exc}")
                    return
                self.stop.wait(0.5)
                continue
            st = res.status
            if st == "run":
                assert res.token is not None
                self._start_job(fire, res.token, owner, res.now_ms, since=sent, extra=extra)
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
                self._blocking = clients.clone(
                    self.rs.redis, socket_timeout=self.spec.ttl_ms / 3000 + 10, max_connections=8
                )
            return self._blocking

    def _handle_sharded(self, fire: int, mode: str, deadline: int) -> str:
        s = self.spec
        total = 1 if s.broadcast else int(s.shards or 1)

        def call(m: str) -> calls.CronShardReply:
            t0 = time.time()
            res = calls.cron_shard(
                self.rs,
                self.k,
                fire_ms=fire,
                mode=m,
                runner=self.runner_id,
                items=total,
                deadline_ms=deadline if mode == "fire" else 0,
                keep_ms=self._keep_ms(fire),
                history_maxlen=self.rs.history_maxlen,
                name=s.name,
                host=self.host,
                pid=self.pid,
                runner_ttl_ms=RUNNER_TTL_MS,
                wait=self.wait,
            )
            self._contact(t0, res.now_ms)
            self._replicas(res.replicas_acked, bool(res.items))
            return res

        res = call("broadcast" if s.broadcast else "own")
        st, now = res.status, res.now_ms
        if st != "ok":
            if st != "early":
                self.debug(f"cron {s.name}: tick {iso(fire)}: {st}")
            return st
        self._start_items(fire, res.items, now)
        if s.broadcast:
            return st
        # Take over items of runners that died before claiming theirs.
        assert s.schedule is not None
        delay = min(max(s.schedule.interval_ms(fire) // 3, 200), 2000)
        if self._wait_until(fire + delay):
            res = call("steal")
            if res.status == "ok":
                self._start_items(fire, res.items, res.now_ms, stolen=True)
        return st

    def _start_items(
        self, fire: int, items: list[tuple[str, int]], now: int, stolen: bool = False
    ) -> None:
        s = self.spec
        for item, token in items:
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
        extra: dict[str, Any] | None = None,
    ) -> None:
        run = JobRun(self, fire, token, owner, started_ms, shard, since=since, extra=extra)
        t = threading.Thread(
            target=run.run, name=f"rsched-job-{self.spec.name}-{fire}", daemon=True
        )
        with self._active_lock:
            self.active = [a for a in self.active if a.thread.is_alive()]
            self.active.append(_Active(run, t))
        t.start()

    def shutdown(self) -> None:
        """Stop running jobs gracefully (SIGTERM, then SIGKILL after the grace) and record them."""
        self.inbox.close()
        for f in self._followers:
            f.close()
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
            clients.close(self._blocking)


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
