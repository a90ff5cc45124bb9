"""Reading the database back at start: every table into the plain records of broker/store.py,
times moved onto the broker's clock. The broker builds its sessions from them."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiosqlite

from ...broker.message import Message
from ...broker.store import DeliveryRecord, Restored, SessionRecord, SubscriptionRecord
from ...protocol.fastpath import decode_properties
from ...protocol.packets import PacketType, Will
from ...protocol.properties import WILL

log = logging.getLogger("mqttbroker.storage")


def _properties(data: bytes, packet_type: int) -> dict[int, Any]:
    return decode_properties(data, 0, len(data), packet_type)[0] if data != b"\x00" else {}


class Reader:
    """Reads one database; ``table`` names the table being read (for an error), and
    ``next_message_id`` is past every stored message once read."""

    def __init__(
        self, db: aiosqlite.Connection, local: Callable[[float | None], float | None], path: Path
    ) -> None:
        self.db = db
        self.local = local
        self.path = path
        self.table = ""
        self.next_message_id = 1

    async def _rows(self, sql: str) -> list[Any]:
        async with self.db.execute(sql) as cur:
            return list(await cur.fetchall())

    async def read(self) -> Restored:
        db = self.db
        """Every table as records (see broker/store.py), times on the broker's clock."""
        await db.execute("DELETE FROM messages WHERE id NOT IN (SELECT message_id FROM deliveries)")
        messages: dict[int, Message] = {}
        self.table = "table messages"
        for mid, topic, payload, qos, retain, props, expires_at in await self._rows(
            "SELECT id, topic, payload, qos, retain, properties, expires_at FROM messages"
        ):
            msg = Message(
                topic,
                payload,
                qos,
                bool(retain),
                _properties(props, PacketType.PUBLISH),
                self.local(expires_at),
            )
            msg.stored = mid
            messages[mid] = msg
            self.next_message_id = max(self.next_message_id, mid + 1)
        sessions: dict[str, SessionRecord] = {}
        self.table = "table sessions"
        for client_id, expiry, expires_at, username in await self._rows(
            "SELECT client_id, expiry_interval, expires_at, username FROM sessions"
        ):
            sessions[client_id] = SessionRecord(
                client_id, expiry, self.local(expires_at), username, stored=1
            )
        self.table = "table subscriptions"
        for client_id, topic_filter, qos, no_local, rap, rh, ident in await self._rows(
            "SELECT client_id, topic_filter, qos, no_local, retain_as_published, "
            "retain_handling, identifier FROM subscriptions",
        ):
            owner = sessions.get(client_id)
            if owner is not None:
                owner.subscriptions.append(
                    SubscriptionRecord(topic_filter, qos, bool(no_local), bool(rap), rh, ident)
                )
        self.table = "table deliveries"
        queued = 0
        for row in await self._rows(
            "SELECT client_id, seq, message_id, qos, retain, sub_ids, packet_id, released, "
            "share FROM deliveries ORDER BY client_id, seq",
        ):
            client_id, seq, mid, qos, retain, sub_ids, packet_id, released, share = row
            owner = sessions.get(client_id)
            stored = messages.get(mid)
            if owner is None or stored is None:
                continue
            ids = tuple(int(i) for i in sub_ids.split(",")) if sub_ids else ()
            owner.deliveries.append(
                DeliveryRecord(
                    seq, stored, qos, bool(retain), ids, packet_id, bool(released), share
                )
            )
            owner.stored = seq + 1  # rows come in seq order: the next seq of the session
            stored.store_refs += 1
            queued += 1
        self.table = "table releases"
        for client_id, packet_id in await self._rows("SELECT client_id, packet_id FROM releases"):
            owner = sessions.get(client_id)
            if owner is not None:
                owner.releases.append(packet_id)
        self.table = "table retained"
        retained = [
            Message(
                topic,
                payload,
                qos,
                True,
                _properties(props, PacketType.PUBLISH),
                self.local(expires_at),
            )
            for topic, payload, qos, props, expires_at in await self._rows(
                "SELECT topic, payload, qos, properties, expires_at FROM retained"
            )
        ]
        self.table = "table wills"
        for client_id, topic, payload, qos, retain, props, version, due_at in await self._rows(
            "SELECT client_id, topic, payload, qos, retain, properties, version, due_at FROM wills",
        ):
            owner = sessions.get(client_id)
            if owner is not None:
                owner.will = Will(topic, payload, qos, bool(retain), _properties(props, WILL))
                owner.will_version = version
                owner.will_due = self.local(due_at)
        log.info(
            "store %s: restored %d sessions, %d queued or in-flight messages, %d retained",
            self.path,
            len(sessions),
            queued,
            len(retained),
        )
        return Restored(list(sessions.values()), retained)
