"""Drive a Broker with a real SQLiteStore, without sockets.

- ``FakeTime``: one fake monotonic clock (the broker's) and one fake wall clock (patched into
  ``mqttbroker.storage.sqlite.store`` by the ``fake_time`` fixture), moved together by ``advance``;
  ``reboot`` moves the wall clock by the downtime and starts a fresh monotonic clock, as a
  restarted process would have.
- ``Node``: one broker "process" on a database file: ``await Node(...).start()`` builds
  Broker(options, clock=..., store=SQLiteStore(path)) and restores it from what
  ``store.load`` reads;
  ``committed()`` awaits the store's post-commit callback; ``close()`` is a clean stop.
- ``Client``: a fake network connection fed bytes made with ``grammar.encode``. ``receive()``
  waits for the store to commit, flushes the broker and decodes what the link got.
- ``snapshot(path)``: a copy of the database file and its WAL, as a SIGKILL would leave the disk,
  taken while the store is still open.
- ``rows(path, sql)``: read the database with a separate sqlite3 connection.
"""

from __future__ import annotations

import asyncio
import functools
import shutil
import sqlite3
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from mqttbroker.broker.core import Broker
from mqttbroker.broker.options import BrokerOptions
from mqttbroker.broker.session import Session
from mqttbroker.protocol import packets as pk
from mqttbroker.protocol.packets import MQTT_5
from mqttbroker.protocol.properties import PropertyId as Prop
from mqttbroker.storage.sqlite import SQLiteStore
from support.harness import FakeLink, LinkClient, decode_raw, split_raw

__all__ = [
    "FakeTime",
    "Node",
    "Client",
    "async_test",
    "snapshot",
    "rows",
    "pk",
    "Prop",
    "MQTT_5",
]

TIMEOUT = 10.0  # failure guard: a commit or a test that hangs fails instead
T = TypeVar("T")
_OPEN: list[Node] = []  # nodes whose store is open, closed by async_test at the end


def async_test(fn: Callable[..., Coroutine[Any, Any, T]]) -> Callable[..., T]:
    """Run an ``async def`` test in a fresh event loop (pytest-asyncio is not used); the test's
    ``node`` fixture, if it has one, is started in that loop first."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        async def run() -> T:
            try:
                if isinstance(kwargs.get("node"), Node):
                    await kwargs["node"].start()
                return await asyncio.wait_for(fn(*args, **kwargs), 4 * TIMEOUT)
            finally:
                # Close every store the test left open (a crash test leaves the "killed" one):
                # aiosqlite's thread would otherwise keep the process alive.
                while _OPEN:
                    node = _OPEN.pop()
                    try:
                        await asyncio.wait_for(node.s.close(), TIMEOUT)
                    except Exception:
                        pass

        return asyncio.run(run())

    return wrapper


class FakeTime:
    """The broker's monotonic clock and the store's wall clock, both fake."""

    def __init__(self) -> None:
        self.mono = 1_000.0
        self.wall = 1_700_000_000.0

    def clock(self) -> float:
        return self.mono

    def time(self) -> float:
        return self.wall

    def advance(self, seconds: float) -> None:
        assert seconds >= 0
        self.mono += seconds
        self.wall += seconds

    def reboot(self, downtime: float = 0.0) -> None:
        """The process restarts: the wall clock moves on, the monotonic clock starts anew."""
        self.wall += downtime
        self.mono = 17.0


class Node:
    """One broker process on the database at ``path``."""

    def __init__(
        self,
        path: Path,
        time: FakeTime,
        *,
        auto_flush: bool = False,
        store_options: dict[str, Any] | None = None,
        **options: Any,
    ) -> None:
        self.path = path
        self.time = time
        self.options = BrokerOptions(**options)
        self.store_options = store_options or {}
        self.auto_flush = auto_flush
        self.store: SQLiteStore | None = None
        self.broker: Broker | None = None

    async def start(self) -> Node:
        self.store = SQLiteStore(self.path, **self.store_options)
        self.broker = Broker(self.options, clock=self.time.clock, store=self.store)
        _OPEN.append(self)
        self.broker.restore(await self.store.load(self.broker.clock))
        self.broker.restored()
        if self.auto_flush:  # as the TCP edge does: flush at the end of the loop pass
            loop = asyncio.get_running_loop()
            broker = self.broker
            broker.scheduler.wake = lambda: loop.call_soon(broker.scheduler.flush)
        return self

    @property
    def b(self) -> Broker:
        assert self.broker is not None
        return self.broker

    @property
    def s(self) -> SQLiteStore:
        assert self.store is not None
        return self.store

    def session(self, client_id: str) -> Session:
        return self.b.sessions[client_id]

    async def committed(self) -> None:
        """Return once everything recorded so far is committed (and the held output released)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def fire() -> None:
            if not done.done():
                done.set_result(None)

        self.s.after_commit(fire)
        await asyncio.wait_for(done, TIMEOUT)

    def tick(self, advance: float = 0.0) -> None:
        if advance:
            self.time.advance(advance)
        self.b.tick()

    def client(
        self, version: int = MQTT_5, on_write: Callable[[bytes], None] | None = None
    ) -> Client:
        return Client(self, version, on_write)

    async def connect(
        self,
        client_id: str,
        *,
        version: int = MQTT_5,
        clean_start: bool = True,
        expiry: int | None = None,
        will: pk.Will | None = None,
        properties: dict[int, Any] | None = None,
        on_write: Callable[[bytes], None] | None = None,
    ) -> Client:
        client = self.client(version, on_write)
        await client.connect(
            client_id, clean_start=clean_start, expiry=expiry, will=will, properties=properties
        )
        return client

    async def close(self) -> None:
        """A clean stop: the store writes what is pending and closes."""
        if self in _OPEN:
            _OPEN.remove(self)
        await self.s.close()

    async def restart(self, downtime: float = 0.0) -> Node:
        """A clean stop, ``downtime`` seconds down (``FakeTime.reboot``), and the process
        started again on the same file with the same options."""
        await self.close()
        self.time.reboot(downtime)
        again = Node(
            self.path, self.time, auto_flush=self.auto_flush, store_options=self.store_options
        )
        again.options = self.options
        return await again.start()


