"""Which model answers a turn: routing rules, fallback chains and circuits per base URL.

Three tables decide it (migration 0048), read by the relay's preparer with each batch of
turns (``relay.preparer``) and set by operators (``outbox models``):

- ``model_routes``: a tenant's routing rules, versioned; a run is pinned to the newest
  version when it is created (``runs.route_version``, the ``runs_pin_route`` trigger), as it
  is to its tools' versions, so a rule changed mid-run never changes a running run. The first
  rule that matches a step (``Rule``: first turn, after tool results, turn number, tokens
  left in the run's budget) names its model, and optionally base URL and API; no match: the
  run's own.
- ``model_fallbacks``: where a model's turns go when its server fails them, another model,
  base URL or API (a Responses model may fall back to a chat-completions one: the history is
  kept in chat format and written in either API's shapes by ``outbox.providers``). A
  fallback is taken after ``after_attempts`` failed attempts of the turn (429, 5xx, a
  timeout, no connection; never after a 4xx that says the request is bad), and at once
  while the circuit of the base URL it would go to is open. A fallback's own fallback makes
  a chain.
- ``model_circuits``: one row per base URL, shared by every relay. The completer reports
  each transaction's failed and answered calls in that transaction
  (``report_model_calls_v1``); consecutive failures open it. While it is open no turn is
  sent there: each goes to the next link of its chain, or waits (uncharged) when there is
  none. After the cool-down one relay takes the probe (``claim_model_probe_v1``): its turn
  is sent, and the answer closes the circuit.

``choose`` is the decision, pure (the preparer gives it the rows and a way to take a
probe), so its rules are tested without a server. Every choice other than "the run's model,
first attempt" is kept as the turn's ``route`` and journaled with it (``model_turn.recorded``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import psycopg
from psycopg.types.json import Jsonb
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from outbox.sql import queries
from outbox.statements import fetch_all, fetch_one

Q = queries("routing.sql")
API = Literal["responses", "chat"]
DEFAULT_BASE_URL = "https://api.openai.com/v1"  # the OpenAI SDK's, when nothing names one
CHAIN_MAX = 4  # links of a fallback chain followed at most (a loop of fallbacks ends there)
# A turn whose every server's circuit is open waits until the first cool-down ends, but at
# least WAIT_MIN_S (a turn prepared again costs a claim and a read of its history) and at
# most WAIT_MAX_S (an operator who closes a circuit by hand sees its turns go soon).
WAIT_MIN_S = 0.5
WAIT_MAX_S = 5.0


def base_url_of(base_url: str | None) -> str:
    """The base URL a turn is sent to: the run's (or a rule's, a fallback's), else
    ``OPENAI_BASE_URL``, else OpenAI's; without a trailing slash. Circuits are kept by it."""
    url = base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL
    return url.rstrip("/")


class Rule(BaseModel):
    """One routing rule: the conditions a step must meet (all of those given) and the model
    it then goes to."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    base_url: str | None = None
    api: API | None = None
    first_turn: bool | None = None  # the run's first step (or any but the first: false)
    after_tool_results: bool | None = None  # the history ends with a tool result (or not)
    min_turn: int | None = Field(default=None, ge=1)  # step number at least
    max_turn: int | None = Field(default=None, ge=1)  # step number at most
    max_tokens_left: int | None = Field(default=None, ge=0)  # of the run's max_tokens

    def matches(self, step: Step) -> bool:
        if self.first_turn is not None and (step.step_no == 1) != self.first_turn:
            return False
        if self.after_tool_results is not None and step.after_tools != self.after_tool_results:
            return False
        if self.min_turn is not None and step.step_no < self.min_turn:
            return False
        if self.max_turn is not None and step.step_no > self.max_turn:
            return False
        return self.max_tokens_left is None or (
            step.tokens_left is not None and step.tokens_left <= self.max_tokens_left
        )


RULES = TypeAdapter(list[Rule])


@dataclass(frozen=True)
class Step:
    """What rules look at: the step's number, whether the history ends with tool results,
    the tokens left in the run's budget (None: it has none)."""

    step_no: int
    after_tools: bool
    tokens_left: int | None = None


@dataclass(frozen=True, slots=True)
class Target:
    """Where a turn is sent: a model, the base URL of its server, the API it speaks."""

    model: str
    base_url: str
    api: str


