"""``python full_disk_broker.py ARGS``: ``mqttbroker ARGS`` on a disk that fills up on demand.

While a file ``disk-full`` exists beside the database, the database may not grow (``PRAGMA
max_page_count``, checked before each commit), so SQLite fails every commit that needs room with
SQLITE_FULL and rolls it back, as on a full disk; once the file is gone it may grow again.
Retries are quicker than in production (at most 0.2 s apart), to keep the test short.
"""

from __future__ import annotations

import sys
from typing import Any

from mqttbroker.cli import main
from mqttbroker.storage.sqlite import SQLiteStore

_apply = SQLiteStore._apply


async def _apply_on_a_small_disk(self: SQLiteStore, batch: Any) -> None:
    full = (self.path.parent / "disk-full").exists()
    assert self._db is not None
    await self._db.execute(f"PRAGMA max_page_count = {1 if full else 2**31 - 2}")
    await _apply(self, batch)


SQLiteStore._apply = _apply_on_a_small_disk  # type: ignore[method-assign]
SQLiteStore.RETRY_MAX = 0.2

if __name__ == "__main__":
    sys.exit(main())
