"""A live ``outbox serve`` app for tests, and the fixtures every test of it shares.

The app is the one ``outbox serve`` runs (``outbox.server.app.create_app``), served by uvicorn
over real sockets in a thread, so the openai SDK talks to it exactly as it would in
production. ``tests/conftest.py`` loads this module as a plugin: its fixtures (``model``,
``service``, ``api_keys``, ``api_key``, ``base_url``, ``sdk``, ``other``, ``relay``) are
there for every test by name, and a test module that needs more (another script)
overrides one of them with a fixture of the same name that asks for it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx2
import openai
import psutil
import psycopg
import pytest
import uvicorn

from outbox import keys
from outbox.server.app import create_app
from outbox.testing.scripted_model import ScriptedModel
from outbox.testing.tools import FakeToolService
from tests.helpers import free_port
from tests.relay_harness import REPO, register_tool, relay_thread, wait_until

START_TIMEOUT_S = 20.0  # seconds the server gets to start listening
TENANTS = ("acme", "globex")  # the two tenants with a key: ``sdk`` acts for the first
ALL_KINDS = ("model_turn", "tool_call", "deliver_batch")
EMAIL = {"name": "send_email", "arguments": {"to": "a@b.c", "subject": "order 42"}}
APPROVE = {"name": "approve_refund", "arguments": {"order_id": "42"}}


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


# ``outbox serve``'s app in a process of its own, for a test that pauses or kills it (a
# pause of the test's own process would stop the test), with a short idle bound so the
# test need not wait out the default 10 s.
SERVE_PROCESS = """
import sys, uvicorn
from outbox.server.app import create_app
url, model, port, bound = sys.argv[1:]
app = create_app(url, model_base_url=model, idle_in_transaction_s=float(bound))
uvicorn.run(app, host="127.0.0.1", port=int(port), log_level="warning")
"""


def serve_process(
    database_url: str,
    model_base_url: str,
    port: int,
    log: Path,
    *,
    idle_in_transaction_s: float = 1.0,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """The app serving on ``port`` in a process of its own, its output appended to
    ``log``; returns once it answers."""
    args = [database_url, model_base_url, str(port), str(idle_in_transaction_s)]
    with open(log, "ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-c", SERVE_PROCESS, *args],
            env={**os.environ, **(env or {})},
            cwd=REPO,
            stdout=out,
            stderr=out,
        )
    base = f"http://127.0.0.1:{port}/v1"

    def started() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited ({process.returncode}): see {log}")
        return answers(base)

    try:
        wait_until(started, timeout_s=START_TIMEOUT_S * 3, what=f"the server to answer on {port}")
    except TimeoutError as err:  # what the process was doing: running, sleeping, stopped
        raise TimeoutError(
            f"{err} (pid {process.pid}: {psutil.Process(process.pid).status()})"
        ) from None
    return process


def answers(base_url: str) -> bool:
    """Whether a server answers on ``base_url`` (anything but a 5xx)."""
    try:
        return httpx2.get(base_url + "/models", timeout=5).status_code < 500
    except httpx2.TransportError:
        return False


def client(base_url: str, key: str, **options: object) -> openai.OpenAI:
    """The openai SDK on ``base_url`` with ``key``; a refused request is never retried."""
    return openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, **options)  # type: ignore[arg-type]


@pytest.fixture
def model() -> Iterator[ScriptedModel]:
    """The scripted model: "hello" by default; ``script:email`` has the registered tool
    send_email called, then says "mail sent"; ``script:approve`` asks for the client tool
    approve_refund, then says "refund approved"."""
    with ScriptedModel(default=[{"text": "hello"}]) as server:
        server.add_script("email", [{"tool_calls": [EMAIL]}, {"text": "mail sent"}])
        server.add_script("approve", [{"tool_calls": [APPROVE]}, {"text": "refund approved"}])
        yield server


@pytest.fixture
def service() -> Iterator[FakeToolService]:
    with FakeToolService() as svc:
        yield svc


@pytest.fixture
def api_keys(db_url: str, service: FakeToolService) -> dict[str, str]:
    """A key for each of ``TENANTS``, and the tool send_email registered at ``service``."""
    with psycopg.connect(db_url) as conn:
        register_tool(conn, service, "send_email", "key")
        made = {t: keys.create_key(conn, t, name="test")[1] for t in TENANTS}
        conn.commit()
    return made


@pytest.fixture
def api_key(api_keys: dict[str, str]) -> str:
    """The first tenant's key."""
    return api_keys[TENANTS[0]]


@pytest.fixture
def base_url(db_url: str, model: ScriptedModel, api_keys: dict[str, str]) -> Iterator[str]:
    """``outbox serve`` on the test's database, its models answered by ``model``."""
    with serve(db_url, model_base_url=model.url + "/v1") as url:
        yield url


@pytest.fixture
def sdk(base_url: str, api_keys: dict[str, str]) -> Iterator[openai.OpenAI]:
    """The openai SDK acting for the first tenant."""
    with client(base_url, api_keys[TENANTS[0]]) as acting:
        yield acting


@pytest.fixture
def other(base_url: str, api_keys: dict[str, str]) -> Iterator[openai.OpenAI]:
    """The openai SDK acting for the second tenant."""
    with client(base_url, api_keys[TENANTS[1]]) as acting:
        yield acting


@pytest.fixture
def relay(db_url: str) -> Iterator[None]:
    """A relay (in a thread) running every kind of row on the test's database."""
    with relay_thread(db_url, kinds=ALL_KINDS):
        yield
