"""The event path of ``run expired``: one Pub/Sub subscription per node to
``__keyevent@DB__:expired``; matching keys are claimed in pipelined batches
(:mod:`rsched.expired.fire`). A subscription that does not answer PING is
reconnected; after each (re)subscription the node's sweep runs at once."""

from __future__ import annotations

import time
from typing import Any

import redis

from rsched.core.errors import ConfigError, map_error
from rsched.core.keys import key_slot
from rsched.core.transient import TRANSIENT
from rsched.expired.base import RECONNECT_MAX_S
from rsched.expired.fire import CLAIM_BATCH, FireMixin
from rsched.expired.model import Node
from rsched.expired.notify import check_notify, key_bytes, key_text, one_line
from rsched.expired.sweep import SWEEP_MAX_INTERVAL_S

#: A subscription that does not answer PING within this is reconnected.
HEALTH_INTERVAL_S = 5.0


class SubscribeMixin(FireMixin):
    """Each node's subscriber thread (``_listen``)."""

    def _listen(self, node: Node) -> None:
        delay = 0.1
        pattern = key_bytes(self.channel)
        while not node.halt.is_set():
            # socket_timeout: never block a read for long (a frozen server is caught by PING)
            client = node.client(socket_timeout=HEALTH_INTERVAL_S * 2)
            ps = client.pubsub()
            try:
                ps.psubscribe(pattern)
                deadline = time.monotonic() + HEALTH_INTERVAL_S * 2
                while True:
                    msg = ps.get_message(timeout=0.2)
                    if msg is not None and msg.get("type") == "psubscribe":
                        break
                    if time.monotonic() > deadline:
                        raise redis.TimeoutError("no reply to PSUBSCRIBE")
                    if node.halt.is_set():
                        return
                if node.ever_subscribed or node.late:
                    # The server may have restarted without our notify setting; a
                    # promoted replica may never have had it.
                    try:
                        check_notify(node.cmd, self.set_notify, self._node_log(node))
                    except ConfigError as exc:
                        self._log(
                            "error", f"{node.name}: {exc} (still subscribed; the sweep still runs)"
                        )
                if node.ever_subscribed:
                    self._log(
                        "info",
                        f"{node.name}: subscribed again to {self.channel}"
                        + (
                            "; sweeping what expired meanwhile"
                            if self.backup_sweep
                            else "; expiries while disconnected were lost "
                            "(arm() + --backup-sweep recovers them)"
                        ),
                    )
                else:
                    self._log(
                        "info" if node.late else "debug",
                        f"{node.name}: subscribed to {self.channel}",
                    )
                node.subscribed = node.ever_subscribed = True
                node.rediscover = True  # look for armed sets again (cluster)
                with node.lock:  # and sweep every known one now
                    for slot in node.sets:
                        node.sets[slot] = 0.0
                node.kick.set()  # sweep now: anything that expired before we listened
                self._wake.set()
                delay = 0.1
                self._pump(node, ps)
            except TRANSIENT as exc:
                node.subscribed = False
                if node.halt.is_set():
                    return
                self._topo_kick.set()
                wait_s = self._rnd.uniform(delay / 2, delay)
                self._log(
                    "error", f"{node.name}: {one_line(map_error(exc))}; retrying in {wait_s:.1f}s"
                )
                delay = min(RECONNECT_MAX_S, delay * 2)
                node.halt.wait(wait_s)
            finally:
                node.subscribed = False
                try:
                    ps.close()
                    client.connection_pool.disconnect()
                except Exception:  # noqa: BLE001
                    pass

    def _pump(self, node: Node, ps: Any) -> None:
        """Read events until stopped; claim matching keys in pipelined batches."""
        last_pong = time.monotonic()
        next_ping = last_pong + HEALTH_INTERVAL_S
        while not node.halt.is_set():
            msg = ps.get_message(timeout=0.2)
            batch: list[bytes] = []
            while msg is not None:
                kind = msg.get("type")
                if kind == "pmessage":
                    raw = msg["data"]
                    if isinstance(raw, str):
                        raw = key_bytes(raw)
                    if self._match(key_text(raw)):
                        batch.append(raw)
                elif kind == "pong":
                    last_pong = time.monotonic()
                if len(batch) >= CLAIM_BATCH:
                    break
                msg = ps.get_message(timeout=0)
            if batch:
                self._claim_events(node, batch)
            now = time.monotonic()
            if now >= next_ping:
                ps.ping()
                next_ping = now + HEALTH_INTERVAL_S
            if now - last_pong > HEALTH_INTERVAL_S * 2 + 1:
                raise redis.TimeoutError(
                    f"the subscription did not answer PING for {now - last_pong:.0f}s"
                )

    def _claim_events(self, node: Node, batch: list[bytes]) -> None:
        """Claim a batch of expired keys. A claim that cannot reach Redis is retried
        for up to half the claim window, then given up (the sweep recovers armed keys)."""
        t0 = time.monotonic()
        delay = 0.05
        while True:
            try:
                outs = self._run_fire(node, [(raw, "event") for raw in batch])
                break
            except TRANSIENT as exc:
                if node.halt.is_set() or time.monotonic() - t0 > self.claim_window_ms / 2000.0:
                    self._log(
                        "error",
                        f"could not claim {len(batch)} expired key(s) ({one_line(map_error(exc))}); "
                        "another subscriber may have run them"
                        + ("; the sweep fires armed ones" if self.backup_sweep else ""),
                    )
                    raise
                if delay == 0.05:  # once per refused batch: say what it waits for
                    self._log(
                        "error",
                        f"claim of {len(batch)} expired key(s) refused ({one_line(map_error(exc))}); "
                        f"retrying for up to {self.claim_window_ms / 2000.0:g}s",
                    )
                self._topo_kick.set()
                time.sleep(self._rnd.uniform(delay / 2, delay))
                delay = min(1.0, delay * 2)
        for raw, out in zip(batch, outs, strict=True):
            self._after_fire(raw, out, "event")
        if self.cluster and self.backup_sweep:
            # Learn the slots in use from the events (a slot new to us is looked at
            # by the next sweep; its entries may be armed later than this one).
            now = time.monotonic() + SWEEP_MAX_INTERVAL_S
            for raw in batch:
                node.learn(key_slot(raw), now)
