"""Settings: command-line flag, then environment, then config file, then default.

Config file (TOML), found at ``--config`` / ``$RSCHED_CONFIG`` / ``./rsched.toml``
/ ``$XDG_CONFIG_HOME/rsched/config.toml``::

    [redis]
    url = "redis://redis.internal:6379/0"   # no password here: use password_file
    password_file = "/etc/rsched/redis.pass"
    namespace = "rsched"
    connect_timeout = "3s"
    tls_ca = "/etc/ssl/redis-ca.pem"        # for rediss://
    tls_cert = "..."; tls_key = "..."
    # Redis Sentinel instead of url (or url = "redis+sentinel://h1:26379,h2:26379/mymaster/0"):
    sentinels = ["10.0.0.1:26379", "10.0.0.2:26379", "10.0.0.3:26379"]
    sentinel_service = "mymaster"
    sentinel_password_file = "/etc/rsched/sentinel.pass"   # if the sentinels want one
    wait_replicas = 1                       # WAIT for 1 replica after adds and lock acquisition
    wait_replicas_timeout = "1s"

    [queues.default]                        # consumer defaults per queue
    lease = "60s"; max_attempts = 5; timeout = "5m"; backoff = "1s"; backoff_max = "10m"

    [handlers]                              # task type -> command (never a shell)
    "order.close" = "./close-order"
    "report.*" = "python:reports:run"       # a Python callable
    "mail.send" = {command = "./send", id_arg = "none"}   # no ID argument: RSCHED_TASK_ID

    [cron.report-daily]                     # for `rsched run cron --all`
    schedule = "0 0 2 * * ?"
    tz = "Asia/Shanghai"
    command = ["./job", "--daily"]
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from rsched.core.errors import ConfigError

DEFAULT_URL = "redis://localhost:6379/0"
DEFAULT_NAMESPACE = "rsched"

REDIS_KEYS = {
    "url",
    "namespace",
    "password_file",
    "username",
    "connect_timeout",
    "socket_timeout",
    "tls_ca",
    "tls_cert",
    "tls_key",
    "tls_insecure",
    "cluster",
    "sentinels",
    "sentinel_service",
    "sentinel_password_file",
    "sentinel_username",
    "wait_replicas",
    "wait_replicas_timeout",
}
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
DEFAULT_SENTINEL_PORT = 26379
QUEUE_KEYS = {
    "lease",
    "max_attempts",
    "timeout",
    "backoff",
    "backoff_max",
    "concurrency",
    "grace",
    "partitions",
    "rate_limit",
    "type_rate_limits",
}
TOP_KEYS = {"redis", "queues", "handlers", "cron", "logs", "alerts"}


def _replace_password(url: str, mask: str | None) -> str | None:
    """``url`` with its password (``user:PASSWORD@`` or redis-py's ``?password=``)
    replaced by ``mask``, or removed when ``mask`` is None; None if unparseable."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    changed = False
    if "password=" in parts.query:  # unix:///run/redis.sock?password=... (redis-py's form)
        from urllib.parse import parse_qsl, urlencode

        q = [
            (k, mask if k == "password" else v)
            for k, v in parse_qsl(parts.query, keep_blank_values=True)
            if k != "password" or mask is not None
        ]
        parts, changed = parts._replace(query=urlencode(q, safe="*")), True
    if parts.password is not None:
        host = parts.netloc.rsplit("@", 1)[-1]
        user = parts.username or ""
        userinfo = user if mask is None else f"{user}:{mask}"
        parts, changed = parts._replace(netloc=f"{userinfo}@{host}" if userinfo else host), True
    if not changed:
        return url
    out = urlunsplit(parts)
    if not parts.netloc and url.startswith(f"{parts.scheme}://"):  # keep unix:///path
        out = f"{parts.scheme}://" + out[len(parts.scheme) + 1 :]
    return out


URL_FORM = (
    "redis://[[USER]:PASSWORD@]HOST[:PORT][/DB], rediss://… (TLS), unix:///PATH[?db=DB], "
    "redis+sentinel://HOST:PORT[,HOST:PORT…]/SERVICE[/DB] or redis+cluster://HOST:PORT"
)


def _check_userinfo(rest: str, where: str) -> tuple[str, str, str]:
    """The URL after ``SCHEME://`` -> (authority, path, query), refusing a user or
    password whose unencoded ``/ ? #`` would move the URL's boundaries (the parts
    after it would then hold the rest of the secret, so nothing is echoed)."""
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    tail = rest[len(authority) :]
    path, _, query = tail.partition("?")
    path, _, fragment = path.partition("#")
    query, _, qfrag = query.partition("#")
    if "@" not in authority and (
        "@" in path or "@" in fragment or "@" in qfrag or "@" in query.split("=", 1)[0]
    ):
        raise ConfigError(
            f"{where}: the user or password holds an unencoded '/', '?' or '#'; "
            "percent-encode them (%2F, %3F, %23), or give the password in "
            "RSCHED_REDIS_PASSWORD or [redis] password_file instead"
        )
    return authority, path, query


def check_url(url: str, where: str = "--redis-url") -> None:
    """Refuse a malformed plain, TLS, unix or cluster URL before anything connects
    (:class:`ConfigError`, exit 78), naming the part that is wrong and never echoing
    the user or password: an unencoded ``/ ? #`` in a password moves the URL's
    boundaries, so the parts after it may hold the rest of the secret."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return  # the scheme check that follows names it
    authority, path, query = _check_userinfo(rest, where)
    hostport = authority.rsplit("@", 1)[-1]
    if scheme == "unix":
        if hostport or not path.strip("/"):
            raise ConfigError(
                f"{where}: a unix URL names the socket's path: unix:///run/redis.sock"
            )
    else:
        if hostport.startswith("["):
            host, close, after = hostport[1:].partition("]")
            if not close or (after and not after.startswith(":")):
                raise ConfigError(
                    f"{where}: the host is not a bracketed IPv6 address; write it as "
                    "[::1] (redis://[::1]:6379/0)"
                )
            port = after[1:] if after else None
            try:
                import ipaddress

                ipaddress.IPv6Address(host.split("%", 1)[0])
            except ValueError:
                raise ConfigError(
                    f"{where}: [{host}] is not an IPv6 address (redis://[::1]:6379/0)"
                ) from None
        else:
            host, colon, port_text = hostport.rpartition(":")
            if not colon:
                host, port_text = hostport, ""
            port = port_text if colon else None
            if "[" in hostport or "]" in hostport:
                raise ConfigError(
                    f"{where}: the host is not a bracketed IPv6 address; write it as "
                    "[::1] (redis://[::1]:6379/0)"
                )
        if port is not None and not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
            shown = port if len(port) <= 12 else port[:12] + "…"
            raise ConfigError(
                f"{where}: the port {shown!r} is not a whole number from 1 to 65535 "
                "(redis://HOST:PORT/DB)"
            )
        if "," in hostport and not scheme.endswith("+cluster"):
            raise ConfigError(
                f"{where}: more than one host needs redis+sentinel:// or redis+cluster://"
            )
        db = path.strip("/")
        if scheme.endswith("+cluster") and db not in ("", "0"):
            raise ConfigError(f"{where}: Redis Cluster has database 0 only, not {db!r}")
        if db and not (db.isascii() and db.isdigit()):
            shown = db if len(db) <= 12 else db[:12] + "…"
            raise ConfigError(
                f"{where}: the database {shown!r} is not a whole number (redis://HOST:PORT/DB)"
            )
    from urllib.parse import parse_qsl

    for k, v in parse_qsl(query, keep_blank_values=True):
        if k == "db" and not (v.isascii() and v.isdigit()):
            raise ConfigError(
                f"{where}: the database (db={v[:12]!r}) is not a whole number (unix:///PATH?db=DB)"
            )


def redact_url(url: str) -> str:
    """``redis://user:secret@host`` -> ``redis://user:***@host`` (for output and logs)."""
    out = _replace_password(url, "***")
    return "<unparseable url>" if out is None else out


def strip_password(url: str) -> str:
    """``redis://user:secret@host`` -> ``redis://user@host`` (for an environment
    handed on to children: they get the address, not the secret)."""
    return _replace_password(url, None) or ""


@dataclass(frozen=True)
class SentinelTarget:
    """Where a ``redis+sentinel://`` URL points: sentinels, service and database."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int
    tls: bool
    username: str | None
    password: str | None = field(default=None, repr=False)


def parse_sentinel_url(url: str) -> SentinelTarget:
    """``redis+sentinel://[user[:password]@]host1[:port],host2[:port]/SERVICE[/DB]``
    (``rediss+sentinel://`` for TLS). The user and password are the data nodes'."""
    from urllib.parse import unquote

    _check_userinfo(url.partition("://")[2], "--redis-url")
    where = redact_url(url)
    try:
        parts = urlsplit(url)
    except ValueError:
        raise ConfigError(
            "--redis-url: a sentinel's IPv6 address goes in brackets: "
            "redis+sentinel://[::1]:26379/SERVICE"
        ) from None
    if parts.scheme not in SENTINEL_SCHEMES:
        raise ConfigError(f"--redis-url: {where!r} is not a redis+sentinel:// URL")
    userinfo, _, hostlist = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":") if userinfo else ("", "", "")
    hosts: list[tuple[str, int]] = []
    for item in hostlist.split(","):
        host, port = _host_port(item.strip(), f"--redis-url {where!r}")
        hosts.append((host, port))
    segs = [seg for seg in parts.path.split("/") if seg]
    if not segs or len(segs) > 2:
        raise ConfigError(
            f"--redis-url: {where!r} must name the service after the sentinels: "
            "redis+sentinel://host1:26379,host2:26379/SERVICE[/DB]"
        )
    db = 0
    if len(segs) == 2:
        if not (segs[1].isascii() and segs[1].isdigit()):
            raise ConfigError(
                f"--redis-url: {where!r}: the database {segs[1]!r} is not a whole number"
            )
        db = int(segs[1])
    return SentinelTarget(
        tuple(hosts),
        unquote(segs[0]),
        db,
        parts.scheme.startswith("rediss"),
        unquote(user) or None,
        unquote(password) or None,
    )


def _host_port(item: str, field_name: str) -> tuple[str, int]:
    """``host``, ``host:port`` or ``[v6]:port`` -> (host, port); port defaults to 26379."""
    host, port = item, DEFAULT_SENTINEL_PORT
    if item.startswith("["):
        end = item.find("]")
        host, rest = item[1:end], item[end + 1 :]
        if rest.startswith(":"):
            port = _port(rest[1:], item, field_name)
    elif item.count(":") == 1:
        host, p = item.split(":")
        port = _port(p, item, field_name)
    if not host:
        raise ConfigError(f"{field_name}: sentinel {item!r} has no host (host:port)")
    return host, port


def _port(text: str, item: str, field_name: str) -> int:
    if not (text.isascii() and text.isdigit()) or not 0 < int(text) < 65536:
        raise ConfigError(f"{field_name}: sentinel {item!r} has no valid port (host:port)")
    return int(text)


def sentinel_url(sentinels: Any, service: Any, path: Path | None) -> str:
    """The URL form of ``[redis] sentinels`` / ``sentinel_service``."""
    from urllib.parse import quote

    if (
        not isinstance(sentinels, list)
        or not sentinels
        or not all(isinstance(x, str) for x in sentinels)
    ):
        raise ConfigError(f'config {path}: redis.sentinels must be a list of "host:port" strings')
    if not isinstance(service, str) or not service:
        raise ConfigError(
            f"config {path}: redis.sentinels needs redis.sentinel_service (the monitored "
            'master\'s name, e.g. "mymaster")'
        )
    for x in sentinels:
        _host_port(x, f"config {path}: redis.sentinels")
    return f"redis+sentinel://{','.join(sentinels)}/{quote(service, safe='')}/0"


def find_config(explicit: str | None) -> Path | None:
    if explicit:
        p = Path(explicit)
        if not p.is_file():
            raise ConfigError(f"--config: {explicit} does not exist or is not a file")
        return p
    env = os.environ.get("RSCHED_CONFIG")
    if env:
        p = Path(env)
        if not p.is_file():
            raise ConfigError(f"RSCHED_CONFIG: {env} does not exist or is not a file")
        return p
    local = Path("rsched.toml")
    if local.is_file():
        return local
    xdg = (
        Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
        / "rsched"
        / "config.toml"
    )
    return xdg if xdg.is_file() else None


def load_file(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config {path}: cannot read it ({exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config {path}: not valid TOML ({exc})") from None
    _check(data, path)
    return data


def _check(data: dict[str, Any], path: Path) -> None:
    for k in data:
        if k not in TOP_KEYS:
            raise ConfigError(
                f"config {path}: unknown section [{k}] (known: {', '.join(sorted(TOP_KEYS))})"
            )
    for k in data.get("redis", {}):
        if k not in REDIS_KEYS:
            raise ConfigError(
                f"config {path}: unknown key redis.{k} (known: {', '.join(sorted(REDIS_KEYS))})"
            )
    if "url" in data.get("redis", {}) and urlsplit(str(data["redis"]["url"])).password:
        raise ConfigError(
            f"config {path}: redis.url carries a password; put it in redis.password_file "
            "or $RSCHED_REDIS_PASSWORD instead"
        )
    for q, opts in data.get("queues", {}).items():
        if not isinstance(opts, dict):
            raise ConfigError(f"config {path}: [queues.{q}] must be a table")
        for k in opts:
            if k not in QUEUE_KEYS:
                raise ConfigError(
                    f"config {path}: unknown queue option queues.{q}.{k} (known: {', '.join(sorted(QUEUE_KEYS))})"
                )
    for t, cmd in data.get("handlers", {}).items():
        if not isinstance(cmd, str | list | dict):
            raise ConfigError(
                f"config {path}: handlers.{t} must be a command string, a list of arguments "
                'or a table {command = ..., id_arg = "auto" | "plain" | "none"}'
            )


@dataclass
class Settings:
    redis_url: str = DEFAULT_URL
    namespace: str = DEFAULT_NAMESPACE
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    connect_timeout_s: float = 3.0
    socket_timeout_s: float = 10.0
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_insecure: bool = False
    #: Redis Cluster: True, False, or None to ask the server when connecting.
    cluster: bool | None = None
    sentinel_username: str | None = None
    sentinel_password: str | None = field(default=None, repr=False)
    #: After adds and lock acquisitions, WAIT for this many replicas (0: don't).
    wait_replicas: int = 0
    wait_replicas_timeout_ms: int = 1000
    #: ``[logs] max_bytes``: bytes of each stream (stdout, stderr) a run log keeps.
    log_max_bytes: int = 64 * 1024
    config_path: Path | None = None
    file: dict[str, Any] = field(default_factory=dict, repr=False)

    def __repr__(self) -> str:  # never the password
        return f"Settings(redis_url={redact_url(self.redis_url)!r}, namespace={self.namespace!r})"

    @property
    def safe_url(self) -> str:
        return redact_url(self.redis_url)

    def queue_options(self, queue: str) -> dict[str, Any]:
        return dict(self.file.get("queues", {}).get(queue, {}))

    @property
    def handlers(self) -> dict[str, Any]:
        return dict(self.file.get("handlers", {}))

    @property
    def crons(self) -> dict[str, dict[str, Any]]:
        return dict(self.file.get("cron", {}))


def _secret(env: str, table: dict[str, Any], file_key: str, path: Path | None) -> str | None:
    """A password: from ``$env``, else read from the file ``[redis] file_key`` names."""
    value = os.environ.get(env)
    if value:
        return value
    if not table.get(file_key):
        return None
    try:
        return Path(table[file_key]).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(
            f"config {path}: redis.{file_key} cannot be read ({exc.strerror})"
        ) from None


def _cluster_setting(env: str | None, value: Any, path: Path | None) -> bool | None:
    """``RSCHED_REDIS_CLUSTER`` / ``[redis] cluster``: true, false or "auto" (None)."""
    if env:
        value = env
    if value is None:
        return None
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("auto", ""):
        return None
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    where = "RSCHED_REDIS_CLUSTER" if env else f"config {path}: redis.cluster"
    raise ConfigError(f'{where}: {value!r} must be true, false or "auto"')


#: ``[logs] max_bytes`` bounds, and the units a size takes (binary and decimal).
LOG_MAX_BYTES_LIMIT = 16 * 1024 * 1024
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kib": 1024,
    "kb": 1000,
    "m": 1 << 20,
    "mib": 1 << 20,
    "mb": 10**6,
}


def parse_size(value: Any, where: str) -> int:
    """A byte count: an integer or a size (``64KiB``, ``1MiB``, ``4000B``, ``64kB``),
    from 1 byte to 16 MiB; anything else is a :class:`ConfigError` naming ``where``."""
    import re

    rule = (
        f"{where}: {value!r} is not a size; give bytes as an integer or a size like "
        "64KiB, 1MiB or 4000B (1 byte to 16MiB)"
    )
    if isinstance(value, bool):
        raise ConfigError(rule)
    if isinstance(value, int):
        n = value
    elif isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", value)
        unit = m.group(2).lower() if m else ""
        if not m or unit not in _SIZE_UNITS:
            raise ConfigError(rule)
        n = int(m.group(1)) * _SIZE_UNITS[unit]
    else:
        raise ConfigError(rule)
    if not 1 <= n <= LOG_MAX_BYTES_LIMIT:
        raise ConfigError(rule)
    return n


def _logs_table(data: dict[str, Any], path: Path | None) -> int:
    """``[logs]``: ``max_bytes`` (the only key)."""
    t = data.get("logs", {})
    if not isinstance(t, dict):
        raise ConfigError(f'config {path}: [logs] must be a table (max_bytes = "64KiB")')
    unknown = sorted(set(t) - {"max_bytes"})
    if unknown:
        raise ConfigError(f"config {path}: logs.{unknown[0]} is not a setting (logs.max_bytes is)")
    if "max_bytes" not in t:
        return 64 * 1024
    return parse_size(t["max_bytes"], f"config {path}: logs.max_bytes")


def resolve(
    redis_url: str | None = None,
    namespace: str | None = None,
    config: str | None = None,
) -> Settings:
    """Build :class:`Settings` from flags, environment, config file and defaults."""
    from rsched.core import validate
    from rsched.core.timeutil import parse_duration

    path = find_config(config)
    data = load_file(path)
    r = data.get("redis", {})
    s = Settings(config_path=path, file=data)
    s.log_max_bytes = _logs_table(data, path)
    if "sentinels" in r and "url" in r:
        raise ConfigError(
            f"config {path}: give redis.url or redis.sentinels, not both "
            "(a Sentinel URL is redis+sentinel://host1:26379,host2:26379/SERVICE/DB)"
        )
    if "sentinel_service" in r and "sentinels" not in r:
        raise ConfigError(f"config {path}: redis.sentinel_service needs redis.sentinels")
    url_from = (
        "--redis-url"
        if redis_url
        else "RSCHED_REDIS_URL"
        if os.environ.get("RSCHED_REDIS_URL")
        else "REDIS_URL"
        if os.environ.get("REDIS_URL")
        else f"config {path}: redis.url"
        if r.get("url")
        else "--redis-url"
    )
    s.redis_url = (
        redis_url
        or os.environ.get("RSCHED_REDIS_URL")
        or os.environ.get("REDIS_URL")
        or r.get("url")
        or (
            sentinel_url(r["sentinels"], r.get("sentinel_service"), path)
            if "sentinels" in r
            else None
        )
        or DEFAULT_URL
    )
    s.namespace = (
        namespace or os.environ.get("RSCHED_NAMESPACE") or r.get("namespace") or DEFAULT_NAMESPACE
    )
    validate.name(s.namespace, "--namespace")
    s.username = r.get("username")
    s.password = _secret("RSCHED_REDIS_PASSWORD", r, "password_file", path)
    s.sentinel_username = r.get("sentinel_username")
    s.sentinel_password = _secret("RSCHED_SENTINEL_PASSWORD", r, "sentinel_password_file", path)
    if "wait_replicas" in r:
        n = r["wait_replicas"]
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ConfigError(f"config {path}: redis.wait_replicas must be a whole number >= 0")
        s.wait_replicas = n
    try:
        if "wait_replicas_timeout" in r:
            s.wait_replicas_timeout_ms = parse_duration(
                r["wait_replicas_timeout"], "redis.wait_replicas_timeout"
            )
        if "connect_timeout" in r:
            s.connect_timeout_s = (
                parse_duration(r["connect_timeout"], "redis.connect_timeout") / 1000
            )
        if "socket_timeout" in r:
            s.socket_timeout_s = parse_duration(r["socket_timeout"], "redis.socket_timeout") / 1000
    except Exception as exc:
        raise ConfigError(f"config {path}: {exc}") from None
    s.tls_ca = os.environ.get("RSCHED_TLS_CA") or r.get("tls_ca")
    s.tls_cert = os.environ.get("RSCHED_TLS_CERT") or r.get("tls_cert")
    s.tls_key = os.environ.get("RSCHED_TLS_KEY") or r.get("tls_key")
    s.tls_insecure = bool(r.get("tls_insecure", False))
    s.cluster = _cluster_setting(os.environ.get("RSCHED_REDIS_CLUSTER"), r.get("cluster"), path)
    try:
        scheme = urlsplit(s.redis_url).scheme
    except ValueError:
        scheme = s.redis_url.partition("://")[0]
    if scheme in ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster"):
        check_url(s.redis_url, url_from)
    if scheme in SENTINEL_SCHEMES:
        parse_sentinel_url(s.redis_url)  # refuse a malformed one before connecting
    elif scheme not in ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster"):
        raise ConfigError(
            f"{url_from}: the scheme {scheme[:20]!r} is not one rsched knows; the URL must start "
            "with redis://, rediss://, unix://, redis+sentinel:// or (Redis Cluster) "
            "redis+cluster://"
        )
    return s
