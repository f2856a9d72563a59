"""The claim of one firing, shared by the event path and the sweep: one
``expired-fire-4`` call per key (pipelined for a batch) on the node that holds
it, following a slot that moved (MOVED/ASK) to its new node; a claimed firing
(:class:`Firing`) goes to the runner's workers."""

from __future__ import annotations

from typing import Any

import redis

from rsched.core.errors import map_error
from rsched.core.keys import ExpiredKeys, key_slot
from rsched.expired.model import Firing, Node
from rsched.expired.notify import key_text
from rsched.expired.topology import TopologyMixin
from rsched.lua import calls

#: The key's slot is served by another node (MOVED) or moving there (ASK).
REDIRECT = redis.exceptions.AskError
#: Events read and claimed in one pipelined batch at most.
CLAIM_BATCH = 256


class FireMixin(TopologyMixin):
    """Claim firings (see the module doc)."""

    def _slot_set(self, slot: int) -> ExpiredKeys:
        ek = self._slot_keys.get(slot)
        if ek is None:
            ek = self._slot_keys[slot] = ExpiredKeys.for_slot(self.rs.namespace, slot)
        return ek

    def _keys(self, raw: bytes) -> ExpiredKeys:
        """The armed set, values and claim keys of trigger key ``raw`` (its slot's, on a cluster)."""
        return self._slot_set(key_slot(raw)) if self.cluster else self.keys

    def _fire(self, node: Node, raw: bytes, mode: str, client: Any = None) -> Any:
        """``expired-fire-4`` of ``raw`` on ``node`` (or in pipeline ``client``)."""
        return calls.expired_fire(
            node.lua,
            raw,
            self._keys(raw),
            mode=mode,
            window_ms=self.claim_window_ms,
            grace_ms=self.sweep_grace_ms,
            owner=self.id,
            client=client,
        )

    def _run_fire(self, node: Node, items: list[tuple[bytes, str]]) -> list[Any]:
        if len(items) == 1:
            raw, mode = items[0]
            try:
                return [self._fire(node, raw, mode)]
            except REDIRECT as exc:
                return [self._fire_redirected(exc, raw, mode)]
        pipe = node.cmd.pipeline(transaction=False)
        for raw, mode in items:
            self._fire(node, raw, mode, client=pipe)
        try:
            outs = list(pipe.execute(raise_on_error=False))
        except redis.RedisError as exc:
            raise map_error(exc) from exc
        for i, o in enumerate(outs):
            if isinstance(o, REDIRECT):
                # The slot moved since the event (or the sweep's look): claim it there.
                outs[i] = self._fire_redirected(o, *items[i])
            elif isinstance(o, Exception):
                raise map_error(o)
        return outs

    def _fire_redirected(self, exc: redis.exceptions.AskError, raw: bytes, mode: str) -> Any:
        self._topo_kick.set()
        target = self._redirect_node(exc.host, int(exc.port))
        pipe = target.cmd.pipeline(transaction=False)
        if not isinstance(exc, redis.exceptions.MovedError):
            pipe.execute_command("ASKING")
        self._fire(target, raw, mode, client=pipe)
        try:
            out = pipe.execute(raise_on_error=False)[-1]
        except redis.RedisError as e:
            raise map_error(e) from e
        if isinstance(out, REDIRECT):  # moved again: the next look (event or sweep) retries
            raise redis.exceptions.TryAgainError(f"{raw!r}: slot {exc.slot_id} is moving")
        if isinstance(out, Exception):
            raise map_error(out)
        return out

    def _after_fire(self, raw: bytes, out: list[Any], mode: str) -> str:
        status = key_text(out[0])
        key = key_text(raw)
        if status == "fire":
            expire = int(out[2])
            firing = Firing(
                key,
                mode,
                int(out[1]),
                expire if expire >= 0 else None,
                out[3] if isinstance(out[3], bytes) else None,
            )
            with self._lock:
                self.stats.fired += 1
                if mode == "sweep":
                    self.stats.swept += 1
                self._pending += 1
            late = f", {int(out[1]) - expire}ms after its expiry" if expire >= 0 else ""
            self._log("debug", f"fire {key!r} (by {mode}{late})")
            self._work.put(firing)
        elif status in ("dup", "stale"):
            self.stats.duplicates += 1
            self._log("debug", f"skip {key!r}: {status}")
        elif status == "extended":
            self._log("debug", f"sweep: {key!r} still exists; its entry follows its new TTL")
        elif status == "persistent":
            self._log(
                "info",
                f"sweep: {key!r} was armed but now exists without a TTL (overwritten without PX?); "
                "it will never expire: dropped from the sweep",
            )
        return status
