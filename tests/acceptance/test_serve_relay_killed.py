"""A relay killed mid-run behind ``outbox serve``: the client's event stream resumes and the
run completes once.

A client starts a run through the openai SDK and follows it on ``GET /v1/runs/{id}/events``.
The relay (a process of its own) is ``kill -9``ed while the run's tool call is in flight, and
the client's stream breaks off; the client reconnects with ``Last-Event-ID``, a new relay
starts, and the run completes: the tool's own audit shows one side effect, the resumed
stream repeats no event of the first, and the two together are the run's journal.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx2
import openai
import psycopg
import pytest

from outbox import keys
from outbox.testing.scripted_model import ScriptedModel
from outbox.testing.tools import FakeToolService
from tests.relay_harness import register_tool, scalar, start_relay_process, wait_until
from tests.serve_harness import serve

pytestmark = [
    pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:The Assistants API is deprecated:DeprecationWarning"),
]
KINDS = [a for k in ("model_turn", "tool_call", "deliver_batch") for a in ("--kind", k)]
EMAIL = {"name": "send_email", "arguments": {"to": "a@b.c", "subject": "order 42"}}


def events(response: httpx2.Response) -> Iterator[dict]:
    """The SSE events of ``response`` as dicts of their fields."""
    event: dict[str, str] = {}
    for line in response.iter_lines():
        if not line:
            if event:
                yield event
            event = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            event[name] = value.removeprefix(" ")


def follow(url: str, headers: dict[str, str], into: list[dict]) -> None:
    """Read a run's event stream into ``into`` until it ends."""
    try:
        with httpx2.stream("GET", url, headers=headers, timeout=60) as response:
            for event in events(response):
                into.append(event)
    except httpx2.HTTPError:
        pass  # the server went away at the end of the test


def test_a_killed_relay_costs_the_client_nothing_but_a_reconnect(db_url, tmp_path: Path):
    with FakeToolService() as service, ScriptedModel() as model:
        model.add_script("email", [{"tool_calls": [EMAIL]}, {"text": "mail sent"}])
        service.tool("send_email").latency(4.0, n=1)  # in flight when the relay dies
        with psycopg.connect(db_url) as conn:
            register_tool(conn, service, "send_email", "key")
            _, key = keys.create_key(conn, "acme")
            conn.commit()
        log = tmp_path / "relay.log"
        with serve(db_url, model_base_url=model.url + "/v1") as base_url:
            sdk = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0)
            assistant = sdk.beta.assistants.create(
                model="scripted-1", tools=[{"type": "function", "function": {"name": "send_email"}}]
            )
            run = sdk.beta.threads.create_and_run(
                assistant_id=assistant.id,
                thread={"messages": [{"role": "user", "content": "script:email now"}]},
            )
            url = f"{base_url}/runs/{run.id}/events"
            auth = {"Authorization": f"Bearer {key}"}
            first = start_relay_process(db_url, log, *KINDS, "--lease", "2")
            second = None
            try:
                # Follow the run until its tool call is under way (the tool holds the
                # request 4 s), then kill the relay and keep what the client had seen.
                tool = service.tool("send_email")
                following: list[dict] = []
                reader = threading.Thread(
                    target=follow, args=(url, auth, following), name="client", daemon=True
                )
                reader.start()
                wait_until(
                    lambda: tool.starts and any("id" in e for e in following),
                    what="the tool call to start with events seen",
                )
                first.kill()
                seen = list(following)  # the client's stream breaks off here
                first.wait(timeout=30)
                last_id = [e["id"] for e in seen if "id" in e][-1]
                second = start_relay_process(db_url, log, *KINDS, "--lease", "2")
                with httpx2.stream(
                    "GET", url, headers={**auth, "Last-Event-ID": last_id}, timeout=60
                ) as response:
                    resumed = list(events(response))
            finally:
                for process in (first, second):
                    if process is not None and process.poll() is None:
                        process.kill()
                        process.wait(timeout=30)
            sdk.close()

    assert resumed[-1]["event"] == "end"
    assert json.loads(resumed[-1]["data"])["status"] == "completed"
    assert len(service.tool("send_email").effects) == 1  # retried with the same key
    first_ids = [int(e["id"]) for e in seen if "id" in e]
    resumed_ids = [int(e["id"]) for e in resumed if "id" in e]
    assert resumed_ids and min(resumed_ids) > max(first_ids)  # nothing repeated
    stored = [
        r[0]
        for r in psycopg.connect(db_url).execute(
            "SELECT id FROM outbox.journal WHERE run_id = %s ORDER BY id", [run.id]
        )
    ]
    assert first_ids + resumed_ids == stored  # and nothing lost
    assert scalar(db_url, "SELECT status FROM outbox.runs WHERE id = %s", [run.id]) == "completed"
