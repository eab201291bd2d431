"""A failing model falls back, a circuit per base URL stops sending to a dead server, and
routing rules pinned per run pick the model of each step: real relays, two scripted model
servers over HTTP, a real PostgreSQL."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx2
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from outbox import context, lifecycle, registry, routing, writer
from outbox.schemas import StartRun
from outbox.testing.scripted_model import ScriptedModel
from outbox.testing.tools import FakeToolService
from tests.helpers import free_port
from tests.relay_harness import look, register_tool, relay_thread, scalar, wait_until

TENANT = "acme"
KINDS = ("model_turn", "tool_call", "deliver_batch")
TICKET = {"name": "create_ticket", "arguments": {"title": "broken order"}}
APPROVE = {"name": "approve", "arguments": {}}
TWO_TURNS = [{"tool_calls": [TICKET]}, {"text": "done"}]


@pytest.fixture
def primary() -> Iterator[ScriptedModel]:
    with ScriptedModel({"work": TWO_TURNS}) as server:
        yield server


@pytest.fixture
def backup() -> Iterator[ScriptedModel]:
    with ScriptedModel({"work": TWO_TURNS}) as server:
        yield server


@pytest.fixture
def setup(db_url: str) -> Iterator[str]:
    with FakeToolService() as service, psycopg.connect(db_url) as conn:
        register_tool(conn, service, "create_ticket", "lookup")
        registry.register(
            conn,
            registry.ToolSpec(name="approve", executor="client", json_schema={"type": "object"}),
        )
        conn.commit()
        yield db_url


def configure(db_url: str, **kw: Any) -> None:
    """``routing.set_fallback`` / ``set_circuit`` / ``set_routes`` as an operator would."""
    with psycopg.connect(db_url) as conn:
        if "fallback" in kw:
            model, to_model, options = kw["fallback"]
            routing.set_fallback(conn, model, to_model, **options)
        if "circuit" in kw:
            url, options = kw["circuit"]
            routing.set_circuit(conn, url, **options)
        if "routes" in kw:
            routing.set_routes(conn, TENANT, kw["routes"])
        conn.commit()


def start(db_url: str, server: ScriptedModel, script: str = "work", **kw: Any) -> uuid.UUID:
    with psycopg.connect(db_url) as conn:
        thread = writer.create_thread(conn, TENANT).id
        run = writer.start_run(
            conn,
            StartRun(
                tenant_id=TENANT,
                thread_id=thread,
                model=kw.pop("model", "primary-1"),
                message=f"script:{script} go",
                tools=kw.pop("tools", ["create_ticket"]),
                base_url=server.url + "/v1",
                **kw,
            ),
        )
        conn.commit()
    return run.id


def status(db_url: str, run_id: uuid.UUID) -> str:
    return str(scalar(db_url, "SELECT status FROM outbox.runs WHERE id = %s", [run_id]))


def all_completed(db_url: str, run_ids: list[uuid.UUID]) -> bool:
    done = scalar(
        db_url,
        "SELECT count(*) FROM outbox.runs WHERE id = ANY(%s) AND status = 'completed'",
        [run_ids],
    )
    return bool(done == len(run_ids))


def turns(db_url: str, run_id: uuid.UUID) -> list[tuple[int, str, str]]:
    """(step, model, base_url) of each recorded turn of a run."""
    return [
        (int(r[0]), str(r[1]), str(r[2]))
        for r in look(
            db_url,
            "SELECT step_no, model, base_url FROM outbox.model_turns WHERE run_id = %s "
            "ORDER BY step_no",
            [run_id],
        )
    ]


def one_turn_per_step(db_url: str) -> None:
    repeated = scalar(
        db_url,
        "SELECT count(*) FROM (SELECT run_id, step_no FROM outbox.model_turns "
        "GROUP BY 1, 2 HAVING count(*) > 1) d",
    )
    assert repeated == 0


def routes_journaled(db_url: str, run_id: uuid.UUID) -> list[dict[str, Any]]:
    return [
        r[0]
        for r in look(
            db_url,
            "SELECT detail->'route' FROM outbox.journal WHERE run_id = %s "
            "AND event = 'model_turn.recorded' ORDER BY id",
            [run_id],
        )
    ]


def events(db_url: str, event: str) -> int:
    return int(scalar(db_url, "SELECT count(*) FROM outbox.journal WHERE event = %s", [event]))


def test_a_primary_answering_503_moves_runs_to_the_fallback(setup, primary, backup):
    configure(
        setup,
        fallback=(
            "primary-1",
            "backup-1",
            {"to_base_url": backup.url + "/v1", "after_attempts": 2},
        ),
        circuit=(primary.url + "/v1", {"open_after": 1000}),  # only attempts move them here
    )
    primary.down(503)
    runs = [start(setup, primary) for _ in range(3)]
    with relay_thread(setup, kinds=KINDS):
        wait_until(lambda: all_completed(setup, runs), what="every run on the fallback")
    one_turn_per_step(setup)
    for run_id in runs:
        assert turns(setup, run_id) == [
            (1, "backup-1", backup.url + "/v1"),
            (2, "backup-1", backup.url + "/v1"),
        ]
        for route in routes_journaled(setup, run_id):
            assert route["reason"] == "fallback"
            assert route["primary"] == "primary-1"
            assert route["after_failures"] >= 2
    assert all(r.status == 503 for r in primary.requests)
    assert len(backup.requests) == 6  # one answer per step: nothing sent twice


def test_metrics_name_the_model_that_answered_after_a_fallback(setup, primary, backup):
    """Tokens, cached tokens and turn latencies are labelled by the model each call went
    to: the fallback's answers as the fallback's, the primary's 503s as the primary's."""
    configure(
        setup,
        fallback=("primary-1", "backup-1", {"to_base_url": backup.url + "/v1"}),
        circuit=(primary.url + "/v1", {"open_after": 1000}),
    )
    primary.down(503)
    run_id = start(setup, primary)
    port = free_port()
    with relay_thread(setup, kinds=KINDS, metrics_port=port):
        wait_until(lambda: all_completed(setup, [run_id]), what="the run on the fallback")
        text = httpx2.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }

    def sample(name: str, **labels: str) -> float | None:
        return samples.get((name, tuple(sorted({"tenant": TENANT, **labels}.items()))))

    answered = [r for r in backup.requests if r.status == 200]
    sent = sum(r.response["usage"]["input_tokens"] for r in answered)
    assert sample("outbox_relay_tokens_total", model="backup-1", type="input") == sent
    for kind in ("input", "output", "cached_input"):
        assert sample("outbox_relay_tokens_total", model="primary-1", type=kind) is None
    assert sample("outbox_relay_tokens_total", model="backup-1", type="cached_input") is not None
    turn = "outbox_relay_model_turn_seconds_count"
    assert sample(turn, model="backup-1", outcome="turn") == 2
    assert sample(turn, model="primary-1", outcome="turn") is None
    assert (sample(turn, model="primary-1", outcome="retry") or 0) >= 2


def test_the_prompt_cache_key_switch_is_the_model_the_turn_goes_to(setup, primary, backup):
    """A fallback whose server refuses the field (its catalogue row says ``never``) gets no
    prompt_cache_key, while the primary's requests carried the derived one."""
    configure(
        setup,
        fallback=("primary-1", "backup-1", {"to_base_url": backup.url + "/v1"}),
        circuit=(primary.url + "/v1", {"open_after": 1000}),
    )
    with psycopg.connect(setup) as conn:
        context.set_model(
            conn, "backup-1", context_window=32_768, max_output=4096, prompt_cache_key="never"
        )
        conn.commit()
    primary.down(503)
    run_id = start(setup, primary)
    with relay_thread(setup, kinds=KINDS):
        wait_until(lambda: all_completed(setup, [run_id]), what="the run on the fallback")
    assert primary.requests and all(
        str(r.body["prompt_cache_key"]).startswith("outbox-") for r in primary.requests
    )
    assert len(backup.requests) == 2
    assert all("prompt_cache_key" not in r.body for r in backup.requests)


