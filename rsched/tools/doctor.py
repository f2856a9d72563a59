"""`rsched doctor`: is this Redis safe and usable for rsched?

Each check returns PASS, WARN or FAIL with one line of detail. A check whose
command the server denies (ACL, a managed service that renames CONFIG) says
"could not verify" instead of failing. Nothing here writes to Redis.

Run loops call :func:`startup_warnings` and log what it returns.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import redis

from rsched.core.conn import is_cluster, pool_connection

if TYPE_CHECKING:  # pragma: no cover
    from rsched.api import Rsched

PASS, WARN, FAIL = "PASS", "WARN", "FAIL"

#: Oldest Redis rsched supports (BZPOPMIN with a float timeout, ZRANGE BYSCORE/LIMIT, GETDEL...).
MIN_REDIS = (6, 2)
#: Clock offset between this host and the server above which doctor warns.
CLOCK_WARN_MS = 1000
#: Median PING round trip above which doctor warns.
LATENCY_WARN_MS = 50.0

#: The least-privilege grant: every command rsched sends for add, cancel, list, show,
#: queues, requeue-stale, dead/retry/purge, run consumer, run cron, exec, locks, crons,
#: pause/resume, history and metrics (directly, from redis-py, or from its Lua scripts in
#: rsched/lua), in the order of rsched-operations(7)'s "Least-privilege ACL user" line, each with the
#: arguments doctor probes it with (``K``: a key in the namespace). ``None``: granted but
#: not probed. ``multi``/``exec`` are probed by the transaction the others are queued in;
#: ``select`` only matters for a database other than 0 in the URL; ``script|load``,
#: ``script|exists`` and ``xrange`` are part of the documented grant, but no command
#: needs them (scripts go as EVALSHA, then EVAL on NOSCRIPT), so a user without them
#: is not failed. This is the one list: :func:`acl_setuser` prints the grant from it.
ACL_GRANT: tuple[tuple[str, tuple[str, ...] | None], ...] = (
    ("ping", ("PING",)),
    ("time", ("TIME",)),
    ("select", None),
    ("evalsha", ("EVALSHA", "0" * 40, "1", "K")),
    ("eval", ("EVAL", "return 1", "1", "K")),
    ("script|load", None),
    ("script|exists", None),
    ("multi", None),
    ("exec", None),
    ("scan", ("SCAN", "0", "MATCH", "K", "COUNT", "10")),
    ("bzpopmin", ("BZPOPMIN", "K", "0.01")),
    ("type", ("TYPE", "K")),
    ("exists", ("EXISTS", "K")),
    ("del", ("DEL", "K")),
    ("get", ("GET", "K")),  # a queue's rate limit (`queues`, the consumers' claim)
    ("set", ("SET", "K", "v")),
    ("incr", ("INCR", "K")),
    ("incrby", ("INCRBY", "K", "1")),
    ("pexpire", ("PEXPIRE", "K", "1000")),
    ("pttl", ("PTTL", "K")),
    ("zadd", ("ZADD", "K", "1", "m")),
    ("zrem", ("ZREM", "K", "m")),
    ("zcard", ("ZCARD", "K")),
    ("zcount", ("ZCOUNT", "K", "-inf", "+inf")),
    ("zscore", ("ZSCORE", "K", "m")),
    ("zmscore", ("ZMSCORE", "K", "m")),
    ("zrange", ("ZRANGE", "K", "0", "0")),
    ("zrangebyscore", ("ZRANGEBYSCORE", "K", "-inf", "+inf")),
    ("zremrangebyscore", ("ZREMRANGEBYSCORE", "K", "-inf", "-inf")),
    ("zpopmin", ("ZPOPMIN", "K", "1")),  # run logs: the oldest kept log goes first
    ("zscan", ("ZSCAN", "K", "0", "COUNT", "1")),  # `rsched cancel --all` reads a queue in pages
    ("hget", ("HGET", "K", "f")),
    ("hmget", ("HMGET", "K", "f")),
    ("hgetall", ("HGETALL", "K")),
    ("hexists", ("HEXISTS", "K", "f")),
    ("hset", ("HSET", "K", "f", "v")),
    ("hsetnx", ("HSETNX", "K", "f", "v")),
    ("hdel", ("HDEL", "K", "f")),
    ("hincrby", ("HINCRBY", "K", "f", "1")),
    ("hlen", ("HLEN", "K")),
    ("lpush", ("LPUSH", "K", "1")),  # a lock's release wakes a waiter
    ("blpop", ("BLPOP", "K", "0.01")),  # a waiter for a lock (exec --if-locked wait)
    ("sadd", ("SADD", "K", "m")),
    ("srem", ("SREM", "K", "m")),  # `rsched forget` takes a cron off the registry
    ("sismember", ("SISMEMBER", "K", "m")),
    ("smembers", ("SMEMBERS", "K")),
    ("xadd", ("XADD", "K", "*", "f", "v")),
    ("xrange", None),
    ("xrevrange", ("XREVRANGE", "K", "+", "-", "COUNT", "1")),
    # idle cron runners block on their run requests; --after follows another cron's history
    ("xread", ("XREAD", "COUNT", "1", "STREAMS", "K", "0-0")),
    # alert sinks: one consumer group per sink on each source's events stream
    ("xgroup", ("XGROUP", "CREATE", "K", "g", "$", "MKSTREAM")),
    ("xreadgroup", ("XREADGROUP", "GROUP", "g", "c", "COUNT", "1", "STREAMS", "K", ">")),
    ("xack", ("XACK", "K", "g", "0-1")),
    ("xpending", ("XPENDING", "K", "g")),
    ("xclaim", ("XCLAIM", "K", "g", "c", "0", "0-1")),
    ("xinfo", ("XINFO", "GROUPS", "K")),
    # `rsched cancel` of a running task tells its consumer on the queue's cancel
    # channel (in the namespace: the grant's &NS:*). Not probed: without them a
    # cancelled task's handler is still stopped, at the next heartbeat.
    ("publish", None),
    ("subscribe", None),
    ("unsubscribe", None),
)
#: The commands of the least-privilege grant, in rsched-operations(7)'s order.
ACL_COMMANDS: tuple[str, ...] = tuple(name for name, _ in ACL_GRANT)
#: Granted only when used (rsched-operations(7)): ``wait`` with --wait-replicas / redis.wait_replicas
#: (doctor probes it then); ``info`` and ``config|get`` only for doctor itself, which says
#: "could not verify" for the checks they would answer.
ACL_OPTIONAL: tuple[str, ...] = ("wait", "info", "config|get")


def acl_setuser(
    user: str = "rsched", namespace: str = "rsched", password: str = "CHANGE-ME"
) -> str:
    """rsched-operations(7)'s least-privilege ``ACL SETUSER`` line for ``user`` and ``namespace``."""
    rules = " ".join(f"+{c}" for c in ACL_COMMANDS)
    return (
        f"ACL SETUSER {user} reset on >{password} ~{namespace}:* resetchannels "
        f"&{namespace}:* -@all {rules}"
    )


