"""QoS 1/2 messages for other nodes kept by this node while Redis is unreachable.

Their publishers are acknowledged once the messages are here (the node's own storage): a file
``cluster-outbox.sqlite3`` in the data directory, written (and synced) on a thread, or memory
with ``--memory`` (like the rest of that node's state). When Redis answers again the node sends
them, oldest first, and removes each batch once Redis has it. A node restarted with messages
still here sends them once it has reached Redis.

Each row is one message framed for its destination node (node.py's ``<1 or 0><shares>\\0<PUBLISH>``).
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections import deque
from itertools import islice
from pathlib import Path

FILE_NAME = "cluster-outbox.sqlite3"
# With --memory: messages kept at most (their bytes); past it the writer holds the publishers'
# acknowledgements until Redis is back, as it must not drop what it acknowledges.
MEMORY_BYTES = 64 * 1024 * 1024

_SCHEMA = "CREATE TABLE IF NOT EXISTS outbox (id INTEGER PRIMARY KEY, node TEXT, data BLOB)"


class Outbox:
    def __init__(self, data_dir: Path | None) -> None:
        self.path = None if data_dir is None else data_dir / FILE_NAME
        self._db: sqlite3.Connection | None = None
        self._memory: deque[tuple[int, str, bytes]] = deque()
        self._memory_bytes = 0
        self._next = 1
        self.count = 0  # messages kept

    def _open(self) -> sqlite3.Connection:
        if self._db is None:
            assert self.path is not None
            db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.execute(_SCHEMA)
            self._db = db
        return self._db

    async def load(self) -> None:
        """Count what a previous run left (nothing to open when there is no file)."""
        if self.path is not None and self.path.exists():
            found = await asyncio.to_thread(
                lambda: self._open().execute("SELECT count(*) FROM outbox").fetchone()
            )
            self.count = int(found[0])

    def has_room(self, size: int) -> bool:
        return self.path is not None or self._memory_bytes + size <= MEMORY_BYTES

    async def add(self, entries: list[tuple[str, bytes]]) -> None:
        """Keep ``entries`` (node, framed message); on disk when this returns."""
        if not entries:
            return
        self.count += len(entries)
        if self.path is None:
            for node, data in entries:
                self._memory.append((self._next, node, data))
                self._next += 1
                self._memory_bytes += len(data)
            return

        def write() -> None:
            db = self._open()
            with db:
                db.execute("BEGIN")
                db.executemany("INSERT INTO outbox (node, data) VALUES (?, ?)", entries)

        await asyncio.to_thread(write)

    async def oldest(self, limit: int) -> list[tuple[int, str, bytes]]:
        """Up to ``limit`` kept messages, oldest first: (id, node, framed message)."""
        if self.path is None:
            return list(islice(self._memory, limit))
        if not self.count:
            return []

        def read() -> list[tuple[int, str, bytes]]:
            rows = self._open().execute(
                "SELECT id, node, data FROM outbox ORDER BY id LIMIT ?", (limit,)
            )
            return [(int(i), str(n), bytes(d)) for i, n, d in rows]

        return await asyncio.to_thread(read)

    async def remove(self, last_id: int) -> None:
        """The messages up to ``last_id`` are in Redis."""
        if self.path is None:
            memory = self._memory  # oldest first: what is in Redis leaves from the front
            while memory and memory[0][0] <= last_id:
                self._memory_bytes -= len(memory.popleft()[2])
                self.count -= 1
            return

        def delete() -> int:
            db = self._open()
            with db:
                db.execute("BEGIN")
                return db.execute("DELETE FROM outbox WHERE id <= ?", (last_id,)).rowcount

        self.count -= await asyncio.to_thread(delete)

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
