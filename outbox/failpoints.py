"""Failpoints: named places where a test can make a relay or ``outbox serve`` process die
like ``kill -9``, or stop like ``SIGSTOP``.

``OUTBOX_FAILPOINT=name`` makes the process call ``os._exit`` the first time it reaches the
point of that name (no cleanup, no lease release, no flush: exactly a crash);
``OUTBOX_FAILPOINT=name:stop`` makes it stop itself there, once, every thread at once, until
it gets ``SIGCONT`` (a pause at the worst moment: inside a transaction, its locks held).
``OUTBOX_FAILPOINT_WHEN=path`` holds the point back until that file exists, so a test picks
the moment (e.g. once a call is at the tool). Unset, a failpoint costs one comparison. The
tests use them to crash a turn at every boundary between its transactions and prove the
thread still replays, and to pause a relay or a server inside a transaction.
"""

from __future__ import annotations

import os
import signal
import threading

# The boundaries between a turn's transactions (tests crash a turn at each of them).
POINTS = (
    "model.after_call",  # the model answered; nothing recorded yet
    "tool.after_call",  # the tool answered; the result is not written
    "complete.before_commit",  # outcomes written, transaction not committed
    "complete.after_commit",  # outcomes committed, leases not yet forgotten in memory
    "claim.after_commit",  # rows leased, not yet handed to a slot
)
# Inside a turn that compacts (relay.compaction): the summary answered, nothing recorded.
COMPACTION_POINTS = ("compaction.after_summary",)
# Inside a read_result call (relay.executors): the stored result read, nothing recorded.
READ_RESULT_POINTS = ("read_result.after_read",)
# Places a test pauses a process at (``name:stop``), inside a transaction.
PAUSE_POINTS = (
    "heartbeat.before_commit",  # a relay's leases extended (rows locked), not committed
    "serve.before_commit",  # a server's request done (its rows locked), not committed
)
_ARMED, _, _ACTION = os.environ.get("OUTBOX_FAILPOINT", "").partition(":")
_WHEN = os.environ.get("OUTBOX_FAILPOINT_WHEN")
CRASH_EXIT_CODE = 137  # what a shell reports for a process killed by SIGKILL
_stopped = False


def hit(name: str) -> None:
    global _stopped
    if name != _ARMED or (_WHEN and not os.path.exists(_WHEN)):
        return
    if _ACTION != "stop":
        os._exit(CRASH_EXIT_CODE)
    if not _stopped:
        _stopped = True
        # To this thread: sent to the process, the stop may reach this thread only after it
        # has gone on (and committed), while another thread takes the signal.
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
