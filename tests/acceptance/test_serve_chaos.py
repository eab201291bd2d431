"""``outbox serve`` stopped and killed at random while its clients wait: every request is
answered, each once, with one run and one effect.

Three clients each send waiting ``responses.create`` requests, one after another, each with
an Idempotency-Key of its own, as a client with retries does: on a broken connection or a
5xx, the same request again. A registry tool sends the e-mail of each run. Meanwhile the
server process (a process of its own, with a 1 s idle bound) is stopped (``SIGSTOP``) for
up to 2 s at a time, mid-request or not, and killed (``kill -9``) and started again on the
same port. The relay runs in the test, untouched: what is tried here is the server's
promise (docs/serve.md): a request stores nothing twice, whatever the moment it broke
off; a stopped server holds no row past its bound; a resend finds what the first made.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx2
import psycopg
import pytest

from outbox import keys
from outbox.testing.scripted_model import ScriptedModel
from outbox.testing.tools import FakeToolService
from tests.helpers import free_port
from tests.relay_harness import register_tool, relay_thread, scalar
from tests.serve_harness import ALL_KINDS, EMAIL, serve_process

CLIENTS = 3
REQUESTS = 2  # a client's at least, one after another: more until the chaos did ROUNDS
ROUNDS = 3  # stops and kills, the first two one of each (a kill costs a start: seconds)
DEADLINE_S = 120.0  # seconds a request may take to be answered, resends included
RESEND_S = 0.2  # a client's pause before it sends a broken request again


class Server:
    """The server process, and the chaos done to it in a thread of its own: a stop (up to
    2 s) or a kill and a start again, at random, until ``close``; the first two are one of
    each. ``close`` ends the chaos before the server, so no start outlives the test."""

    def __init__(self, db_url: str, model_url: str, log: Path, seed: int) -> None:
        self.start = lambda: serve_process(db_url, model_url, self.port, log)
        self.port = free_port()
        self.process = self.start()
        self.done: list[str] = []
        self.failed: list[BaseException] = []
        self.end = threading.Event()
        self.chaos = threading.Thread(target=self._chaos, args=(seed,), daemon=True)
        self.chaos.start()

    def _chaos(self, seed: int) -> None:
        rng = random.Random(seed)
        try:
            while not self.end.wait(rng.uniform(0.2, 0.8)):
                what = (
                    ["stop", "kill"][len(self.done)]
                    if len(self.done) < 2
                    else rng.choice(["stop", "stop", "kill"])
                )
                if what == "stop":
                    self.process.send_signal(signal.SIGSTOP)
                    self.end.wait(rng.uniform(0.2, 2.0))
                    self.process.send_signal(signal.SIGCONT)
                else:
                    self.process.kill()
                    self.process.wait(timeout=30)
                    self.process = self.start()
                self.done.append(what)
        except BaseException as err:  # reported by close, not lost in this thread
            self.failed.append(err)

    def close(self) -> None:
        self.end.set()
        self.chaos.join()  # a start under way ends first (serve_process bounds it)
        self.process.send_signal(signal.SIGCONT)
        self.process.terminate()
        self.process.wait(timeout=60)
        assert self.failed == [], self.failed


def ask(base: str, key: str, body: dict[str, Any], idem: str) -> dict[str, Any]:
    """A waiting create sent until it is answered (a broken connection or a 5xx: again,
    with the same key); the answer."""
    headers = {"Authorization": f"Bearer {key}", "Idempotency-Key": idem}
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        try:
            answer = httpx2.post(base + "/responses", json=body, headers=headers, timeout=30)
        except httpx2.TransportError:
            answer = None
        if answer is not None and answer.status_code < 500:
            assert answer.status_code == 200, answer.text
            return dict(answer.json())
        time.sleep(RESEND_S)  # a client's pause before it sends the request again
    raise TimeoutError(f"request {idem} was not answered in {DEADLINE_S} s")


@pytest.mark.timeout(300)  # a start of the server is seconds on a busy machine
def test_a_server_stopped_and_killed_at_random_answers_each_request_once(db_url, tmp_path):
    with (
        FakeToolService() as service,
        ScriptedModel(default=[{"text": "hello"}]) as model,
    ):
        model.add_script("email", [{"tool_calls": [EMAIL]}, {"text": "mail sent"}])
        with psycopg.connect(db_url) as conn:
            register_tool(conn, service, "send_email", "key")
            key = keys.create_key(conn, "acme", name="test")[1]
            conn.commit()
        server = Server(
            db_url, model.url + "/v1", tmp_path / "serve.log", random.randrange(1 << 30)
        )
        base = f"http://127.0.0.1:{server.port}/v1"
        answers: dict[str, dict[str, Any]] = {}
        errors: list[BaseException] = []

        def client(c: int) -> None:
            try:
                r = 0
                while r < REQUESTS or len(server.done) < ROUNDS:
                    body = {"model": "scripted-1", "input": f"script:email request {c}.{r}"}
                    answers[f"k-{c}-{r}"] = ask(base, key, body, f"k-{c}-{r}")
                    r += 1
            except BaseException as err:  # reported by the test, not lost in its thread
                errors.append(err)

        try:
            with relay_thread(db_url, kinds=ALL_KINDS):
                clients = [threading.Thread(target=client, args=(c,)) for c in range(CLIENTS)]
                for thread in clients:
                    thread.start()
                for thread in clients:
                    thread.join(timeout=DEADLINE_S * (REQUESTS + ROUNDS))
        finally:
            server.close()
    assert errors == []
    assert {"stop", "kill"} <= set(server.done), server.done  # the chaos happened
    asked = len(answers)
    assert asked >= CLIENTS * REQUESTS
    assert {a["status"] for a in answers.values()} == {"completed"}
    assert {a["output"][-1]["content"][0]["text"] for a in answers.values()} == {"mail sent"}
    # One response and one run a request, and one e-mail a run: nothing made twice.
    assert len({a["id"] for a in answers.values()}) == asked
    assert scalar(db_url, "SELECT count(*) FROM outbox.responses") == asked
    assert scalar(db_url, "SELECT count(*) FROM outbox.runs") == asked
    assert len(service.tool("send_email").effects) == asked
    assert service.duplicate_effects() == 0
