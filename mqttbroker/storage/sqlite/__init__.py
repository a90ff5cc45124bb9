"""The durable store on SQLite: ``store.py`` (the Store the broker calls, the writer), ``schema.py``
(tables and migrations), ``batch.py`` (the changes of one commit), ``restore.py`` (reading back)."""

from .schema import MIGRATIONS, SYNC_LEVELS
from .store import SQLiteStore

__all__ = ["MIGRATIONS", "SYNC_LEVELS", "SQLiteStore"]
