"""The listener: ``LISTEN outbox_ready`` on its own link, waking the claim loop.

A statement-level trigger on ``outbox`` INSERT notifies ``outbox_ready`` (one notification
per transaction). Each notification, and every (re)connection (anything committed while we
were not listening), sets ``notified`` and ``wake``. Polling stays the fallback; behind a
pooler in transaction mode the relay runs with ``listen=False`` and this thread is not
started.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import psycopg

from outbox.relay.links import Link


def listen(
    make_link: Callable[..., Link],
    finished: threading.Event,
    notified: threading.Event,
    wake: threading.Event,
) -> None:
    """Listen until ``finished`` is set."""
    link = make_link("listen", autocommit=True, prepare=False)
    while not finished.is_set():
        try:
            conn = link.get()
            conn.execute("LISTEN outbox_ready")
            link.ok()
            notified.set()
            wake.set()
            while not finished.is_set():
                for _ in conn.notifies(timeout=0.5):
                    notified.set()
                    wake.set()
        except psycopg.Error as err:
            finished.wait(link.failed(err))
    link.close()