def test_a_retry_after_sends_the_turn_to_the_fallback_instead_of_waiting(setup, primary, backup):
    configure(
        setup,
        fallback=(
            "primary-1",
            "backup-1",
            {"to_base_url": backup.url + "/v1", "after_attempts": 9},
        ),
        circuit=(primary.url + "/v1", {"open_after": 1000}),
    )
    primary.fail_next(1, status=429, retry_after_s=120)
    run_id = start(setup, primary)
    with relay_thread(setup, kinds=KINDS):
        # Far sooner than the 120 s the primary asked for: the fallback took the turn.
        wait_until(lambda: status(setup, run_id) == "completed", timeout_s=60)
    assert [model for _, model, _ in turns(setup, run_id)] == ["backup-1", "backup-1"]
    assert [r["reason"] for r in routes_journaled(setup, run_id)] == ["retry_after"] * 2
    assert [r.status for r in primary.requests] == [429]


def retry_delays(db_url: str, run_id: uuid.UUID) -> list[float]:
    """The delay of each retry of the run's turns, as journaled."""
    return [
        float(r[0])
        for r in look(
            db_url,
            "SELECT (detail->>'delay_s')::float8 FROM outbox.journal WHERE run_id = %s "
            "AND event = 'model_turn.retry_scheduled' ORDER BY id",
            [run_id],
        )
    ]