@dataclass(frozen=True)
class Circuit:
    """A circuit that is not clean (``model_circuits``), as the preparer read it: ``probe_due``
    when its cool-down is over and nobody holds the probe, ``wait_s`` until then."""

    state: str
    failures: int = 0
    probe_due: bool = False
    wait_s: float = 0.0

    @property
    def open(self) -> bool:
        return self.state != "closed"


@dataclass(frozen=True, slots=True)
class Choice:
    """Where a turn goes (``target``; None: every server of its chain is behind an open
    circuit, wait ``wait_s``) and why (``route``: None for the run's own model on a first
    attempt, else what the journal keeps)."""

    target: Target | None
    route: dict[str, Any] | None = None
    wait_s: float = 0.0
    probe: bool = False
    dirty: bool = False  # its server's circuit had failures: report an answer to it
    skipped: list[str] = field(default_factory=list)
    # A fallback comes after the target: a Retry-After of the target's server holds the
    # target's turns, not this one (its next attempt goes to the fallback).
    fallback_left: bool = False
    # One more failure reaches the target's after_attempts: the next attempt goes past it.
    last_here: bool = False


def route_target(
    run: Mapping[str, Any], rules: list[dict[str, Any]] | None, step: Step
) -> tuple[Target, int | None]:
    """The target of a step by the run's pinned rules: the first that matches (its index),
    else the run's own model (None)."""
    own = Target(run["model"], base_url_of(run.get("base_url")), run["api"])
    for i, raw in enumerate(rules or []):
        rule = Rule.model_validate(raw)
        if rule.matches(step):
            return (
                Target(
                    rule.model,
                    base_url_of(rule.base_url) if rule.base_url else own.base_url,
                    rule.api or own.api,
                ),
                i,
            )
    return own, None


def chain(first: Target, fallbacks: Mapping[str, Mapping[str, Any]]) -> list[tuple[Target, int]]:
    """``first`` and its fallbacks in order, each with the failed attempts after which the
    turn moves past it (``after_attempts`` of its fallback row; the last link: never)."""
    links: list[tuple[Target, int]] = []
    current, seen = first, set()
    while len(links) < CHAIN_MAX:
        row = fallbacks.get(current.model)
        seen.add((current.model, current.base_url, current.api))
        if row is None:
            links.append((current, 0))
            break
        links.append((current, int(row["after_attempts"])))
        nxt = Target(
            row["to_model"],
            base_url_of(row["to_base_url"]) if row.get("to_base_url") else current.base_url,
            row.get("to_api") or current.api,
        )
        if (nxt.model, nxt.base_url, nxt.api) in seen:
            break
        current = nxt
    return links


def choose(
    run: Mapping[str, Any],
    step: Step,
    failures: int,
    rules: list[dict[str, Any]] | None,
    fallbacks: Mapping[str, Mapping[str, Any]],
    circuits: Mapping[str, Circuit],
    take_probe: Callable[[str], bool],
    held: Mapping[str, float] | None = None,
) -> Choice:
    """Where the turn of ``run`` at ``step`` goes after ``failures`` failed attempts.

    The routed target (``route_target``), then down its fallback chain: past each link
    whose ``after_attempts`` the failures reached, and past each whose base URL's circuit
    is open unless this caller takes its probe (``take_probe``, once the cool-down is
    over), or whose server asked this relay to wait (``held``: seconds left of its
    ``Retry-After``). None of them left: wait until the first of them may be sent."""
    first, rule = route_target(run, rules, step)
    links = chain(first, fallbacks)
    start, used = 0, failures
    while start < len(links) - 1 and used >= links[start][1]:
        used -= links[start][1]
        start += 1
    route: dict[str, Any] = {}
    if rule is not None:
        route.update(reason="route", version=run.get("route_version"), rule=rule)
    if start > 0:
        route.update(reason="fallback", after_failures=failures, primary=first.model)
    skipped: list[str] = []
    waits: list[float] = []
    opened = False  # a base URL was skipped for its circuit, not only for a Retry-After
    for at, (target, _) in enumerate(links[start:], start):
        more = at < len(links) - 1  # a fallback left after this one
        if held and held.get(target.base_url, 0.0) > 0:
            skipped.append(target.base_url)
            waits.append(held[target.base_url])
            continue
        circuit = circuits.get(target.base_url)
        if circuit is None or not circuit.open:
            if skipped:
                reason = "circuit_open" if opened else "retry_after"
                route.update(reason=reason, skipped=skipped, primary=first.model)
            dirty = circuit is not None and circuit.failures > 0
            last = more and at == start and used + 1 >= links[at][1]
            return _choice(target, route, dirty=dirty, skipped=skipped, more=more, last=last)
        if circuit.probe_due and take_probe(target.base_url):
            route.update(probe=True)
            if skipped:
                route.update(skipped=skipped)
            return _choice(target, route, probe=True, dirty=True, skipped=skipped, more=more)
        skipped.append(target.base_url)
        waits.append(circuit.wait_s)
        opened = True
    wait = max(WAIT_MIN_S, min(waits) if waits else WAIT_MIN_S)
    if opened:
        wait = min(WAIT_MAX_S, wait)
    reason = "circuit_open" if opened else "retry_after"
    return Choice(None, {"reason": reason, "skipped": skipped}, wait_s=wait, skipped=skipped)


