"""Limits and defaults, each overridable from the environment (units in the names)."""

from __future__ import annotations

import os


def _int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


MAX_PAYLOAD_BYTES = _int("OUTBOX_MAX_PAYLOAD_BYTES", 256 * 1024)  # per message/argument/result
# The most of a model's answer the relay reads (bytes): twice the largest turn it can
# record (64 calls with arguments at the payload cap, JSON-escaped inside the answer).
MAX_MODEL_ANSWER_BYTES = _int("OUTBOX_MAX_MODEL_ANSWER_BYTES", 32 * 1024 * 1024)
MAX_TOOL_CALLS_PER_TURN = _int("OUTBOX_MAX_TOOL_CALLS_PER_TURN", 64)
DEFAULT_MAX_STEPS = _int("OUTBOX_DEFAULT_MAX_STEPS", 20)
DEFAULT_ACTION_TIMEOUT_S = _int("OUTBOX_ACTION_TIMEOUT_S", 600)  # requires_action deadline
DEFAULT_LOOP_LIMIT = _int("OUTBOX_LOOP_LIMIT", 3)  # identical consecutive turns = a loop
