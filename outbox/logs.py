"""Structured logs: one JSON object per line, always carrying the row's identities.

Every line names tenant, thread, run, batch, tool call, correlation id, attempt and worker
(null where a line concerns no such thing), so an operator can follow one run across
relay workers and ``outbox serve``'s requests with ``grep`` or ``jq``. The relay logs under
``relay``, the server under ``server``.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

IDENTITY_FIELDS = (
    "tenant_id",
    "thread_id",
    "run_id",
    "batch_id",
    "tool_call_ref",
    "tool_call_id",
    "correlation_id",
    "attempt",
    "worker",
)


class JsonFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__()
        # A relay writes thousands of lines a second: a second's text is made once.
        self._second, self._second_text = -1, ""

    def format(self, record: logging.LogRecord) -> str:
        second = int(record.created)
        if second != self._second:
            self._second_text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = second
        line: dict[str, Any] = {
            "ts": f"{self._second_text}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "event": record.getMessage(),
        }
        context = getattr(record, "ctx", {})
        for name in IDENTITY_FIELDS:
            line[name] = context.get(name)
        line.update({k: v for k, v in context.items() if k not in IDENTITY_FIELDS})
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def setup(level: str = "INFO", name: str = "relay") -> None:
    """JSON lines on stderr for the loggers under ``name``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger(name)
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


def log(logger: logging.Logger, level: int, event: str, **context: Any) -> None:
    if logger.isEnabledFor(level):
        # The record is made here rather than by ``logger.log``, which would walk the stack
        # for the caller's file and line: no line names them (its identities say where it
        # comes from), and a relay writes a line per outcome.
        record = logger.makeRecord(
            logger.name, level, "", 0, event, (), None, extra={"ctx": context}
        )
        logger.handle(record)