@pytest.mark.parametrize("moved_by", ["attempts", "circuit"])
def test_a_turn_whose_next_attempt_goes_to_the_fallback_is_retried_at_once(
    setup, primary, backup, moved_by
):
    after, open_after = (1, 1000) if moved_by == "attempts" else (1000, 1)
    configure(
        setup,
        fallback=(
            "primary-1",
            "backup-1",
            {"to_base_url": backup.url + "/v1", "after_attempts": after},
        ),
        circuit=(primary.url + "/v1", {"open_after": open_after, "cool_down_s": 3600}),
    )
    primary.down(503)
    run_id = start(setup, primary)
    # A backoff of an hour: the run completes only if its retries skip it.
    with relay_thread(setup, kinds=KINDS, retry_base_s=3600, retry_cap_s=3600):
        wait_until(lambda: status(setup, run_id) == "completed", what="the run on the fallback")
    delays = retry_delays(setup, run_id)
    assert delays and set(delays) == {0.0}
    assert [model for _, model, _ in turns(setup, run_id)] == ["backup-1", "backup-1"]
    one_turn_per_step(setup)


def test_a_turn_whose_next_attempt_may_go_back_to_its_server_backs_off(setup, primary, backup):
    configure(
        setup,
        fallback=(
            "primary-1",
            "backup-1",
            {"to_base_url": backup.url + "/v1", "after_attempts": 3},
        ),
        circuit=(primary.url + "/v1", {"open_after": 1000}),
    )
    primary.fail_next(1, status=503, retry_after_s=0)  # no Retry-After to honour
    run_id = start(setup, primary)
    with relay_thread(setup, kinds=KINDS, retry_base_s=0.2):
        wait_until(lambda: status(setup, run_id) == "completed")
    delays = retry_delays(setup, run_id)
    assert len(delays) == 1 and delays[0] > 0  # the primary gets its backoff to recover
    assert [model for _, model, _ in turns(setup, run_id)] == ["primary-1", "primary-1"]
    assert backup.requests == []


def test_a_bad_request_fails_the_run_without_falling_back(setup, primary, backup):
    configure(
        setup,
        fallback=(
            "primary-1",
            "backup-1",
            {"to_base_url": backup.url + "/v1", "after_attempts": 1},
        ),
    )
    primary.fail_next(1, status=400)
    run_id = start(setup, primary)
    with relay_thread(setup, kinds=KINDS):
        wait_until(lambda: status(setup, run_id) == "failed")
    assert scalar(setup, "SELECT failure_reason FROM outbox.runs") == "model_error"
    assert backup.requests == []


