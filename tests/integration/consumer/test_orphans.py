"""A child must not outlive a runner that is ``kill -9``'d (Linux).

Real ``rsched run consumer``, ``rsched run cron`` and ``rsched exec`` processes
run a shell script that starts two long-running grandchildren: one in its own
process group (``sleep &``) and one that left it (``setsid sleep &``). The
runner is SIGKILLed mid-run; the script and both grandchildren must be gone
within a deadline (rsched's guardian, see ``rsched/runtime/proc.py``). Without it they
ran on for minutes, alongside the retry on another consumer or the next run on
another host.

Normal exits, timeouts and lost locks still kill the group as before: covered
by test_exec.py (timeout, lock lost), test_consumer.py (timeout, lost lease)
and test_cron.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rsched.api import Rsched
from tests.support import Cli, wait_for

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="children are guarded on Linux only"
)

#: Starts a grandchild in its process group and one in a session of its own, writes
#: "SCRIPT_PID GROUP_GRANDCHILD SETSID_GRANDCHILD" to $PIDS_DIR/<name> (renamed into
#: place, so a reader never sees half a line), then waits for them (300 s).
HOLDER = """
    name="${1:-$RSCHED_NAME}"
    sleep 300 &
    g1=$!
    setsid sleep 300 </dev/null >/dev/null 2>&1 &
    g2=$!
    echo "$$ $g1 $g2" > "$PIDS_DIR/$name.tmp"
    mv "$PIDS_DIR/$name.tmp" "$PIDS_DIR/$name"
    wait
"""

#: A task that finishes at once but leaves a daemon behind (setsid, output closed).
LEAVER = """
    setsid sleep 300 </dev/null >/dev/null 2>&1 &
    echo "$!" > "$PIDS_DIR/$1.tmp"
    mv "$PIDS_DIR/$1.tmp" "$PIDS_DIR/$1"
"""

GONE_WITHIN_S = 10.0  # the guardian acts in milliseconds; this is a loaded CI machine's slack


def script(tmp_path: Path, name: str, body: str) -> Path:
    p = tmp_path / name
    p.write_text("#!/bin/sh\n" + textwrap.dedent(body).lstrip())
    p.chmod(0o755)
    return p


def alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] not in "ZX"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def guardians(runner_pid: int) -> list[int]:
    """Live guardian processes of ``runner_pid`` (argv: ... rsched-guardian PID NONCE)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\0")
        except OSError:
            continue
        if b"rsched-guardian" in argv:
            i = argv.index(b"rsched-guardian")
            if argv[i + 1 : i + 2] == [str(runner_pid).encode()] and alive(int(d)):
                out.append(int(d))
    return out


