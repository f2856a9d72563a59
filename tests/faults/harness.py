"""Fault injection: every guarantee of SPEC.md section 1 under the fault it is about,
one file per guarantee (this module is their shared harness; fixtures: conftest.py).

Real servers, real ``python -m rsched`` processes, real signals: consumers
``kill -9``'d at random, a consumer frozen past its lease, Redis ``kill -9``'d
and restarted from its AOF, Redis frozen, a cron holder frozen past its lock
TTL, ``SCRIPT FLUSH`` in a loop, clocks 30 s off (libfaketime), and a
least-privilege ACL user.

Executions are recorded by the handlers themselves (task id, claim token,
attempt, which consumer) in an ``O_APPEND`` file, independently of what rsched
says about itself, and compared with Redis's own records afterwards.

Each scenario prints its figures (``FIGURE name {...}``, visible with ``-s``)
for rsched-operations(7)'s guarantees. The short versions run in CI; the
``slow`` ones are soaks for a developer machine (``pytest -m slow``).
Single Redis only: Sentinel failover is in ``test_sentinel.py`` (and ``--wait-replicas``
in ``test_replicas.py``), Cluster in ``test_cluster.py``.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from rsched.api import Rsched

# ----------------------------------------------------------------------------- constants
#: Every Redis command rsched issues (directly or from its Lua scripts) for add, cancel,
#: list, show, queues, requeue-stale, dead/retry/purge, run consumer, run cron, exec,
#: locks, crons, history and metrics. Found by running those against a server under
#: MONITOR, and from the Lua sources; ``doctor`` additionally reads ``INFO``/``CONFIG
#: GET`` and says "could not verify" when they are refused. No pub/sub, no KEYS, no
#: FLUSH*, no CONFIG, nothing outside the namespace (a script's keys are checked too).
# The list lives in rsched.tools.doctor (doctor checks a user against it and prints this line).
from rsched.tools.doctor import acl_setuser  # noqa: E402
from tests.support import Cli, RedisServer

#: The least-privilege user for the default namespace ``rsched`` (rsched-operations(7), reliability
#: section). Put the real password instead of CHANGE-ME and give it to rsched through
#: ``RSCHED_REDIS_PASSWORD`` or ``redis.password_file``, with the user in the URL
#: (``redis://rsched@host:6379/0``) or ``redis.username``.
ACL_SETUSER = acl_setuser()

FAKETIME_LIB = next(
    iter(
        sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
        + sorted(glob.glob("/usr/lib/faketime/libfaketime.so.1"))
    ),
    None,
)

SEED = os.environ.get("RSCHED_FAULTS_SEED")  # reproduce a chaos run: RSCHED_FAULTS_SEED=1234

# ----------------------------------------------------------------------------- helpers


def figure(name: str, **values: Any) -> None:
    """One measured figure for rsched-operations(7)'s guarantees (``pytest -s`` shows it)."""
    print(f"\nFIGURE {name} {json.dumps(values, sort_keys=True)}")


def script(tmp_path: Path, name: str, body: str, shell: str = "/bin/sh") -> Path:
    p = tmp_path / name
    p.write_text(f"#!{shell}\n" + textwrap.dedent(body).lstrip())
    p.chmod(0o755)
    return p


#: A command handler: one O_APPEND line per run (a single short write(2), so lines
#: from concurrent handlers never interleave), then an optional sleep. $CONSUMER_TAG
#: names the consumer (not $PPID: a handler whose consumer was just killed sees 1).
EXEC_HANDLER = """
    echo "$1 $RSCHED_CLAIM_TOKEN $RSCHED_ATTEMPT $CONSUMER_TAG" >> "$EXEC_LOG"
    if [ -n "$HANDLER_SLEEP" ]; then sleep "$HANDLER_SLEEP"; fi
"""

