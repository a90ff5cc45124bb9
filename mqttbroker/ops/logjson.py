"""``log_format = "json"``: one JSON object per line, for log shippers. Stable keys: ``time``
(UTC, ISO 8601 with milliseconds), ``level`` (lower case), ``logger``, ``message``, and
``exception`` (the traceback) when there is one. JSON escapes control characters, so a
client-supplied string cannot start a line of its own."""

from __future__ import annotations

import json
import logging
import time


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        entry = {
            "time": f"{stamp}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)
