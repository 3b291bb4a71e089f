"""`--log-json`: every log record as one JSON object per line, and one `smg.access` record per
request with its outcome (request id, tenant, model, worker, status, durations).

A record's structured fields travel in `extra={"fields": {...}}` and land at the top level of
its object, beside `ts`, `level`, `logger` and `message`.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import orjson

ACCESS = logging.getLogger("smg.access")
ACCESS.disabled = True  # until `configure` turns on --log-json


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update(fields)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


def configure(level: str, json_lines: bool) -> None:
    """The process's logging: text lines, or JSON objects (`--log-json`), on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    if json_lines:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.set_name("smg")
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == "smg"]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # One line per request only when asked for (it is what --log-json is for).
    ACCESS.disabled = not json_lines


def access(fields: dict[str, Any]) -> None:
    """The per-request record."""
    if not ACCESS.disabled and ACCESS.isEnabledFor(logging.INFO):
        ACCESS.info("request completed", extra={"fields": fields})