def _choice(
    target: Target,
    route: dict[str, Any],
    *,
    probe: bool = False,
    dirty: bool,
    skipped: list[str],
    more: bool,
    last: bool = False,
) -> Choice:
    return Choice(
        target,
        route or None,
        probe=probe,
        dirty=dirty,
        skipped=skipped,
        fallback_left=more,
        last_here=last,
    )


def circuits_of(rows: list[Mapping[str, Any]]) -> dict[str, Circuit]:
    """The ``model_routing_state`` query's circuits by base URL."""
    return {
        row["base_url"]: Circuit(
            row["state"], int(row["failures"]), bool(row["probe_due"]), float(row["wait_s"])
        )
        for row in rows
    }


# -- configuration (``outbox models``) ---------------------------------------------------


def set_fallback(
    conn: psycopg.Connection[Any],
    model: str,
    to_model: str,
    *,
    to_base_url: str | None = None,
    to_api: str | None = None,
    after_attempts: int = 2,
) -> dict[str, Any]:
    """Send ``model``'s failing turns to ``to_model`` (at ``to_base_url``, over ``to_api``;
    None: the run's) after ``after_attempts`` failed attempts, or at once while the circuit
    of ``model``'s base URL is open."""
    row = fetch_one(
        conn,
        Q.set_fallback,
        {
            "model": model,
            "to_model": to_model,
            "to_base_url": to_base_url,
            "to_api": to_api,
            "after_attempts": after_attempts,
        },
    )
    assert row is not None
    return row


def remove_fallback(conn: psycopg.Connection[Any], model: str) -> bool:
    return fetch_one(conn, Q.remove_fallback, {"model": model}) is not None


def fallbacks(conn: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    return fetch_all(conn, Q.fallbacks, {})


def circuits(conn: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    """Every base URL's circuit with its state and settings."""
    return fetch_all(conn, Q.circuits, {})


def set_circuit(
    conn: psycopg.Connection[Any],
    base_url: str,
    *,
    open_after: int | None = None,
    window_s: float | None = None,
    cool_down_s: float | None = None,
    probe_timeout_s: float | None = None,
    close: bool = False,
) -> dict[str, Any]:
    """The settings of ``base_url``'s circuit (None: kept, or the defaults for a new one);
    ``close``: close it now (an operator who knows the server is back)."""
    row = fetch_one(
        conn,
        Q.set_circuit,
        {
            "base_url": base_url.rstrip("/"),
            "open_after": open_after,
            "window_s": window_s,
            "cool_down_s": cool_down_s,
            "probe_timeout_s": probe_timeout_s,
            "close": close,
        },
    )
    assert row is not None
    return row


def set_routes(
    conn: psycopg.Connection[Any], tenant_id: str, rules: list[dict[str, Any]]
) -> dict[str, Any]:
    """A new version of ``tenant_id``'s routing rules (checked: ``Rule``); runs created from
    now on are pinned to it, running runs keep theirs. ``[]`` routes nothing."""
    checked = [r.model_dump(exclude_none=True) for r in RULES.validate_python(rules)]
    row = fetch_one(conn, Q.add_routes, {"tenant_id": tenant_id, "rules": Jsonb(checked)})
    assert row is not None
    return row


def routes(conn: psycopg.Connection[Any], tenant_id: str | None = None) -> list[dict[str, Any]]:
    """Each tenant's newest routing rules (one tenant's, every version, with ``tenant_id``)."""
    return fetch_all(conn, Q.routes, {"tenant_id": tenant_id})
