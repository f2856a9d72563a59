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

    [queues.default]                        # consumer defaults per queue
    lease = "60s"; max_attempts = 5; timeout = "5m"; backoff = "1s"; backoff_max = "10m"

    [handlers]                              # task type -> command (never a shell)
    "order.close" = "./close-order"
    "report.*" = "python:reports:run"       # a Python callable

    [cron.report-daily]                     # for `rsched run cron --all`
    schedule = "0 0 2 * * ?"
    tz = "Asia/Shanghai"
    command = ["./job", "--daily"]
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from rsched.errors import ConfigError

DEFAULT_URL = "redis://localhost:6379/0"
DEFAULT_NAMESPACE = "rsched"

_REDIS_KEYS = {
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
}
_QUEUE_KEYS = {"lease", "max_attempts", "timeout", "backoff", "backoff_max", "concurrency", "grace"}
_TOP_KEYS = {"redis", "queues", "handlers", "cron", "exec"}


def redact_url(url: str) -> str:
    """``redis://user:secret@host`` -> ``redis://user:***@host``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[-1]}"))


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
        if k not in _TOP_KEYS:
            raise ConfigError(
                f"config {path}: unknown section [{k}] (known: {', '.join(sorted(_TOP_KEYS))})"
            )
    for k in data.get("redis", {}):
        if k not in _REDIS_KEYS:
            raise ConfigError(
                f"config {path}: unknown key redis.{k} (known: {', '.join(sorted(_REDIS_KEYS))})"
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
            if k not in _QUEUE_KEYS:
                raise ConfigError(
                    f"config {path}: unknown queue option queues.{q}.{k} (known: {', '.join(sorted(_QUEUE_KEYS))})"
                )
    for t, cmd in data.get("handlers", {}).items():
        if not isinstance(cmd, str | list):
            raise ConfigError(
                f"config {path}: handlers.{t} must be a command string or a list of arguments"
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


def resolve(
    redis_url: str | None = None,
    namespace: str | None = None,
    config: str | None = None,
) -> Settings:
    """Build :class:`Settings` from flags, environment, config file and defaults."""
    from rsched import validate
    from rsched.timeutil import parse_duration

    path = find_config(config)
    data = load_file(path)
    r = data.get("redis", {})
    s = Settings(config_path=path, file=data)
    s.redis_url = (
        redis_url
        or os.environ.get("RSCHED_REDIS_URL")
        or os.environ.get("REDIS_URL")
        or r.get("url")
        or DEFAULT_URL
    )
    s.namespace = (
        namespace or os.environ.get("RSCHED_NAMESPACE") or r.get("namespace") or DEFAULT_NAMESPACE
    )
    validate.name(s.namespace, "--namespace")
    s.username = r.get("username")
    pw_env = os.environ.get("RSCHED_REDIS_PASSWORD")
    if pw_env:
        s.password = pw_env
    elif r.get("password_file"):
        try:
            s.password = Path(r["password_file"]).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(
                f"config {path}: redis.password_file cannot be read ({exc.strerror})"
            ) from None
    try:
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
    scheme = urlsplit(s.redis_url).scheme
    if scheme not in ("redis", "rediss", "unix"):
        raise ConfigError(
            f"--redis-url: {redact_url(s.redis_url)!r} must start with redis://, rediss:// or unix://"
        )
    return s
