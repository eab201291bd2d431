"""A relay process paused (SIGSTOP) while its tool calls are in flight, and woken (SIGCONT)
after their timeout has passed, when the tools had answered in time.

The answers sat in the relay's sockets while it was paused; on waking its timers are due
at once. The relay must read what arrived before it declares a timeout: a ``none`` tool's
call is then a result, not ``outcome_unknown``, and nothing is sent twice; a paused worker
whose lease was taken meanwhile keeps its answer as an orphan (reason ``fenced``), never
applied. Every check reads the fake tool's own audit and the database.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from typing import Any

import psutil
import psycopg
import pytest

from outbox import writer
from outbox.schemas import StartRun
from outbox.testing.scripted_model import ScriptedModel
from outbox.testing.tools import FakeToolService
from tests.forked import Forked
from tests.helpers import TENANT, look
from tests.relay_harness import (
    FAST,
    all_settled,
    register_tool,
    relay_thread,
    scalar,
    seed,
    start_relay_process,
    tool_call_states,
    wait_until,
)

TIMEOUT_S = 3.0  # the tools' timeout
ANSWER_S = 1.5  # how long after a request the tools answer: well within the timeout
TIMED_OUT = "SELECT count(*) FROM outbox.journal WHERE detail::text LIKE '%%Timeout%%'"


@pytest.fixture
def service() -> Iterator[FakeToolService]:
    with FakeToolService(standard_tools=False) as svc:
        yield svc


def tools_answering_in_time(db_url: str, service: FakeToolService, *modes: str) -> list[Any]:
    """A tool of each idempotency mode, answering every request ``ANSWER_S`` after it came
    (then acting and answering at once), with ``TIMEOUT_S`` for a timeout."""
    tools = []
    with psycopg.connect(db_url) as conn:
        for mode in modes:
            tool = service.add_tool(f"{mode}_tool", mode)
            tool.latency(ANSWER_S, n=None)
            register_tool(conn, service, tool.name, mode, timeout_s=TIMEOUT_S)
            tools.append(tool)
        conn.commit()
    return tools


def pause_mid_call(relay: Forked, tools: list[Any], calls: int) -> float:
    """Stop ``relay`` once ``calls`` requests are at the tools, before any is answered;
    when it stopped (``time.time()``)."""
    wait_until(
        lambda: sum(len(tool.starts) for tool in tools) == calls,
        what="every call to be at its tool",
    )
    relay.send_signal(signal.SIGSTOP)
    return time.time()


def answered_while_paused(tools: list[Any], calls: int, paused_at: float) -> None:
    """Every request answered, each after the relay stopped: the answers sit in its sockets.
    Then the tools' timeout passes, from the last request's arrival."""
    wait_until(
        lambda: sum(len(t.effects) for t in tools) == calls and not any(t.in_flight for t in tools),
        what="the tools to answer",
    )
    effects = [effect for tool in tools for effect in tool.effects]
    assert min(effect.at for effect in effects) > paused_at, "paused after an answer came"
    last = max(start for tool in tools for start in tool.starts)
    wait_until(
        lambda: time.monotonic() > last + TIMEOUT_S + 1.0,
        timeout_s=TIMEOUT_S + 10.0,
        what="the tools' timeout to pass",
    )


def test_a_relay_paused_past_the_timeout_uses_the_answers_that_came_in_time(
    db_url, service, tmp_path
):
    tools = tools_answering_in_time(db_url, service, "none", "key")
    calls = 6
    seed(db_url, [t.name for t in tools], runs=1, calls_per_batch=calls, args=lambda n: {"n": n})
    # A lease longer than the pause: this relay, and no other, finishes the calls.
    args = [*FAST[2:], "--lease", "30"]
    relay = start_relay_process(db_url, tmp_path / "relay.log", *args)
    try:
        paused_at = pause_mid_call(relay, tools, calls)
        answered_while_paused(tools, calls, paused_at)
        relay.send_signal(signal.SIGCONT)
        wait_until(lambda: all_settled(db_url), what="the calls to finish")
    finally:
        relay.send_signal(signal.SIGCONT)
        relay.terminate()
        relay.wait(timeout=30)
    assert tool_call_states(db_url) == {"succeeded": calls}
    for tool in tools:  # each call delivered once, and its result is the tool's answer
        assert len(tool.deliveries) == len(tool.effects) == calls // 2
    results = "SELECT count(*) FROM outbox.tool_results WHERE attempt = 1 AND output IS NOT NULL"
    assert scalar(db_url, results) == calls
    assert scalar(db_url, TIMED_OUT) == 0


def test_a_fenced_relay_paused_past_the_timeout_keeps_its_answer_as_an_orphan(
    db_url, service, tmp_path
):
    [tool] = tools_answering_in_time(db_url, service, "key")
    seed(db_url, [tool.name], runs=1, calls_per_batch=1, args=lambda n: {"n": n})
    first = start_relay_process(db_url, tmp_path / "relay.log", *FAST)  # a 2 s lease
    try:
        paused_at = pause_mid_call(first, [tool], 1)
        answered_while_paused([tool], 1, paused_at)
        tool.clear_faults()  # the second attempt is answered at once, from the tool's key
        with relay_thread(db_url):  # takes the row once the paused lease has expired
            wait_until(lambda: all_settled(db_url), what="a second relay to finish the call")
        first.send_signal(signal.SIGCONT)
        wait_until(
            lambda: scalar(db_url, "SELECT count(*) FROM outbox.orphaned_results"),
            what="the paused relay's answer to be kept as an orphan",
        )
    finally:
        first.send_signal(signal.SIGCONT)
        first.kill()
        first.wait(timeout=30)
    [effect] = tool.effects
    assert scalar(db_url, "SELECT attempt FROM outbox.tool_results") > 1
    orphan = "SELECT reason, status, attempt, output FROM outbox.orphaned_results"
    [(reason, status, attempt, output)] = look(db_url, orphan)
    assert (reason, status, attempt) == ("fenced", "ok", 1)
    assert output == effect.result
    assert scalar(db_url, TIMED_OUT) == 0


def test_a_relay_paused_past_the_models_timeout_uses_the_answer_that_came_in_time(db_url, tmp_path):
    """A model turn goes through the same client: the model's answer, in the socket when
    the paused relay wakes past the timeout, is the turn; the model is not asked again."""
    with ScriptedModel(default=[{"text": "hello"}]) as model:
        model.set_faults(latency_s=ANSWER_S)
        with psycopg.connect(db_url) as conn:
            thread = writer.create_thread(conn, TENANT)
            start = StartRun(
                tenant_id=TENANT,
                thread_id=thread.id,
                model="scripted-1",
                message="hi",
                tools=[],
                base_url=model.url + "/v1",
            )
            run = writer.start_run(conn, start).id
            conn.commit()
        port = int(model.url.rsplit(":", 1)[1])
        env = {"OUTBOX_MODEL_TIMEOUT_S": str(TIMEOUT_S)}
        args = ["--kind", "model_turn", *FAST[2:], "--lease", "30"]
        relay = start_relay_process(db_url, tmp_path / "relay.log", *args, env=env)
        try:
            wait_until(
                lambda: any(
                    c.raddr and c.raddr.port == port
                    for c in psutil.Process(relay.pid).net_connections("tcp")
                ),
                what="the model request to be sent",
            )
            relay.send_signal(signal.SIGSTOP)
            paused_at = time.time()
            wait_until(lambda: model.requests, what="the model to answer the paused relay")
            assert model.requests[0].at > paused_at, "paused after the answer came"
            wait_until(
                lambda: time.time() > paused_at + TIMEOUT_S + 1.0,
                timeout_s=TIMEOUT_S + 10.0,
                what="the model's timeout to pass",
            )
            relay.send_signal(signal.SIGCONT)
            completed = "SELECT status FROM outbox.runs WHERE id = %s"
            wait_until(
                lambda: scalar(db_url, completed, [run]) == "completed", what="the run to end"
            )
        finally:
            relay.send_signal(signal.SIGCONT)
            relay.terminate()
            relay.wait(timeout=30)
        assert len(model.requests) == 1
    assert scalar(db_url, TIMED_OUT) == 0
