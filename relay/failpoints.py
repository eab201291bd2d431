"""Failpoints: named places where a test can make a relay process die like ``kill -9``.

``OUTBOX_FAILPOINT=name`` makes the process call ``os._exit`` the first time it reaches the
point of that name (no cleanup, no lease release, no flush: exactly a crash). Unset, a
failpoint costs one dictionary lookup. The tests use them to crash a turn at every
boundary between its transactions and prove the thread still replays.
"""

from __future__ import annotations

import os

POINTS = (
    "model.after_call",  # the model answered; nothing recorded yet
    "tool.after_call",  # the tool answered; the result is not written
    "complete.before_commit",  # outcomes written, transaction not committed
    "complete.after_commit",  # outcomes committed, leases not yet forgotten in memory
    "claim.after_commit",  # rows leased, not yet handed to a slot
)
_ARMED = os.environ.get("OUTBOX_FAILPOINT")
CRASH_EXIT_CODE = 137  # what a shell reports for a process killed by SIGKILL


def hit(name: str) -> None:
    if name == _ARMED:
        os._exit(CRASH_EXIT_CODE)