@pytest.mark.parametrize("relays", [1, 2])
def test_the_circuit_opens_stops_sending_and_a_probe_closes_it(setup, primary, backup, relays):
    url = primary.url + "/v1"
    configure(
        setup,
        fallback=(
            "primary-1",
            "backup-1",
            {"to_base_url": backup.url + "/v1", "after_attempts": 1000},  # only the circuit
        ),
        circuit=(url, {"open_after": 3, "window_s": 60, "cool_down_s": 3600}),
    )
    primary.down(503)
    with contextlib.ExitStack() as stack:
        for _ in range(relays):
            stack.enter_context(relay_thread(setup, kinds=KINDS))
        first = [start(setup, primary) for _ in range(6)]
        wait_until(lambda: all_completed(setup, first), what="the runs on the fallback")
        assert scalar(setup, "SELECT state FROM outbox.model_circuits") == "open"
        assert events(setup, "model.circuit_opened") == 1
        # While it is open, no request reaches the dead server: the fallback answers.
        sent = len(primary.requests)
        assert sent >= 3
        later = [start(setup, primary) for _ in range(4)]
        wait_until(lambda: all_completed(setup, later), what="the runs while the circuit is open")
        assert len(primary.requests) == sent
        for run_id in later:
            assert {model for _, model, _ in turns(setup, run_id)} == {"backup-1"}
            assert all(r["reason"] == "circuit_open" for r in routes_journaled(setup, run_id))
        # The server is back and the cool-down over: one probe goes, its answer closes it.
        primary.up()
        configure(setup, circuit=(url, {"cool_down_s": 0.2}))
        probing = [start(setup, primary) for _ in range(3)]
        wait_until(lambda: all_completed(setup, probing), what="the runs after the cool-down")
        wait_until(lambda: scalar(setup, "SELECT state FROM outbox.model_circuits") == "closed")
        assert events(setup, "model.circuit_probe") == 1
        assert events(setup, "model.circuit_closed") == 1
        back = start(setup, primary)
        wait_until(lambda: status(setup, back) == "completed")
    assert [model for _, model, _ in turns(setup, back)] == ["primary-1", "primary-1"]
    assert routes_journaled(setup, back) == [None, None]
    one_turn_per_step(setup)


def test_without_a_fallback_turns_wait_unsent_while_the_circuit_is_open(setup, primary):
    url = primary.url + "/v1"
    configure(setup, circuit=(url, {"open_after": 1, "cool_down_s": 2}))
    primary.down(503)
    with relay_thread(setup, kinds=KINDS):
        first = start(setup, primary)
        wait_until(lambda: events(setup, "model.circuit_opened") == 1)
        sent = len(primary.requests)
        waiting = start(setup, primary)

        def deferred() -> bool:
            return bool(
                scalar(
                    setup,
                    "SELECT count(*) FROM outbox.journal WHERE run_id = %s "
                    "AND event = 'model_turn.retry_scheduled' "
                    "AND detail->>'error' LIKE 'model servers unavailable (circuit open)%%'",
                    [waiting],
                )
            )

        wait_until(deferred, what="the second run's turn waiting, unsent")
        assert len(primary.requests) == sent
        primary.up()  # back: after the cool-down a waiting turn probes and closes it
        wait_until(lambda: all_completed(setup, [first, waiting]), timeout_s=60)
    assert events(setup, "model.circuit_closed") == 1
    assert scalar(setup, "SELECT count(*) FROM outbox.outbox WHERE status = 'quarantined'") == 0
    one_turn_per_step(setup)


def test_a_responses_model_falls_back_to_chat_completions_with_its_history(setup, primary, backup):
    def first_then_down(history: Any) -> dict[str, Any]:
        primary.down(503)  # the provider dies right after its first answer
        return {"tool_calls": [TICKET, TICKET], "reasoning": True}

    primary.add_script("cross", [first_then_down, {"tool_calls": [TICKET]}, {"text": "x"}])
    backup.add_script("cross", [{"text": "never"}, {"tool_calls": [TICKET]}, {"text": "done"}])
    configure(
        setup,
        fallback=(
            "primary-1",
            "backup-chat",
            {"to_base_url": backup.url + "/v1", "to_api": "chat", "after_attempts": 1},
        ),
    )
    run_id = start(setup, primary, "cross", api="responses")
    with relay_thread(setup, kinds=KINDS):
        wait_until(lambda: status(setup, run_id) == "completed")
    assert turns(setup, run_id) == [
        (1, "primary-1", primary.url + "/v1"),
        (2, "backup-chat", backup.url + "/v1"),
        (3, "backup-chat", backup.url + "/v1"),
    ]
    answered = [r for r in backup.requests if r.status == 200]
    assert [r.endpoint for r in answered] == ["chat.completions", "chat.completions"]
    # The chat server (strict like OpenAI) took the Responses turn's calls and results as
    # its own history: each call answered, in order, no reasoning item.
    second = answered[0].body["messages"]
    assert [m["role"] for m in second] == ["user", "assistant", "tool", "tool"]
    assert len(second[1]["tool_calls"]) == 2
    assert [m["role"] for m in answered[1].body["messages"]][-2:] == ["assistant", "tool"]
    assert scalar(setup, "SELECT content FROM outbox.messages ORDER BY seq DESC LIMIT 1") == "done"


