"""The Redis-down outbox without a data directory (``--memory``): kept in order, removed from
the front as Redis takes them, its byte bound freed as they go. No Redis needed."""

from __future__ import annotations

import asyncio

from mqttbroker.cluster.outbox import MEMORY_BYTES, Outbox


def test_memory_outbox_keeps_order_and_frees_what_redis_took() -> None:
    async def scenario() -> None:
        box = Outbox(None)
        await box.add([("a", b"1" * 10), ("b", b"2" * 20)])
        await box.add([("a", b"3" * 30)])
        rows = await box.oldest(2)
        assert [(node, data[:1]) for _, node, data in rows] == [("a", b"1"), ("b", b"2")]
        await box.remove(rows[-1][0])
        assert box.count == 1
        assert [data for _, _, data in await box.oldest(10)] == [b"3" * 30]
        assert box.has_room(MEMORY_BYTES - 30) and not box.has_room(MEMORY_BYTES - 29)
        await box.remove(rows[-1][0])  # nothing newer than the last id taken: kept
        assert box.count == 1
        last = (await box.oldest(1))[0][0]
        await box.remove(last)
        assert box.count == 0 and await box.oldest(5) == []
        assert box.has_room(MEMORY_BYTES)

    asyncio.run(scenario())
