"""``rsched.aio`` on Redis Cluster (3 primaries built from Python) and through
Sentinel, and on a queue the config file partitions that Redis does not know
yet: what the async client writes is what the synchronous client (and so every
consumer) reads."""

from __future__ import annotations

import asyncio

import pytest

from rsched import Rsched
from rsched.aio import Rsched as AsyncRsched
from rsched.core.config import Settings
from rsched.core.conn import connect
from rsched.core.errors import ConfigError, NotFound
from tests.clusters import Cluster, cluster, needs_cluster
from tests.integration.core.test_sentinel import PASSWORD, SentinelSet, sentinel_set

__all__ = ["cluster", "sentinel_set"]  # fixtures, imported for pytest


async def _round_trip(ars: AsyncRsched, queues: list[str], n: int) -> None:
    res = await asyncio.gather(
        *(ars.add("job", f"{q}-{i}", queue=q, delay="1h") for q in queues for i in range(n))
    )
    assert {r.status for r in res} == {"added"}
    assert (await ars.add("job", f"{queues[0]}-0", queue=queues[0])).status == "kept"
    t = await ars.show("job", f"{queues[-1]}-1", queue=queues[-1])
    assert t.state == "scheduled" and t.queue == queues[-1]
    assert await ars.cancel("job", f"{queues[1]}-2", queue=queues[1]) == "scheduled"
    with pytest.raises(NotFound):
        await ars.show("job", f"{queues[1]}-2", queue=queues[1])
    listed = await ars.list(queue=queues[2])
    assert sorted(t.id for t in listed) == sorted(f"{queues[2]}-{i}" for i in range(n))
    stats = {s.queue: s.scheduled for s in await ars.queues()}
    assert sum(stats[q] for q in queues) == len(queues) * n - 1


@needs_cluster
@pytest.mark.parametrize("scheme", ["redis", "redis+cluster"])
def test_async_client_on_a_cluster_routes_each_queue_to_its_slot(
    cluster: Cluster, namespace: str, scheme: str
) -> None:
    queues = [f"q{i}" for i in range(8)]  # 8 hash tags: some on each primary
    primaries = {cluster.node_of(f"{namespace}:{{q:{q}}}:sched").port for q in queues}
    assert len(primaries) == 3, "the queues should land on every primary"
    url = cluster.url.replace("redis://", f"{scheme}://")

    async def main() -> None:
        ars = AsyncRsched.from_url(url, namespace=namespace)
        try:
            await _round_trip(ars, queues, 20)
            # a partitioned queue spreads over the primaries; adds find their partition
            Rsched(connect(Settings(redis_url=cluster.url)), namespace).add(
                "p.t", "seed", queue="parts", partitions=6, delay="1h"
            )
            res = await asyncio.gather(
                *(ars.add("p.t", str(i), queue="parts", delay="1h") for i in range(60))
            )
            assert len({r.stored_queue for r in res}) == 6
        finally:
            await ars.close()

    asyncio.run(main())
    rs = Rsched(connect(Settings(redis_url=cluster.url)), namespace)
    assert rs.show("job", "q7-19", queue="q7").state == "scheduled"
    with pytest.raises(NotFound):
        rs.show("job", "q1-2", queue="q1")
    assert rs.show("p.t", "59", queue="parts").state == "scheduled"
    rs.close()


def test_async_client_through_sentinel(sentinel_set: SentinelSet, namespace: str) -> None:
    settings = Settings(redis_url=sentinel_set.url, namespace=namespace, password=PASSWORD)

    async def main() -> None:
        ars = AsyncRsched.from_settings(settings)
        try:
            await _round_trip(ars, ["a", "b", "c"], 10)
        finally:
            await ars.close()

    asyncio.run(main())
    # the data is on the master the sentinels name
    with sentinel_set.primary.client() as c:
        rs = Rsched(c, namespace)
        assert rs.show("job", "c-9", queue="c").state == "scheduled"
        assert sum(q.scheduled for q in rs.queues()) == 29


def test_a_queue_the_config_partitions_is_partitioned_by_the_async_client(
    server, namespace: str, rs
) -> None:
    settings = Settings(
        redis_url=server.url, namespace=namespace, file={"queues": {"big": {"partitions": 4}}}
    )

    async def main() -> list[str]:
        ars = AsyncRsched.from_settings(settings)
        try:
            res = await asyncio.gather(
                *(ars.add("b.t", str(i), queue="big", delay="1h") for i in range(40))
            )
            return [r.stored_queue for r in res]
        finally:
            await ars.close()

    stored = asyncio.run(main())
    assert len(set(stored)) == 4  # spread over the 4 partitions
    assert rs.redis.hget(rs.keys.queue_config, "big") == "4"
    # where the synchronous client (and so every consumer) looks for them
    assert rs.show("b.t", "39", queue="big").state == "scheduled"
    assert {rs.add("b.t", str(i), queue="big").stored_queue for i in range(40)} == set(stored)

    # a config that disagrees with what Redis stores is refused, nothing written
    other = Settings(
        redis_url=server.url, namespace=namespace, file={"queues": {"big": {"partitions": 8}}}
    )

    async def refused() -> None:
        ars = AsyncRsched.from_settings(other)
        try:
            with pytest.raises(ConfigError, match="4 partitions"):
                await ars.add("b.t", "x", queue="big", delay="1h")
        finally:
            await ars.close()

    asyncio.run(refused())
    with pytest.raises(NotFound):
        rs.show("b.t", "x", queue="big")
