"""An ``outbox serve`` process paused in the middle of a request (``SIGSTOP``, a frozen VM)
holds the rows its transaction locked for the server's bound at most, not for as long as
it is paused; once woken, the request is answered 503, nothing of it stored, and its
resend with the same Idempotency-Key is stored once (docs/serve.md, "Errors").

The server is a process of its own (a pause of this one would stop the test), built as
``outbox serve`` builds it, with a bound of 1 s so the test need not wait out the default
10 s. The failpoint ``serve.before_commit:stop`` stops it after the request's statements
and before its commit: the thread's row locked, the run inserted.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx2
import psutil
import psycopg
import pytest

from outbox import keys
from outbox.testing.scripted_model import ScriptedModel
from tests.helpers import free_port, thread_lockable
from tests.relay_harness import relay_thread, scalar, wait_until
from tests.serve_harness import serve_process

BOUND_S = 1.0  # the paused server's idle_in_transaction_s
DEADLINE_S = 60.0  # seconds a request waits for its answer


@pytest.fixture
def paused_server(
    db_url: str, tmp_path: Path
) -> Iterator[tuple[str, subprocess.Popen[bytes], Path]]:
    """A server process armed to stop in its next request's transaction once the file it
    yields exists; its base URL, the process and that file."""
    armed = tmp_path / "pause the next request"
    port = free_port()
    env = {"OUTBOX_FAILPOINT": "serve.before_commit:stop", "OUTBOX_FAILPOINT_WHEN": str(armed)}
    with ScriptedModel(default=[{"text": "hello"}]) as model:
        process = serve_process(
            db_url,
            model.url + "/v1",
            port,
            tmp_path / "serve.log",
            idle_in_transaction_s=BOUND_S,
            env=env,
        )
        try:
            yield f"http://127.0.0.1:{port}/v1", process, armed
        finally:
            process.send_signal(signal.SIGCONT)
            process.terminate()
            process.wait(timeout=60)


def post(base: str, key: str, body: dict[str, Any], idem: str) -> httpx2.Response:
    headers = {"Authorization": f"Bearer {key}", "Idempotency-Key": idem}
    return httpx2.post(base + "/responses", json=body, headers=headers, timeout=DEADLINE_S)


def test_a_server_paused_inside_a_request_holds_its_rows_no_longer_than_its_bound(
    db_url, paused_server
):
    base, server, armed = paused_server
    with psycopg.connect(db_url) as conn:
        key = keys.create_key(conn, "acme", name="test")[1]
        conn.commit()
    with relay_thread(db_url, kinds=("model_turn", "deliver_batch")):
        first = post(base, key, {"model": "scripted-1", "input": "hi"}, "k-1")
        assert first.status_code == 200 and first.json()["status"] == "completed", first.text
        thread = scalar(db_url, "SELECT thread_id FROM outbox.runs")
        body = {"model": "scripted-1", "input": "again", "previous_response_id": first.json()["id"]}
        armed.touch()
        with ThreadPoolExecutor(1) as pool:
            sent = pool.submit(post, base, key, body, "k-2")
            wait_until(
                lambda: psutil.Process(server.pid).status() == psutil.STATUS_STOPPED,
                what="the server to stop inside the second request's transaction",
            )
            # Paused, it holds the conversation: a writer of the same thread would wait.
            assert not thread_lockable(db_url, thread)
            wait_until(
                lambda: thread_lockable(db_url, thread),
                what="the database to end the paused request's session, and its locks",
            )
            assert scalar(db_url, "SELECT count(*) FROM outbox.runs") == 1  # nothing of it
            server.send_signal(signal.SIGCONT)
            refused = sent.result(timeout=DEADLINE_S)
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "database_unavailable"
        assert refused.headers["retry-after"] == "1"
        again = post(base, key, body, "k-2")  # the resend a client makes
        assert again.status_code == 200 and again.json()["status"] == "completed", again.text
        assert post(base, key, body, "k-2").json()["id"] == again.json()["id"]
    assert scalar(db_url, "SELECT count(*) FROM outbox.runs") == 2  # one for each request
