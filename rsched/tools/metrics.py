"""Prometheus metrics, read from Redis at scrape time (``prometheus_client``).

``rsched metrics`` prints them once (for node_exporter's textfile collector);
:func:`serve` exposes the same collector over HTTP (``run ... --metrics-port``).
Every value comes from Redis, so any host (or all of them) can export them: the
numbers describe the shared queues and crons, not one process.

Queues (label ``queue``)::

    rsched_queue_tasks{state}            scheduled (not yet due) | due | processing | dead
    rsched_queue_stale_tasks             processing tasks whose lease has expired
    rsched_queue_lag_seconds             age of the oldest due task (0 when none waits)
    rsched_queue_consumers               live consumers
    rsched_queue_paused                  1 while the queue is paused
    rsched_queue_unrunnable_tasks        due tasks no live consumer has a handler for
    rsched_queue_unrunnable_lag_seconds  age of the oldest of them (0 when none)
    rsched_queue_throttled               1 while the queue's rate limit holds claims back
    rsched_task_runs_total{type,result}  handler runs: ok | failed | timeout | ...
    rsched_task_dead_total{type}         tasks moved to the dead-letter set

Crons (label ``cron``)::

    rsched_cron_runs_total{result}       ok | failed | timeout | skipped | missed | ...
    rsched_cron_runners                  live runners
    rsched_cron_paused                   1 while paused
    rsched_cron_last_fire_timestamp_seconds
    rsched_cron_lateness_seconds         start of the latest run minus its tick time

Run durations, one histogram of every recorded run (labels ``kind`` (cron |
exec | task), ``name`` (the cron or lock), ``queue`` and ``type`` (a task's))::

    rsched_run_duration_seconds_bucket{le}  runs that took at most le seconds
    rsched_run_duration_seconds_sum / _count

Its buckets (:data:`DURATION_BUCKETS_MS`: 0.1 s to 3 h) are counters kept in
Redis by the script that records the run, in the same step (``_duration.lua``:
two ``HINCRBY`` per run, in the cron's, lock's or queue's stats hash; a field
per bucket used, about 60 bytes each), so every host exports the same
cumulative numbers and ``rate()`` works across restarts.

Locks (label ``lock``)::

    rsched_lock_held                     1 while held
    rsched_lock_ttl_seconds              time left on the lease

Alert sinks (labels ``sink``, its id, and ``target``, its command or URL
without secrets or query)::

    rsched_alert_deliveries_total{outcome}  delivered | failed | retried

plus ``rsched_up`` (1) and ``rsched_scrape_duration_seconds``. When Redis cannot
be read, ``rsched metrics`` writes :func:`down_exposition` instead: ``rsched_up 0``
and nothing else (no stale depth or lag for the textfile collector to keep serving).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from rsched.core.errors import ConfigError
from rsched.queue import queues as partitions

if TYPE_CHECKING:  # pragma: no cover
    from rsched.api import Rsched

#: Upper bounds (ms) of the run-duration histogram; the same list as in
#: ``rsched/lua/_duration.lua`` (a unit test holds them equal).
DURATION_BUCKETS_MS = (
    100,
    500,
    1000,
    5000,
    10000,
    30000,
    60000,
    300000,
    900000,
    1800000,
    3600000,
    10800000,
)
INSTALL_HINT = "prometheus_client is not installed: pip install 'rsched[metrics]'"
UP_HELP = "1 when rsched could read its state from Redis."
#: The JSON samples of :func:`down_exposition`.
DOWN_SAMPLES: list[dict[str, Any]] = [{"name": "rsched_up", "labels": {}, "value": 0.0}]


def _prom() -> Any:
    try:
        import prometheus_client
        import prometheus_client.core
    except ImportError:
        raise ConfigError(INSTALL_HINT) from None
    return prometheus_client


def duration_buckets(
    fields: dict[str, int], suffix: str = ""
) -> tuple[list[tuple[str, float]], float] | None:
    """The histogram's cumulative buckets (``le`` in seconds, then ``+Inf``) and sum
    (seconds) from a stats hash's ``dur<LE`` / ``dur_ms`` fields (each + ``suffix``);
    None when it counts no run."""
    per = {le: int(fields.get(f"dur<{le}{suffix}", 0)) for le in DURATION_BUCKETS_MS}
    inf = int(fields.get(f"dur<inf{suffix}", 0))
    if not inf and not any(per.values()):
        return None
    out: list[tuple[str, float]] = []
    total = 0
    for le in DURATION_BUCKETS_MS:
        total += per[le]
        out.append((f"{le / 1000:g}", total))
    out.append(("+Inf", total + inf))
    return out, int(fields.get(f"dur_ms{suffix}", 0)) / 1000


def _is_duration(field: str) -> bool:
    return field.startswith("dur<") or field.startswith("dur_ms")


def _split(field: str) -> tuple[str, str]:
    """``"failed|order.close"`` -> ``("failed", "order.close")``; ``"ok"`` -> ``("ok", "")``."""
    result, _, rest = field.partition("|")
    return result, rest


class RschedCollector:
    """A custom collector: every scrape reads the current state from Redis."""

    def __init__(self, rs: Rsched):
        self.rs = rs
        self._dur: Any = None  # the run-duration histogram of the scrape going on

    def describe(self) -> list[Any]:
        return []  # no fixed series: registering must not touch Redis

    def collect(self) -> Iterator[Any]:
        core = _prom().core
        t0 = time.perf_counter()
        self._dur = core.HistogramMetricFamily(
            "rsched_run_duration_seconds",
            "Durations of recorded runs (cron jobs, exec, task handlers).",
            labels=["kind", "name", "queue", "type"],
        )
        yield from self._queues(core)
        yield from self._crons(core)
        yield from self._locks(core)
        yield self._dur
        yield from self._alerts(core)
        up = core.GaugeMetricFamily("rsched_up", UP_HELP)
        up.add_metric([], 1)
        yield up
        took = core.GaugeMetricFamily(
            "rsched_scrape_duration_seconds", "Time spent reading the metrics from Redis."
        )
        took.add_metric([], time.perf_counter() - t0)
        yield took

    # --- queues -----------------------------------------------------------------
    def _queues(self, core: Any) -> Iterator[Any]:
        from rsched.queue.ops import queue_stats

        rs = self.rs
        stats = queue_stats(rs)
        tasks = core.GaugeMetricFamily(
            "rsched_queue_tasks", "Tasks in the queue by state.", labels=["queue", "state"]
        )
        stale = core.GaugeMetricFamily(
            "rsched_queue_stale_tasks",
            "Processing tasks whose lease has expired.",
            labels=["queue"],
        )
        lag = core.GaugeMetricFamily(
            "rsched_queue_lag_seconds",
            "Age of the oldest due task (0 when none waits).",
            labels=["queue"],
        )
        consumers = core.GaugeMetricFamily(
            "rsched_queue_consumers", "Live consumers.", labels=["queue"]
        )
        paused = core.GaugeMetricFamily(
            "rsched_queue_paused", "1 while the queue is paused.", labels=["queue"]
        )
        unrunnable = core.GaugeMetricFamily(
            "rsched_queue_unrunnable_tasks",
            "Due tasks no live consumer can run (no handler for their type).",
            labels=["queue"],
        )
        throttled = core.GaugeMetricFamily(
            "rsched_queue_throttled",
            "1 while the queue's rate limit (rate_limit) holds claims back.",
            labels=["queue"],
        )
        type_throttled = core.GaugeMetricFamily(
            "rsched_queue_type_throttled",
            "1 while a type's own rate limit (type_rate_limits) holds its claims back.",
            labels=["queue", "type"],
        )
        unrunnable_lag = core.GaugeMetricFamily(
            "rsched_queue_unrunnable_lag_seconds",
            "Age of the oldest due task no live consumer can run (0 when none).",
            labels=["queue"],
        )
        for s in stats:
            for state in ("scheduled", "due", "waiting", "processing", "dead"):
                tasks.add_metric([s.queue, state], getattr(s, state))
            stale.add_metric([s.queue], s.stale)
            lag.add_metric([s.queue], s.lag_ms / 1000)
            consumers.add_metric([s.queue], s.consumers)
            paused.add_metric([s.queue], 1 if s.paused else 0)
            unrunnable.add_metric([s.queue], s.unrunnable)
            unrunnable_lag.add_metric([s.queue], s.unrunnable_lag_ms / 1000)
            throttled.add_metric([s.queue], 1 if s.throttled else 0)
            for task_type in s.type_rate_limits:
                type_throttled.add_metric(
                    [s.queue, task_type], 1 if task_type in s.throttled_types else 0
                )
        yield from (tasks, stale, lag, consumers, paused, unrunnable, unrunnable_lag, throttled)
        yield type_throttled

        runs = core.CounterMetricFamily(
            "rsched_task_runs",
            "Task handler runs by type and result.",
            labels=["queue", "type", "result"],
        )
        dead = core.CounterMetricFamily(
            "rsched_task_dead",
            "Tasks moved to the dead-letter set, by type.",
            labels=["queue", "type"],
        )
        pipe = rs.redis.pipeline(transaction=False)
        parts = [partitions.names(rs, s.queue) for s in stats]
        for names in parts:
            for name in names:
                pipe.hgetall(rs.keys.queue(name).stats)
        replies = iter(pipe.execute() if stats else [])
        for s, names in zip(stats, parts, strict=True):
            counters: dict[str, int] = {}
            for _ in names:  # a partitioned queue's counters summed
                for field, value in next(replies).items():
                    counters[field] = counters.get(field, 0) + int(value)
            types = set()
            for field, value in sorted(counters.items()):
                result, task_type = _split(field)
                if not task_type:
                    continue
                if _is_duration(field):
                    types.add(task_type)
                    continue
                if result == "dead":
                    dead.add_metric([s.queue, task_type], int(value))
                else:
                    runs.add_metric([s.queue, task_type, result], int(value))
            for task_type in sorted(types):
                self._observe(["task", "", s.queue, task_type], counters, f"|{task_type}")
        yield from (runs, dead)

    def _observe(self, labels: list[str], fields: dict[str, Any], suffix: str = "") -> None:
        got = duration_buckets({k: int(v) for k, v in fields.items()}, suffix)
        if got is not None:
            self._dur.add_metric(labels, got[0], got[1])

    # --- crons ------------------------------------------------------------------
    def _crons(self, core: Any) -> Iterator[Any]:
        rs = self.rs
        names = sorted(rs.redis.smembers(rs.keys.crons))
        runs = core.CounterMetricFamily(
            "rsched_cron_runs", "Cron runs by result.", labels=["cron", "result"]
        )
        runners = core.GaugeMetricFamily(
            "rsched_cron_runners", "Live runners of the cron.", labels=["cron"]
        )
        paused = core.GaugeMetricFamily(
            "rsched_cron_paused", "1 while the cron is paused.", labels=["cron"]
        )
        last = core.GaugeMetricFamily(
            "rsched_cron_last_fire_timestamp_seconds",
            "Tick time of the latest run.",
            labels=["cron"],
        )
        late = core.GaugeMetricFamily(
            "rsched_cron_lateness_seconds",
            "Start of the latest run minus its tick time.",
            labels=["cron"],
        )
        if names:
            now = rs.now_ms()
            pipe = rs.redis.pipeline(transaction=False)
            for n in names:
                ck = rs.keys.cron(n)
                pipe.hgetall(ck.stats)
                pipe.zcount(ck.runners, f"({now}", "+inf")
                pipe.exists(ck.paused)
                pipe.hget(ck.state, "last_run_fire")
                pipe.xrevrange(ck.history, count=5)
            res = pipe.execute()
            for i, n in enumerate(names):
                counters, nrunners, is_paused, last_fire, recent = res[5 * i : 5 * i + 5]
                for field, value in sorted((counters or {}).items()):
                    if _is_duration(field):
                        continue
                    result, _ = _split(field)
                    runs.add_metric([n, result], int(value))
                self._observe(["cron", n, "", ""], counters or {})
                runners.add_metric([n], int(nrunners))
                paused.add_metric([n], 1 if is_paused else 0)
                if last_fire not in (None, "", "-1"):
                    last.add_metric([n], int(last_fire) / 1000)
                lateness = _lateness(recent or [])
                if lateness is not None:
                    late.add_metric([n], lateness / 1000)
        yield from (runs, runners, paused, last, late)

    # --- locks ------------------------------------------------------------------
    def _locks(self, core: Any) -> Iterator[Any]:
        rs = self.rs
        held = core.GaugeMetricFamily(
            "rsched_lock_held", "1 while the lock is held.", labels=["lock"]
        )
        ttl = core.GaugeMetricFamily(
            "rsched_lock_ttl_seconds", "Time left on the lock's lease.", labels=["lock"]
        )
        registry = getattr(rs.keys, "locks", None)
        if isinstance(registry, str):
            names = sorted(rs.redis.smembers(registry))
            if names:
                pipe = rs.redis.pipeline(transaction=False)
                for n in names:
                    pipe.pttl(rs.keys.lock(n).lock)
                    pipe.hgetall(rs.keys.lock(n).stats)
                got = pipe.execute()
                for n, pttl, counters in zip(names, got[::2], got[1::2], strict=True):
                    self._observe(["exec", n, "", ""], counters or {})
                    is_held = int(pttl) != -2
                    held.add_metric([n], 1 if is_held else 0)
                    if int(pttl) >= 0:
                        ttl.add_metric([n], int(pttl) / 1000)
        yield from (held, ttl)

    # --- alerts -----------------------------------------------------------------
    def _alerts(self, core: Any) -> Iterator[Any]:
        from rsched.tools.events import delivery_stats

        total = core.CounterMetricFamily(
            "rsched_alert_deliveries",
            "Alert delivery attempts by sink and outcome: delivered, failed (after the "
            "last attempt), retried (an attempt that failed and will be retried).",
            labels=["sink", "target", "outcome"],
        )
        for sid, target, outcome, n in delivery_stats(self.rs):
            total.add_metric([sid, target, outcome], n)
        yield total


def _lateness(entries: list[Any]) -> int | None:
    """ms between the tick and the start of the newest record that has both."""
    for _id, fields in entries:
        try:
            rec = json.loads(fields.get("j", "{}"))
            return int(rec["started_ms"]) - int(rec["fire_ms"])
        except (ValueError, KeyError, TypeError):
            continue
    return None


def registry(rs: Rsched) -> Any:
    """A CollectorRegistry holding only the rsched collector."""
    prom = _prom()
    reg = prom.CollectorRegistry(auto_describe=False)
    reg.register(RschedCollector(rs))
    return reg


def exposition(rs: Rsched) -> str:
    """The metrics in Prometheus text format."""
    return _prom().generate_latest(registry(rs)).decode("utf-8")


def samples(rs: Rsched) -> list[dict[str, Any]]:
    """The same metrics as JSON-ready samples: ``{"name", "labels", "value"}``."""
    return [
        {"name": s.name, "labels": dict(s.labels), "value": s.value}
        for fam in registry(rs).collect()
        for s in fam.samples
    ]


def down_exposition() -> str:
    """``rsched_up 0`` alone, in the text format (written by hand: it must not
    need prometheus_client, whose absence is one of the failures it reports)."""
    return f"# HELP rsched_up {UP_HELP}\n# TYPE rsched_up gauge\nrsched_up 0.0\n"


def serve(rs: Rsched, port: int, addr: str = "127.0.0.1") -> Any:
    """Serve ``/metrics`` on ``addr:port`` from a daemon thread; returns the server."""
    prom = _prom()
    return prom.start_http_server(port, addr=addr, registry=registry(rs))