#: The same as a Python callable (``--call TYPE=frec:run``), for high-rate load.
EXEC_MODULE = """
import os

_fd = os.open(os.environ["EXEC_LOG"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
_tag = os.environ.get("CONSUMER_TAG", "0")


def run(task):
    os.write(_fd, f"{task.id} {task.token} {task.attempt} {_tag}\\n".encode())
"""


SLOW_CALL = """

def slow(task):
    run(task)
    import time

    time.sleep(0.003)
"""


@dataclass
class Run:
    id: str
    token: str
    attempt: int
    pid: int


def runs(log: Path) -> list[Run]:
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        parts = line.split()
        if len(parts) == 4:  # a line being written has no newline yet: skipped above
            out.append(Run(parts[0], parts[1], int(parts[2]), int(parts[3])))
    return out


def count_lines(log: Path) -> int:
    try:
        with open(log, "rb") as fh:
            return fh.read().count(b"\n")
    except FileNotFoundError:
        return 0


def history(r: redis.Redis, rs: Rsched, queue: str = "default") -> list[dict[str, Any]]:
    return [json.loads(f["j"]) for _, f in r.xrange(rs.keys.queue(queue).history)]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] not in "ZX"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


class Procs:
    """Long-running rsched processes of one test, each logging stderr to its own file."""

    def __init__(self, cli: Cli, tmp_path: Path):
        self.cli = cli
        self.tmp = tmp_path
        self.n = 0
        self.tags: dict[int, int] = {}

    def spawn(
        self, *args: str, env: dict[str, str] | None = None, name: str = "p"
    ) -> tuple[subprocess.Popen[str], Path]:
        self.n += 1
        err_path = self.tmp / f"{name}-{self.n}.err"
        fd = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            p = self.cli.spawn(*args, env=env, stdout=subprocess.DEVNULL, stderr=fd)
        finally:
            os.close(fd)
        return p, err_path

    def errors(self) -> list[str]:
        """Error lines of every process (consumers say "error:", cron runners "unavailable")."""
        out = []
        for p in sorted(self.tmp.glob("*.err")):
            out += [
                f"{p.name}: {x}"
                for x in p.read_text().splitlines()
                if "error" in x or "unavailable" in x
            ]
        return out

    def consumer(
        self, *args: str, env: dict[str, str] | None = None, name: str = "c"
    ) -> tuple[subprocess.Popen[str], Path]:
        """A consumer; its handlers see CONSUMER_TAG, which ``self.tags`` maps to its pid."""
        tag = str(self.n + 1)
        p, err = self.spawn("run", "consumer", *args, env={**(env or {}), "CONSUMER_TAG": tag},
                            name=name)  # fmt: skip
        self.tags[int(tag)] = p.pid
        return p, err


def stop(p: subprocess.Popen[str], timeout: float = 30) -> int:
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGCONT)
        p.send_signal(signal.SIGTERM)
    return p.wait(timeout=timeout)


def errors_in(path: Path) -> list[str]:
    return [x for x in path.read_text().splitlines() if "error" in x.lower()]


def settled(r: redis.Redis, rs: Rsched, queue: str = "default") -> bool:
    """Nothing left: no task record, nothing scheduled, processing or dead."""
    q = rs.keys.queue(queue)
    pipe = r.pipeline(transaction=False)
    pipe.hlen(q.tasks).zcard(q.sched).zcard(q.proc).zcard(q.dead)
    return not any(pipe.execute())


def jsonl(task_type: str, ids: list[str], **extra: Any) -> str:
    return "".join(json.dumps({"type": task_type, "id": i, **extra}) + "\n" for i in ids)


def pace(seconds: float, until: Callable[[], bool]) -> None:
    """The chaos schedule: wait ``seconds`` before the next fault, or less when ``until``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not until():
        time.sleep(0.02)


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def fresh(server: RedisServer, namespace: str) -> Rsched:
    """A library handle with a new connection (after the server was restarted)."""
    return Rsched(server.client(socket_timeout=10), namespace)


def cron_fires(log: Path) -> list[list[str]]:
    return [x.split() for x in log.read_text().splitlines()] if log.exists() else []