def test_routing_rules_pick_the_model_per_step_and_are_pinned_per_run(setup, primary, backup):
    script = [{"tool_calls": [APPROVE]}, {"text": "done"}]
    primary.add_script("ask", script)
    backup.add_script("ask", script)
    configure(
        setup,
        routes=[
            {"first_turn": True, "model": "planner", "base_url": primary.url + "/v1"},
            {"after_tool_results": True, "model": "worker", "base_url": backup.url + "/v1"},
        ],
    )
    run_id = start(setup, primary, "ask", tools=["approve"], model="own-model")
    with relay_thread(setup, kinds=KINDS):
        wait_until(lambda: status(setup, run_id) == "requires_action")
        # A new version mid-run: the running run keeps the rules it started with.
        configure(setup, routes=[{"model": "everything", "base_url": primary.url + "/v1"}])
        with psycopg.connect(setup) as conn:
            (call,) = lifecycle.pending_client_calls(conn, run_id)
            outputs = [{"tool_call_id": call["tool_call_id"], "output": {"ok": True}}]
            lifecycle.submit_tool_outputs(conn, TENANT, run_id, outputs)
            conn.commit()
        wait_until(lambda: status(setup, run_id) == "completed")
        newer = start(setup, primary, "ask", tools=["approve"], model="own-model")
        wait_until(lambda: status(setup, newer) == "requires_action")
    assert turns(setup, run_id) == [
        (1, "planner", primary.url + "/v1"),
        (2, "worker", backup.url + "/v1"),
    ]
    assert [r["rule"] for r in routes_journaled(setup, run_id)] == [0, 1]
    assert {r["version"] for r in routes_journaled(setup, run_id)} == {1}
    assert turns(setup, newer) == [(1, "everything", primary.url + "/v1")]
    assert routes_journaled(setup, newer)[0]["version"] == 2
    # Servers that only answered have no circuit row: the happy path writes none.
    assert scalar(setup, "SELECT count(*) FROM outbox.model_circuits") == 0


def test_the_cli_sets_fallbacks_circuits_and_routes(db_url, monkeypatch):
    from click.testing import CliRunner

    import cli

    monkeypatch.setenv("OUTBOX_DATABASE_URL", db_url)

    def outbox(*args: str, code: int = 0) -> str:
        done = CliRunner().invoke(cli.main, ["models", *args])
        assert done.exit_code == code, done.output
        return done.output

    said = outbox(
        "fallback", "gpt-x", "--to", "small", "--base-url", "http://b/v1", "--api", "chat"
    )
    assert "gpt-x falls back to small at http://b/v1 over chat after 2 failures" in said
    assert "small" in outbox("fallbacks")
    assert "--to MODEL is required" in outbox("fallback", "gpt-x", code=2)
    said = outbox("circuit", "http://a/v1/", "--open-after", "3", "--cool-down", "2")
    assert (
        said.strip() == "http://a/v1: closed, opens after 3 failures within 10 s, probed after 2 s"
    )
    assert json.loads(outbox("circuits", "--json"))[0]["open_after"] == 3
    rules = '[{"first_turn": true, "model": "big"}, {"after_tool_results": true, "model": "s"}]'
    assert "acme: routing rules version 1 (2 rules)" in outbox("route", "acme", "--rules", rules)
    assert "version 2" in outbox("route", "acme", "--rules", "[]")
    assert "Extra inputs are not permitted" in outbox(
        "route", "acme", "--rules", '[{"model": "m", "when": 1}]', code=2
    )
    assert [r["version"] for r in json.loads(outbox("routes", "--tenant", "acme", "--json"))] == [
        1,
        2,
    ]
    assert "gpt-x has no fallback" in outbox("fallback", "gpt-x", "--remove")