def pids_in(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


class Run:
    """Processes and pid files of one test; whatever is left is killed at the end."""

    def __init__(self, cli: Cli, tmp_path: Path):
        self.cli = cli
        self.dir = tmp_path / "pids"
        self.dir.mkdir()
        self.err = tmp_path / "runner.err"
        self.env = {"PIDS_DIR": str(self.dir)}

    def spawn(self, *args: str) -> subprocess.Popen[str]:
        fd = os.open(self.err, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            return self.cli.spawn(*args, env=self.env, stdout=subprocess.DEVNULL, stderr=fd)
        finally:
            os.close(fd)

    def pids(self, name: str, timeout: float = 20) -> list[int]:
        path = self.dir / name
        return list(wait_for(lambda: pids_in(path), timeout=timeout, what=f"{name} running"))

    def kill9(self, p: subprocess.Popen[str]) -> None:
        os.kill(p.pid, signal.SIGKILL)  # the runner only, not its process group
        p.wait(timeout=10)

    def assert_gone(self, pids: list[int], runner: subprocess.Popen[str]) -> None:
        wait_for(
            lambda: not [p for p in pids if alive(p)],
            timeout=GONE_WITHIN_S,
            what=f"{[p for p in pids if alive(p)]} (of {pids}) to be killed with their runner",
        )
        wait_for(
            lambda: f"runner pid {runner.pid} is gone" in self.err.read_text(),
            timeout=GONE_WITHIN_S,
            what="the guardian's note on stderr",
        )
        wait_for(lambda: not guardians(runner.pid), timeout=GONE_WITHIN_S, what="guardian exit")

    def cleanup(self) -> None:
        for f in self.dir.iterdir():
            for pid in pids_in(f) if f.suffix != ".tmp" else []:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


@pytest.fixture
def run(cli: Cli, tmp_path: Path) -> Iterator[Run]:
    r = Run(cli, tmp_path)
    yield r
    r.cleanup()


def test_consumer_kill9_kills_running_handlers_and_their_children(
    run: Run, rs: Rsched, tmp_path: Path
) -> None:
    holder = script(tmp_path, "holder.sh", HOLDER)
    leaver = script(tmp_path, "leaver.sh", LEAVER)
    c = run.spawn(
        "run", "consumer", "--concurrency", "3", "--lease", "60s",
        "--handler", f"t.hold={holder}", "--handler", f"t.leave={leaver}",
    )  # fmt: skip
    # A finished task's daemon was never rsched's to kill: it must survive the kill -9.
    run.cli("add", "t.leave", "done1", check=0)
    left = run.pids("done1")
    acked = lambda: run.cli("show", "t.leave", "done1").returncode == 3  # noqa: E731
    wait_for(acked, timeout=20, what="done1 acked")
    run.cli("add", "t.hold", "h1", check=0)
    run.cli("add", "t.hold", "h2", check=0)
    running = run.pids("h1") + run.pids("h2")
    assert all(alive(p) for p in running + left)

    run.kill9(c)
    run.assert_gone(running, c)
    assert alive(left[0]), "the daemon of a task that had finished was killed"


def test_cron_kill9_kills_the_job_and_its_children(run: Run, tmp_path: Path) -> None:
    holder = script(tmp_path, "holder.sh", HOLDER)
    c = run.spawn("run", "cron", "orph", "--schedule", "*/1 * * * * *", "--ttl", "2s", "--",
                  str(holder))  # fmt: skip
    running = run.pids("orph")
    run.kill9(c)
    run.assert_gone(running, c)


def test_exec_kill9_kills_the_command_and_its_children(run: Run, tmp_path: Path) -> None:
    holder = script(tmp_path, "holder.sh", HOLDER)
    c = run.spawn("exec", "--lock", "orph", "--ttl", "2s", "--", str(holder), "ex")
    running = run.pids("ex")
    run.kill9(c)
    run.assert_gone(running, c)


def test_a_killed_guardian_is_replaced_and_told_what_runs(
    run: Run, rs: Rsched, tmp_path: Path
) -> None:
    """The guardian dies (OOM killer, an operator) while h1 runs: the next child's start
    finds the pipe broken, starts a new guardian and hands it h1 as well as h2."""
    holder = script(tmp_path, "holder.sh", HOLDER)
    c = run.spawn("run", "consumer", "--concurrency", "2", "--lease", "60s",
                  "--handler", f"t.hold={holder}")  # fmt: skip
    run.cli("add", "t.hold", "h1", check=0)
    first = run.pids("h1")
    (g,) = wait_for(lambda: guardians(c.pid), what="the guardian")
    os.kill(g, signal.SIGKILL)
    wait_for(lambda: not guardians(c.pid), what="the guardian gone")
    run.cli("add", "t.hold", "h2", check=0)
    second = run.pids("h2")
    (g2,) = wait_for(lambda: guardians(c.pid), what="a new guardian")
    assert g2 != g and all(alive(p) for p in first + second)

    run.kill9(c)
    run.assert_gone(first + second, c)


def test_a_runner_that_exits_normally_leaves_no_guardian_and_kills_nothing(
    cli: Cli, tmp_path: Path
) -> None:
    res = cli("exec", "--lock", "plain", "--", "sh", "-c", "echo $PPID", check=0)
    runner_pid = int(res.stdout.split()[0])
    assert "is gone" not in res.stderr
    wait_for(lambda: not guardians(runner_pid), what="the guardian to exit with its runner")


def test_guardian_off_starts_none_and_leaves_the_old_behaviour(run: Run, tmp_path: Path) -> None:
    """RSCHED_GUARDIAN=off (a supervisor that kills the whole service already): no
    guardian is started, and a kill -9 of the runner leaves its child running."""
    holder = script(tmp_path, "holder.sh", HOLDER)
    run.env["RSCHED_GUARDIAN"] = "off"
    c = run.spawn("exec", "--lock", "orph-off", "--ttl", "2s", "--", str(holder), "off")
    running = run.pids("off")
    assert not guardians(c.pid)
    run.kill9(c)
    assert all(alive(p) for p in running)
    assert "is gone" not in run.err.read_text()


#: A runner that is killed between a child's fork and its exec, the exec coming late
#: (as on a loaded machine): rsched's own Child protocol (``+SEQ`` sent, the fork),
#: then what _posixsubprocess does in the child (own session, the runner's descriptors
#: closed: the guardian's pipe among them) before an exec 0.5 s later; the runner is
#: SIGKILLed right after the fork.
LATE_EXEC = """
import os, signal, sys, time
from rsched.runtime import proc
out = sys.argv[1]
seq, marker = proc._GUARD.begin()
time.sleep(0.5)  # the guardian is up and has read the runner's environment
pid = os.fork()
if pid == 0:
    os.setsid()
    os.closerange(3, 1024)
    time.sleep(0.5)
    os.execve("/bin/sleep", ["sleep", "300"], dict(os.environ, RSCHED_GUARD=marker))
with open(out + ".tmp", "w") as f:
    f.write(str(pid))
os.rename(out + ".tmp", out)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_child_forked_as_the_runner_dies_is_killed_when_it_execs(tmp_path: Path) -> None:
    """Today's guardian scanned /proc before that exec: the child, not yet marked,
    was missed and ran on (3 handlers ran to completion after their consumer was
    gone in a chaos run). Now it watches processes still showing the runner's own
    environment until they exec (GUARD_LATE_EXEC_S) and kills the marked one."""
    out = tmp_path / "child.pid"
    runner = subprocess.Popen(
        [sys.executable, "-c", LATE_EXEC, str(out)], stderr=subprocess.PIPE, text=True
    )
    try:
        assert runner.wait(timeout=30) == -signal.SIGKILL
        child = pids_in(out)[0]
        wait_for(lambda: not alive(child), timeout=GONE_WITHIN_S, what="the late child killed")
        # It was killed as it exec'd (not before: its exec was what made it ours).
        wait_for(lambda: not guardians(runner.pid), timeout=GONE_WITHIN_S, what="guardian exit")
    finally:
        for pid in pids_in(out):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if runner.stderr is not None:
            runner.stderr.close()


#: Records its pid (renamed into place) and runs on until killed.
LONG = """
    echo "$$" > "$PIDS_DIR/$1.tmp"
    mv "$PIDS_DIR/$1.tmp" "$PIDS_DIR/$1"
    exec sleep 300
"""


def test_kill9_at_many_points_around_spawns_no_handler_outlives_its_consumer(
    run: Run, tmp_path: Path
) -> None:
    """12 consumers (concurrency 8), each kill -9'd 0-60 ms after 8 tasks were
    added, while it claims them and spawns their handlers. Once the consumer's
    guardian has exited (at most GUARD_LATE_EXEC_S after the kill), no handler
    that ever started is alive."""
    import random

    long_ = script(tmp_path, "long.sh", LONG)
    rnd = random.Random(11)
    started = 0
    for i in range(12):
        c = run.spawn("run", "consumer", "--queue", f"k{i}", "--concurrency", "8",
                      "--lease", "60s", "--handler", f"t.l={long_}")  # fmt: skip
        run.cli("add", "--in", "1h", "--queue", f"k{i}", "t.l", "probe", check=0)
        wait_for(
            lambda i=i: {q["queue"]: q for q in run.cli.json("queues")}[f"k{i}"]["consumers"],
            timeout=30,
            what="the consumer registered",
        )
        lines = "".join(f'{{"type": "t.l", "id": "k{i}-{j}", "queue": "k{i}"}}\n' for j in range(8))
        run.cli("add", "--from", "-", input=lines, check=0)
        time.sleep(rnd.uniform(0, 0.06))  # the fault: a kill at a random point of the spawns
        run.kill9(c)
        wait_for(lambda c=c: not guardians(c.pid), timeout=GONE_WITHIN_S, what="guardian exit")
        pids = [p for f in run.dir.glob(f"k{i}-*") if f.suffix != ".tmp" for p in pids_in(f)]
        started += len(pids)
        # SIGKILLed ones may take a moment to die on a loaded machine; a missed one
        # runs for 300 s.
        wait_for(
            lambda pids=pids: not [p for p in pids if alive(p)],
            timeout=2,
            what=f"handlers of consumer {i} to be gone",
        )
    assert started, "no handler ever started: the kills came too early to test anything"