def _label(acl_name: str) -> str:
    return acl_name.replace("|", " ").upper()


#: The unknown command queued first in doctor's probe transaction: the server refuses it,
#: which marks the transaction so that EXEC aborts it (EXECABORT) without running
#: anything. Neither DISCARD (not in the grant) nor a closed connection is needed.
_ABORT = "RSCHED-DOCTOR-ABORT"


@dataclass
class Check:
    check: str
    status: str
    detail: str

    def to_json(self) -> dict[str, str]:
        return asdict(self)


class _Denied(Exception):
    """The server refused a command doctor uses to look (NOPERM, renamed, unknown)."""


def _denied(exc: redis.ResponseError) -> bool:
    msg = str(exc)
    return (
        msg.startswith(("NOPERM", "ERR unknown command", "unknown command"))
        or "no permissions" in msg
        or "unknown command" in msg.lower()
    )


def _call(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except redis.ResponseError as exc:
        if _denied(exc):
            raise _Denied(str(exc).split("\n")[0]) from None
        raise


def _is_noperm(exc: Exception) -> bool:
    msg = str(exc)
    return (
        isinstance(exc, redis.exceptions.NoPermissionError)
        or msg.startswith("NOPERM")
        or "no permissions" in msg.lower()
    )


def _classify(acl_name: str, msg: str, denied: list[str], keys_denied: list[str]) -> None:
    """File one refusal (a NOPERM error or an ACL DRYRUN reply) under commands or keys;
    other errors (a wrong argument on some server version) are not ACL refusals."""
    low = msg.lower()
    if not (msg.startswith("NOPERM") or "no permissions" in low or "permission" in low):
        return
    if "key" in low and "command" not in low:
        keys_denied.append(_label(acl_name))
    else:
        denied.append(_label(acl_name))


def _unverified(name: str, what: str, exc: _Denied) -> Check:
    return Check(name, WARN, f"could not verify: {what} denied by the server ({exc})")


class Doctor:
    """Runs the checks against one client; caches INFO sections it already read."""

    def __init__(
        self,
        client: redis.Redis,
        namespace: str = "rsched",
        settings_file: dict[str, Any] | None = None,
        *,
        username: str | None = None,
        wait_replicas: bool = False,
    ):
        self.r = client
        self.ns = namespace
        self.file = settings_file or {}
        #: The ACL user when the client's connections do not say (they normally do).
        self.username = username
        #: Whether rsched is configured to WAIT for replicas (then it needs +wait).
        self.wait_replicas = wait_replicas
        self._info: dict[str, dict[str, Any] | _Denied] = {}
        self._config: dict[str, str | _Denied] = {}

    # --- helpers ------------------------------------------------------------
    def info(self, section: str) -> dict[str, Any]:
        got = self._info.get(section)
        if got is None:
            try:
                got = _call(lambda: self.r.info(section))
            except _Denied as exc:
                got = exc
            self._info[section] = got
        if isinstance(got, _Denied):
            raise got
        return got

    def config(self, name: str) -> str:
        got = self._config.get(name)
        if got is None:
            try:
                got = str(_call(lambda: self.r.config_get(name)).get(name, ""))
            except _Denied as exc:
                got = exc
            self._config[name] = got
        if isinstance(got, _Denied):
            raise got
        return got

    def hello(self) -> dict[str, Any]:
        reply = _call(lambda: self.r.execute_command("HELLO"))
        if isinstance(reply, list):
            reply = dict(zip(reply[::2], reply[1::2], strict=False))
        return {str(k): v for k, v in reply.items()}

    # --- checks -------------------------------------------------------------
    def reachable(self) -> Check:
        samples = []
        for _ in range(5):
            t0 = time.perf_counter()
            self.r.ping()
            samples.append((time.perf_counter() - t0) * 1000)
        med = statistics.median(samples)
        detail = f"PING {med:.2f} ms (median of 5, max {max(samples):.2f} ms)"
        if med > LATENCY_WARN_MS:
            return Check(
                "reachable",
                WARN,
                detail + ": slow; lock renewals and claims wait on every round trip",
            )
        return Check("reachable", PASS, detail)

    def server(self) -> Check:
        try:
            info = self.info("server")
            name = str(info.get("server_name") or "redis")
            version = str(info.get(f"{name}_version") or info.get("redis_version") or "0")
        except _Denied:
            try:
                h = self.hello()
            except _Denied as exc:
                return _unverified("server", "INFO and HELLO", exc)
            name, version = str(h.get("server", "redis")), str(h.get("version", "0"))
        try:
            parts = tuple(int(p) for p in version.split(".")[:2])
        except ValueError:
            parts = (0, 0)
        label = (
            f"{'Valkey' if name == 'valkey' else 'Redis' if name == 'redis' else name} {version}"
        )
        if name == "valkey":
            return Check("server", PASS, label)
        if parts < MIN_REDIS:
            return Check("server", FAIL, f"{label}: rsched needs Redis >= 6.2 or Valkey")
        return Check("server", PASS, label)

    def maxmemory_policy(self) -> Check:
        name = "maxmemory-policy"
        try:
            policy = self.config("maxmemory-policy")
            maxmem = int(self.config("maxmemory") or 0)
        except _Denied as exc:
            try:
                mem = self.info("memory")
            except _Denied:
                return _unverified(name, "CONFIG GET and INFO memory", exc)
            policy = str(mem.get("maxmemory_policy", ""))
            maxmem = int(mem.get("maxmemory", 0) or 0)
        if not policy:
            return Check(name, WARN, "could not verify: the server did not report maxmemory-policy")
        if policy != "noeviction":
            return Check(
                name,
                FAIL,
                f"{policy}: eviction silently deletes tasks and locks when memory "
                "is full; set maxmemory-policy noeviction",
            )
        detail = "noeviction (writes fail loudly when memory is full; nothing is deleted)"
        if maxmem:
            try:
                used = int(self.info("memory").get("used_memory", 0))
            except _Denied:
                used = 0
            pct = 100 * used / maxmem
            detail += f"; {pct:.0f}% of maxmemory used"
            if pct > 80:
                return Check(name, WARN, detail + ": close to the limit, adds will start failing")
        return Check(name, PASS, detail)

    def persistence(self) -> Check:
        name = "persistence"
        aof: bool | None = None
        rdb: bool | None = None
        fsync = ""
        why = ""
        try:
            aof = self.config("appendonly") == "yes"
            fsync = self.config("appendfsync")
            rdb = bool(self.config("save").strip())
        except _Denied as exc:
            why = str(exc)
            try:
                p = self.info("persistence")
                aof = bool(int(p.get("aof_enabled", 0)))
            except _Denied:
                return _unverified(name, "CONFIG GET and INFO persistence", _Denied(why))
        problems = []
        try:
            p = self.info("persistence")
            if aof and p.get("aof_last_write_status", "ok") != "ok":
                problems.append("the last AOF write failed")
            if p.get("rdb_last_bgsave_status", "ok") != "ok":
                problems.append("the last RDB save failed")
        except _Denied:
            pass
        if aof:
            detail = f"AOF on (appendfsync {fsync})" if fsync else "AOF on"
            if rdb:
                detail += ", RDB snapshots on"
            if problems:
                return Check(name, WARN, detail + "; " + "; ".join(problems))
            if fsync == "no":
                return Check(
                    name,
                    WARN,
                    detail + ": the OS decides when to flush; a crash can lose "
                    "recent tasks (use everysec)",
                )
            return Check(name, PASS, detail)
        if rdb is None:
            return Check(
                name, WARN, f"AOF off; could not verify RDB snapshots: CONFIG denied ({why})"
            )
        if rdb:
            detail = (
                "RDB snapshots only: a crash loses the tasks added since the last snapshot; "
                "consider appendonly yes"
            )
            return Check(name, WARN, "; ".join([detail, *problems]))
        return Check(
            name,
            WARN,
            "neither AOF nor RDB snapshots are on: a restart loses every task, "
            "cron state and lock; set appendonly yes",
        )

    def keyspace_events(self) -> Check:
        name = "keyspace-events"
        needed = bool(self.file.get("triggers"))
        try:
            value = self.config("notify-keyspace-events")
        except _Denied as exc:
            if needed:
                return _unverified(name, "CONFIG GET", exc)
            return Check(
                name,
                PASS,
                "could not verify (CONFIG denied); not needed: no keyspace triggers are configured",
            )
        shown = value or "(off)"
        if not needed:
            return Check(
                name,
                PASS,
                f"notify-keyspace-events {shown}: not needed (due times are "
                "decided in Lua with the server's clock, not by expiry events)",
            )
        flags = set(value)
        if ("K" in flags or "E" in flags) and ("x" in flags or "A" in flags):
            return Check(name, PASS, f"notify-keyspace-events {shown}: expiry events are published")
        return Check(
            name,
            FAIL,
            f"notify-keyspace-events {shown}: keyspace triggers are configured but "
            "expiry events are off; set notify-keyspace-events Ex",
        )

    def topology(self) -> Check:
        name = "topology"
        try:
            info = self.info("server")
            mode = str(info.get("redis_mode") or info.get("server_mode") or "standalone")
        except _Denied:
            try:
                mode = str(self.hello().get("mode", "standalone"))
            except _Denied as exc:
                return _unverified(name, "INFO and HELLO", exc)
        if mode == "sentinel":
            return Check(
                name,
                FAIL,
                "this is a Sentinel, not a data node: point rsched at the master "
                "it monitors (or at the sentinels with a sentinel-aware URL)",
            )
        role, replicas = "master", 0
        try:
            repl = self.info("replication")
            role = str(repl.get("role", "master"))
            replicas = int(repl.get("connected_slaves", 0))
        except _Denied:
            role = "unknown role"
        if role == "slave":
            return Check(
                name, FAIL, f"{mode}, a read-only replica: rsched must write to the master"
            )
        if mode == "cluster":
            try:
                ci = _call(lambda: self.r.execute_command("CLUSTER", "INFO"))
                text = ci if isinstance(ci, str) else str(ci)
                fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
                state = fields.get("cluster_state", "?").strip()
            except (_Denied, redis.RedisError):
                state = "?"
            if state not in ("ok", "?"):
                return Check(
                    name,
                    FAIL,
                    f"cluster, cluster_state {state}: slots unassigned or nodes down; writes fail",
                )
            return Check(name, PASS, f"cluster (state {state}); each queue's keys share a hash tag")
        suffix = f", {replicas} replica(s)" if replicas else ""
        via = self._sentinel_view()
        if via is not None:
            service, answering, total = via
            detail = (
                f"{mode}, {role}{suffix}, via Sentinel service {service} "
                f"({answering} of {total} sentinels answer)"
            )
            if answering < total or not replicas:
                why = "no replica to promote" if not replicas else "sentinels unreachable"
                return Check(name, WARN, f"{detail}: {why}; a failover may not happen")
            return Check(name, PASS, detail)
        return Check(name, PASS, f"{mode}, {role}{suffix}")

    def _sentinel_view(self) -> tuple[str, int, int] | None:
        """(service, sentinels that answer PING, sentinels named) for a client made
        from a ``redis+sentinel://`` URL, else None."""
        pool: Any = getattr(self.r, "connection_pool", None)
        manager = getattr(pool, "sentinel_manager", None)
        if pool is None or manager is None:
            return None
        answering = 0
        for sentinel in manager.sentinels:
            try:
                answering += bool(sentinel.ping())
            except redis.RedisError:
                pass
        return str(pool.service_name), answering, len(manager.sentinels)

    def clock(self) -> Check:
        name = "clock"
        best: tuple[float, float] | None = None  # (rtt, offset) of the fastest sample
        for _ in range(3):
            t0 = time.time()
            try:
                sec, usec = _call(lambda: self.r.time())
            except _Denied as exc:
                return Check(name, FAIL, f"TIME denied ({exc}): rsched decides due times with it")
            t1 = time.time()
            server_s = int(sec) + int(usec) / 1e6
            sample = (t1 - t0, server_s - (t0 + t1) / 2)
            if best is None or sample[0] < best[0]:
                best = sample
        assert best is not None
        rtt, offset = best
        off_ms = offset * 1000
        direction = "behind" if off_ms > 0 else "ahead of"
        amount = f"{abs(off_ms) / 1000:.1f} s" if abs(off_ms) >= 1000 else f"{abs(off_ms):.0f} ms"
        detail = f"this host's clock is {amount} {direction} the server's (+/- {rtt * 500:.0f} ms)"
        if abs(off_ms) > CLOCK_WARN_MS:
            return Check(
                name,
                WARN,
                detail + ": due times still follow the server's clock, but this host's logs and "
                "its notion of 'now' disagree with it; run NTP (chrony, systemd-timesyncd)",
            )
        return Check(name, PASS, detail)

    def _acl_user(self, pool: Any) -> str:
        """The user doctor logged in as: from the URL or ``redis.username`` (what the
        connections authenticate with; ``ACL WHOAMI`` is not in the grant), else the
        ``default`` user."""
        kwargs = getattr(pool, "connection_kwargs", None) or {}
        return str(kwargs.get("username") or self.username or "default")

    def _acl_probes(self, pool: Any, key: str) -> list[tuple[str, list[str]]]:
        probes = [
            (name, [key if a == "K" else a for a in args])
            for name, args in ACL_GRANT
            if args is not None
        ]
        db = int((getattr(pool, "connection_kwargs", None) or {}).get("db") or 0)
        if db:
            probes.insert(2, ("select", ["SELECT", str(db)]))
        if self.wait_replicas:
            probes.append(("wait", ["WAIT", "0", "0"]))
        return probes

    def acl(self) -> Check:
        """Whether the user may run every command rsched needs on its keys, checked
        without running any: the commands are queued in a MULTI that EXEC then aborts
        (the server applies ACLs when it queues), or, when MULTI is refused, asked of
        ``ACL DRYRUN`` (Redis >= 7). The probe connection never goes back to the pool
        still in a transaction."""
        name = "acl"
        key = f"{self.ns}:{{q:__doctor__}}:probe"
        if is_cluster(self.r):  # the probe key's primary
            rc: Any = self.r
            pool = rc.get_redis_connection(rc.get_node_from_key(key)).connection_pool
        else:
            pool = self.r.connection_pool
        user = self._acl_user(pool)
        probes = self._acl_probes(pool, key)
        conn = pool_connection(pool)
        clean = False  # True once the connection is known not to be in a transaction
        try:
            multi_denied, clean, result = self._acl_by_multi(conn, probes)
            if result is None and clean:
                clean = False  # replies may be left unread if this is cut short
                result = self._acl_by_dryrun(conn, user, probes)
                clean = True
        finally:
            if not clean:
                conn.disconnect()  # never hand the pool a connection stuck in MULTI
            pool.release(conn)
        if result is None:  # neither MULTI nor ACL DRYRUN
            if multi_denied is not None and _is_noperm(multi_denied):
                return Check(
                    name,
                    FAIL,
                    f"user {user} may not run MULTI (rsched pause/resume --queue needs it); "
                    f"could not verify the other commands: ACL DRYRUN denied too; grant "
                    f"what the least-privilege user of rsched-operations(7) has: {self._grant(user)}",
                )
            return Check(
                name,
                WARN,
                f"could not verify the permissions of user {user}: MULTI and ACL DRYRUN "
                f"denied by the server ({multi_denied})",
            )
        denied, keys_denied = result
        if denied or keys_denied:
            parts = []
            if denied:
                parts.append(f"may not run {', '.join(denied)}")
            if keys_denied:
                parts.append(f"may not use the keys {self.ns}:* (ACL key patterns)")
            return Check(
                name,
                FAIL,
                f"user {user} {' and '.join(parts)}; grant what rsched-operations(7)'s "
                f"least-privilege user has: {self._grant(user)}",
            )
        return Check(
            name,
            PASS,
            f"user {user} may run the {len(probes) + 2} commands rsched uses on {self.ns}:* keys",
        )

    def _grant(self, user: str) -> str:
        line = acl_setuser(user, self.ns)
        if self.wait_replicas:
            line += " +wait"
        return line + " (with the real password instead of CHANGE-ME)"

    def _acl_by_multi(
        self, conn: Any, probes: list[tuple[str, list[str]]]
    ) -> tuple[Exception | None, bool, tuple[list[str], list[str]] | None]:
        """Queue every probe in a transaction that cannot run. Returns (MULTI's error,
        whether the connection is out of the transaction, (denied, keys denied) or None
        when MULTI was refused)."""
        conn.send_command("MULTI")
        conn.send_command(_ABORT)
        try:
            conn.read_response()
        except redis.ResponseError as exc:
            try:
                conn.read_response()  # the unknown command, refused outside a MULTI too
            except redis.ResponseError:
                return exc, True, None
            raise redis.ResponseError(  # pragma: no cover - a server that ran it
                "the server ran an unknown command"
            ) from None
        try:
            conn.read_response()
        except redis.ResponseError:
            pass  # refused: the transaction is now marked so that EXEC aborts it
        else:  # pragma: no cover - a server that queued an unknown command
            raise redis.ResponseError("the server queued an unknown command in a MULTI")
        denied: list[str] = []
        keys_denied: list[str] = []
        # Only now the probes and EXEC, all sent at once and then read: one round trip.
        for _, args in probes:
            conn.send_command(*args)
        conn.send_command("EXEC")
        for acl_name, _ in probes:
            try:
                conn.read_response()
            except redis.ResponseError as exc:
                msg = str(exc)
                if isinstance(exc, redis.exceptions.NoPermissionError):
                    msg = "NOPERM " + msg  # redis-py strips the error code
                _classify(acl_name, msg, denied, keys_denied)
        try:
            reply = conn.read_response()
        except redis.ResponseError as exc:
            # redis-py strips the EXECABORT code from the message; other clients may not
            if isinstance(exc, redis.exceptions.ExecAbortError) or str(exc).startswith("EXECABORT"):
                return None, True, (denied, keys_denied)
            if _is_noperm(exc):
                denied.append("EXEC")
            return None, False, (denied, keys_denied)
        # pragma: no cover - EXEC ran: impossible after an unknown command was queued
        raise redis.ResponseError(f"doctor's probe transaction was not aborted: {reply!r}")

    def _acl_by_dryrun(
        self, conn: Any, user: str, probes: list[tuple[str, list[str]]]
    ) -> tuple[list[str], list[str]] | None:
        """``ACL DRYRUN user cmd args`` for each probe (Redis >= 7); None when the
        server refuses ACL DRYRUN."""
        denied: list[str] = []
        keys_denied: list[str] = []
        cmds = [("multi", ["MULTI"]), ("exec", ["EXEC"]), *probes]
        for _, args in cmds:
            conn.send_command("ACL", "DRYRUN", user, *args)
        replies: list[Any] = []
        for _ in cmds:
            try:
                replies.append(conn.read_response())
            except redis.ResponseError as exc:
                replies.append(exc)
        for (acl_name, _), reply in zip(cmds, replies, strict=True):
            if isinstance(reply, Exception):
                return None  # ACL DRYRUN denied, unknown (Redis 6.2) or no such user
            text = reply.decode() if isinstance(reply, bytes) else str(reply)
            if text != "OK":
                _classify(acl_name, text, denied, keys_denied)
        return denied, keys_denied

    # --- all ------------------------------------------------------------------
    def is_sentinel(self) -> bool:
        try:
            info = self.info("server")
            return str(info.get("redis_mode") or info.get("server_mode")) == "sentinel"
        except (_Denied, redis.RedisError):
            return False

    def run(self) -> list[Check]:
        out = []
        sentinel = self.is_sentinel()
        for fn in (
            self.reachable,
            self.server,
            self.maxmemory_policy,
            self.persistence,
            self.keyspace_events,
            self.topology,
            self.clock,
            self.acl,
        ):
            if sentinel and fn not in (self.reachable, self.server, self.topology):
                out.append(
                    Check(
                        _NAMES[fn.__name__],
                        WARN,
                        "not checked: this is a Sentinel, which holds no data",
                    )
                )
                continue
            try:
                out.append(fn())
            except _Denied as exc:  # pragma: no cover - each check handles its own denials
                out.append(_unverified(_NAMES[fn.__name__], "a command", exc))
            except redis.ResponseError as exc:
                out.append(Check(_NAMES[fn.__name__], WARN, f"could not verify: {exc}"))
        return out


_NAMES = {
    "reachable": "reachable",
    "server": "server",
    "maxmemory_policy": "maxmemory-policy",
    "persistence": "persistence",
    "keyspace_events": "keyspace-events",
    "topology": "topology",
    "clock": "clock",
    "acl": "acl",
}


def run_checks(rs: Rsched) -> list[Check]:
    """Every check, against the connection and namespace of ``rs``."""
    st = rs.settings
    return Doctor(
        rs.redis,
        rs.namespace,
        st.file if st is not None else {},
        username=st.username if st is not None else None,
        wait_replicas=bool(st is not None and st.wait_replicas),
    ).run()


def startup_warnings(client: redis.Redis) -> list[str]:
    """The few checks a run loop logs at start (eviction, persistence, clock): WARN/FAIL lines.

    Never raises on a denied command; cheap (a handful of round trips).
    """
    d = Doctor(client)
    out = []
    for fn in (d.maxmemory_policy, d.persistence, d.clock):
        try:
            c = fn()
        except redis.RedisError:
            continue
        if c.status != PASS and "could not verify" not in c.detail:
            out.append(f"{c.status} {c.check}: {c.detail}")
    return out