async def offline_subscriber(
    node: Node, client_id: str, topic_filter: str, qos: int = 2, expiry: int = 300, **kw: Any
) -> None:
    """A persistent session subscribed to ``topic_filter`` whose client has gone away."""
    client = await node.connect(client_id, expiry=expiry)
    await client.subscribe(topic_filter, qos, **kw)
    await client.disconnect()
    assert node.session(client_id).connection is None


class Client(LinkClient):
    """A fake network connection to a node's broker; ``on_write`` sees each write."""

    def __init__(
        self, node: Node, version: int = MQTT_5, on_write: Callable[[bytes], None] | None = None
    ) -> None:
        super().__init__(node.b, version, FakeLink(on_write), "test")
        self.node = node

    @property
    def session_present(self) -> bool:
        """The Session Present flag of the CONNACK."""
        assert self.connack is not None, "no CONNACK yet"
        return bool(self.connack.session_present)

    def written(self) -> list[Any]:
        """Everything written to the link so far (without flushing or waiting)."""
        return [decode_raw(r, self.version) for r in split_raw(self.link.data)]

    async def receive(self) -> list[Any]:
        """Wait for the commit, flush, and decode what arrived since the last call."""
        await self.node.committed()
        self.node.b.scheduler.flush()
        return self.unread()

    async def connect(
        self,
        client_id: str,
        *,
        clean_start: bool = True,
        expiry: int | None = None,
        will: pk.Will | None = None,
        properties: dict[int, Any] | None = None,
        keep_alive: int = 0,
    ) -> list[Any]:
        """CONNECT; returns what followed the CONNACK (a resumed session's resends)."""
        props = dict(properties or {})
        if expiry is not None:
            props[Prop.SESSION_EXPIRY_INTERVAL] = expiry
        self.send(
            pk.Connect(
                client_id=client_id,
                protocol_level=self.version,
                clean_start=clean_start,
                keep_alive=keep_alive,
                will=will,
                properties=props,
            )
        )
        received = await self.receive()
        assert received and isinstance(received[0], pk.Connack), received
        self.connack = received[0]
        assert self.connack.reason_code == 0, self.connack
        return received[1:]

    async def subscribe(self, topic_filter: str, qos: int = 1, **options: Any) -> list[Any]:
        """SUBSCRIBE (``options``: those of ``send_subscribe``); returns what arrived (SUBACK
        first, then any retained messages)."""
        packet_id = self.send_subscribe(topic_filter, qos, **options)
        received = await self.receive()
        assert received and isinstance(received[0], pk.Suback), received
        assert received[0].packet_id == packet_id
        assert all(code < 0x80 for code in received[0].reason_codes), received[0]
        return received

    async def publish_acked(self, topic: str, payload: bytes, qos: int = 1, **kw: Any) -> None:
        """PUBLISH and complete the flow (PUBACK, or PUBREC/PUBREL/PUBCOMP)."""
        packet_id = self.publish(topic, payload, qos, **kw)
        if not qos:
            return
        received = await self.receive()
        expected = pk.Puback if qos == 1 else pk.Pubrec
        assert [type(p) for p in received] == [expected], received
        assert received[0].packet_id == packet_id and received[0].reason_code < 0x80, received
        if qos == 2:
            assert packet_id is not None
            self.send(pk.Pubrel(packet_id))
            received = await self.receive()
            assert [type(p) for p in received] == [pk.Pubcomp], received

    async def disconnect(
        self, reason_code: int = 0, properties: dict[int, Any] | None = None
    ) -> None:
        self.send(pk.Disconnect(reason_code, properties or {}))
        await self.node.committed()

    async def lose(self) -> None:
        """The network connection fails (no DISCONNECT)."""
        self.conn.connection_lost()
        await self.node.committed()

    async def ack_all(self, packets: list[Any]) -> None:
        """Acknowledge every QoS 1/2 PUBLISH in ``packets`` (QoS 2: PUBREC, PUBREL, PUBCOMP)."""
        for packet in packets:
            if isinstance(packet, pk.Publish) and packet.qos == 1:
                self.send(pk.Puback(packet.packet_id))
            elif isinstance(packet, pk.Publish) and packet.qos == 2:
                self.send(pk.Pubrec(packet.packet_id))
                answer = await self.receive()
                assert [type(p) for p in answer] == [pk.Pubrel], answer
                self.send(pk.Pubcomp(packet.packet_id))
        await self.node.committed()


def snapshot(path: Path, name: str = "snapshot") -> Path:
    """Copy the database and its write-ahead log as they are on disk now (what a SIGKILL would
    leave behind); the copy is opened by the next Node."""
    target = path.with_name(f"{name}.db")
    for suffix in ("", "-wal"):
        source = Path(f"{path}{suffix}")
        if source.exists():
            shutil.copyfile(source, f"{target}{suffix}")
    return target


def rows(path: Path, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Query the database through a connection of its own (sees what is committed)."""
    db = sqlite3.connect(path)
    try:
        return list(db.execute(sql, params).fetchall())
    finally:
        db.close()
