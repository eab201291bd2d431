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

# The defaults of new runs are not read here: they live in the database (outbox.run_defaults,
# `outbox platform defaults`), where start_run_v1 takes them for SQL callers and the Python
# writer API alike. These variables, when set, are stored there by `outbox db upgrade`
# (outbox.budgets.apply_environment), so a deployment that set them keeps its runs.
RUN_DEFAULT_VARIABLES = {
    "max_steps": "OUTBOX_DEFAULT_MAX_STEPS",  # model turns of a run
    "loop_limit": "OUTBOX_LOOP_LIMIT",  # identical consecutive turns that make a loop
    "action_timeout_s": "OUTBOX_ACTION_TIMEOUT_S",  # seconds in requires_action before expiry
}


def run_defaults_from_environment() -> dict[str, str]:
    """The defaults of new runs this process's environment sets (``RUN_DEFAULT_VARIABLES``),
    as written there."""
    return {
        field: os.environ[name].strip()
        for field, name in RUN_DEFAULT_VARIABLES.items()
        if os.environ.get(name, "").strip()
    }
