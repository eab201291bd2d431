"""In-process tools the benchmark registers (executor ``python``, e.g. ``bench.tools:noop``).

They do nothing on purpose: the relay-overhead measurement is about what the relay costs
around a tool (claim, lease, fencing, result, journal, delivery), not about the tool.
"""

from __future__ import annotations

from typing import Any

NOOP_RESULT: dict[str, Any] = {"ok": True}


def noop(**arguments: Any) -> dict[str, Any]:
    """Return ``{"ok": true}`` whatever the arguments."""
    return NOOP_RESULT
