"""``outbox.routing.choose``: routing rules, fallback chains and open circuits, without a
server (the integration tests run them through relays: tests/integration/test_model_fallback.py)."""

from __future__ import annotations

from typing import Any

import pytest

from outbox import routing
from outbox.routing import Circuit, Step

RUN = {"model": "big", "base_url": "http://a/v1", "api": "responses", "route_version": 3}
FALLBACKS = {
    "big": {"to_model": "mid", "to_base_url": "http://b/v1", "to_api": "chat", "after_attempts": 2},
    "mid": {"to_model": "small", "to_base_url": None, "to_api": None, "after_attempts": 1},
}
FIRST = Step(1, after_tools=False)


def choose(failures: int = 0, circuits: dict[str, Circuit] | None = None, **kw: Any) -> Any:
    probes: list[str] = kw.pop("probes", [])
    return routing.choose(
        RUN,
        kw.pop("step", FIRST),
        failures,
        kw.pop("rules", None),
        kw.pop("fallbacks", FALLBACKS),
        circuits or {},
        lambda url: url in probes,
    )


def test_the_runs_own_model_on_a_first_attempt_is_no_route():
    choice = choose()
    assert choice.target == routing.Target("big", "http://a/v1", "responses")
    assert choice.route is None


@pytest.mark.parametrize(
    ("failures", "model", "url", "api"),
    [
        (1, "big", "http://a/v1", "responses"),
        (2, "mid", "http://b/v1", "chat"),
        (3, "small", "http://b/v1", "chat"),  # the chain's next link, after one more
        (50, "small", "http://b/v1", "chat"),  # the last link keeps the turn
    ],
)
def test_failed_attempts_walk_down_the_chain(failures, model, url, api):
    choice = choose(failures)
    assert choice.target == routing.Target(model, url, api)
    if model != "big":
        assert choice.route == {"reason": "fallback", "after_failures": failures, "primary": "big"}


def test_an_open_circuit_skips_to_the_fallback_or_waits_without_one():
    circuits = {"http://a/v1": Circuit("open", 5, probe_due=False, wait_s=3.0)}
    choice = choose(0, circuits)
    assert choice.target is not None and choice.target.model == "mid"
    assert choice.route == {"reason": "circuit_open", "skipped": ["http://a/v1"], "primary": "big"}
    alone = choose(0, circuits, fallbacks={})
    assert alone.target is None and alone.wait_s == 3.0


def test_a_due_probe_is_sent_by_whoever_takes_it():
    circuits = {"http://a/v1": Circuit("open", 5, probe_due=True)}
    taken = choose(0, circuits, probes=["http://a/v1"])
    assert taken.probe and taken.target is not None and taken.target.model == "big"
    missed = choose(0, circuits)
    assert not missed.probe and missed.target is not None and missed.target.model == "mid"


def test_rules_pick_the_first_match_by_step():
    rules = [
        {"first_turn": True, "model": "planner"},
        {"after_tool_results": True, "min_turn": 3, "model": "worker", "api": "chat"},
        {"max_tokens_left": 100, "model": "cheap", "base_url": "http://c/v1/"},
    ]
    assert choose(rules=rules).target.model == "planner"
    worker = choose(rules=rules, step=Step(3, after_tools=True)).target
    assert worker == routing.Target("worker", "http://a/v1", "chat")
    assert choose(rules=rules, step=Step(2, after_tools=True)).target.model == "big"
    cheap = choose(rules=rules, step=Step(2, after_tools=False, tokens_left=50))
    assert cheap.target == routing.Target("cheap", "http://c/v1", "responses")
    assert cheap.route == {"reason": "route", "version": 3, "rule": 2}


def test_a_loop_of_fallbacks_ends():
    looped = {
        "big": {"to_model": "mid", "to_base_url": None, "to_api": None, "after_attempts": 1},
        "mid": {"to_model": "big", "to_base_url": None, "to_api": None, "after_attempts": 1},
    }
    assert [t.model for t, _ in routing.chain(routing.Target("big", "u", "chat"), looped)] == [
        "big",
        "mid",
    ]


def test_a_server_that_asked_to_wait_is_skipped_like_an_open_circuit():
    held = routing.choose(RUN, FIRST, 0, None, FALLBACKS, {}, lambda url: False, {"http://a/v1": 9})
    assert held.target is not None and held.target.model == "mid"
    assert held.route == {"reason": "retry_after", "skipped": ["http://a/v1"], "primary": "big"}
    assert held.fallback_left  # mid has a fallback of its own
    alone = routing.choose(RUN, FIRST, 0, None, {}, {}, lambda url: False, {"http://a/v1": 9})
    assert alone.target is None and alone.wait_s == 9  # the whole Retry-After, uncapped


@pytest.mark.parametrize(
    ("failures", "last_here"),
    [
        (0, False),  # big takes two failures: one more still comes back to it
        (1, True),  # its second: the next attempt goes to mid
        (2, True),  # mid takes one
        (3, False),  # small is the last link: nothing after it
    ],
)
def test_a_choice_says_when_one_more_failure_moves_the_turn_on(failures, last_here):
    assert choose(failures).last_here is last_here


def test_a_target_reached_past_an_open_circuit_is_not_its_last_attempt_there():
    circuits = {"http://a/v1": Circuit("open", 5, probe_due=False)}
    choice = choose(0, circuits)
    assert choice.target is not None and choice.target.model == "mid"
    assert not choice.last_here  # mid's own count starts when the turn is moved to it
