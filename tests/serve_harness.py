"""A live ``outbox serve`` app for tests: uvicorn on a free loopback port, in a thread.

The app is the one ``outbox serve`` runs (``outbox.server.app.create_app``), served by uvicorn over
real sockets, so the openai SDK talks to it exactly as it would in production.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn

from outbox.server.app import create_app

START_TIMEOUT_S = 20.0  # seconds the server gets to start listening


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def serve(database_url: str, **options: object) -> Iterator[str]:
    """Serve the app on ``database_url`` for the block; yields its base URL (``.../v1``)."""
    port = free_port()
    app = create_app(database_url, **options)  # type: ignore[arg-type]
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="outbox-serve-under-test")
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("outbox serve did not start")
        time.sleep(0.02)  # polling interval of a condition with a deadline
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
