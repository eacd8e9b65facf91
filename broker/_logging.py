"""The daemon's log: lines for people, or one JSON object a line for machines.

Every part logs through the standard `logging` module under the `ssb.` names; this
module only decides how records leave the process (standard error). The JSON form
carries the time (UTC, ISO 8601 with milliseconds), the level, the logger, the message
with its arguments filled in, and an exception's text when there is one.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Final

TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class TextFormatter(logging.Formatter):
    """Lines for people. Names and texts from clients and peers may hold line breaks or
    other control characters: they are escaped, so no one can forge a log line."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        return line.translate(_ESCAPES) if not line.isprintable() else line


_ESCAPES: Final = {c: f"\\x{c:02x}" for c in (*range(32), 127)}


class JsonFormatter(logging.Formatter):
    """One JSON object a line."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        entry: dict[str, object] = {
            "time": f"{stamp}.{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def configure(level: str, form: str) -> None:
    """Send the daemon's log records to standard error at `level`, as `form` says."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if form == "json" else TextFormatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # aiohttp's access log would log every scrape of /metrics: warnings only
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
