"""The duplicate-ticket incident as a reproducible scenario, shared by both sides of the demo.

``outbox demo`` plays the same scenario twice: through the outbox (relay processes, the
writer API) and through a naive coordinator (``demo.naive``). Everything both sides must
share lives here, so "the same scenario" is true by construction:

- the **conversations**: who arrives when, which script the model follows, the amount to
  charge, whether the user double-submits the turn, whether the backend answers the
  client-executed ``approve_refund`` twice. All drawn from one ``random.Random(seed)``.
- the **fault plan**: a window (an offset and a length, relative to the start of a side's
  driver) during which ``create_ticket`` and ``send_email`` stall after committing their
  effect for longer than the tool timeout, and the instants at which a relay process (or a
  naive worker) is killed; billing slows down in the window too, but stays under the
  timeout. The schedule is paced by the clock, not by progress.
- the **services**: the scripted model and three audited tool services (ticketing without
  key dedup but with a lookup, e-mail honouring ``Idempotency-Key``, billing honouring keys
  and refusing a reused key with another amount). Each side gets fresh instances, so each
  side's audit trail is its own.
- the **audit arithmetic**: side effects and duplicates are counted from the services'
  audits only, never from what a coordinator believes it did.

Design choice: every conversation's arguments are unique (they carry the conversation's
order number), so two effects with the same arguments are the same business request done
twice, whatever call ids or keys the coordinator used; a duplicate "per intent" is an
effect beyond the first for one provider tool call id (the ``X-Outbox-Tool-Call-Id``
header of the delivery that created it).
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from outbox.testing.scripted_model import HistoryItem, ScriptedModel
from outbox.testing.tools import FakeToolService

TOOL_TIMEOUT_S = 1.0  # seconds: the registry timeout of every HTTP tool, both sides
STALL_S = TOOL_TIMEOUT_S + 0.5  # seconds an effect's answer is held in the fault window
SLOW_BILLING_S = 0.7 * TOOL_TIMEOUT_S  # seconds billing takes in the window (no timeout)
ARRIVALS_PER_S = 10.0  # conversations started per second
MIN_ARRIVAL_SPAN_S = 6.0  # seconds: small runs still get a fault window worth the name
FAULT_START = 0.25  # the fault window opens at this fraction of the arrival span
FAULT_END = 0.65  # and closes at this one
KILL_EVERY_S = 2.5  # seconds between two kill -9 in the fault window (at least two kills)
DOUBLE_SUBMIT_SHARE = 0.15  # conversations whose user turn is sent twice, concurrently
APPROVAL_SHARE = 0.35  # conversations whose second turn also asks for approve_refund
APPROVE_TWICE_SHARE = 0.3  # approvals the backend submits twice (always, in the window)
TENANT = "demo"
MODEL = "scripted-incident"

SERVICES = {"ticketing": "create_ticket", "email": "send_email", "billing": "charge"}
CLIENT_TOOL = "approve_refund"
SCRIPT_PLAIN = "refund"
SCRIPT_APPROVAL = "refund_approval"
_PARAMS = re.compile(r"conv=(\d+) amount=(\d+)")


@dataclass(frozen=True)
class Conversation:
    """One user's conversation: its first message selects the script and its numbers."""

    index: int
    approval: bool
    amount: int  # cents
    double_submit: bool
    approve_twice: bool
    start_at_s: float  # seconds after the driver starts

    @property
    def order(self) -> int:
        return 1000 + self.index

    @property
    def message(self) -> str:
        script = SCRIPT_APPROVAL if self.approval else SCRIPT_PLAIN
        return (
            f"script:{script} conv={self.index} amount={self.amount} "
            f"My order {self.order} arrived broken. Open a ticket, e-mail me, "
            "and charge the replacement shipping."
        )

    @property
    def idempotency_key(self) -> str:
        """The key the user's client sends with the turn (both copies of a double submit)."""
        return f"turn-{self.index}"


@dataclass(frozen=True)
class FaultPlan:
    """When the incident's conditions hold, relative to a driver's start (seconds)."""

    window_start_s: float
    window_s: float
    kill_at_s: tuple[float, ...]

    def in_window(self, elapsed_s: float) -> bool:
        return self.window_start_s <= elapsed_s < self.window_start_s + self.window_s


@dataclass(frozen=True)
class Scenario:
    seed: int
    conversations: tuple[Conversation, ...]
    faults: FaultPlan
    arrival_span_s: float


def build(runs: int, seed: int) -> Scenario:
    """The scenario for ``runs`` conversations: deterministic for a given seed."""
    rng = random.Random(seed)
    span = max(MIN_ARRIVAL_SPAN_S, runs / ARRIVALS_PER_S)
    start, end = FAULT_START * span, FAULT_END * span
    kills = max(2, int((end - start) / KILL_EVERY_S))
    step = (end - start) / (kills + 1)
    faults = FaultPlan(start, end - start, tuple(start + step * (k + 1) for k in range(kills)))
    conversations = []
    for index in range(runs):
        at = span * index / max(1, runs)
        approval = rng.random() < APPROVAL_SHARE
        conversations.append(
            Conversation(
                index=index,
                approval=approval,
                amount=rng.randrange(500, 5000, 5),
                double_submit=rng.random() < DOUBLE_SUBMIT_SHARE,
                approve_twice=approval
                and (faults.in_window(at) or rng.random() < APPROVE_TWICE_SHARE),
                start_at_s=at,
            )
        )
    return Scenario(seed, tuple(conversations), faults, span)


# -- the model's scripts ------------------------------------------------------------------


def _params(history: list[HistoryItem]) -> tuple[int, int]:
    first = next((item.text for item in history if item.kind == "user"), "")
    found = _PARAMS.search(first)
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def _first_turn(history: list[HistoryItem]) -> Mapping[str, Any]:
    conv, _ = _params(history)
    order = 1000 + conv
    return {
        "tool_calls": [
            {"name": "create_ticket", "arguments": {"title": f"Order {order} arrived broken"}},
            {
                "name": "send_email",
                "arguments": {"to": f"customer{conv}@example.com", "subject": f"Order {order}"},
            },
        ]
    }


def _second_turn(approval: bool) -> Any:
    def turn(history: list[HistoryItem]) -> Mapping[str, Any]:
        conv, amount = _params(history)
        calls: list[dict[str, Any]] = [
            {"name": "charge", "arguments": {"amount": amount, "order": 1000 + conv}}
        ]
        if approval:
            calls.append({"name": CLIENT_TOOL, "arguments": {"order": 1000 + conv}})
        return {"tool_calls": calls}

    return turn


def _last_turn(history: list[HistoryItem]) -> Mapping[str, Any]:
    conv, amount = _params(history)
    return {"text": f"Done: order {1000 + conv} has a ticket, an e-mail and a {amount} charge."}


def start_model() -> ScriptedModel:
    """A started scripted model with the incident's two scripts."""
    model = ScriptedModel()
    model.add_script(SCRIPT_PLAIN, [_first_turn, _second_turn(False), _last_turn])
    model.add_script(SCRIPT_APPROVAL, [_first_turn, _second_turn(True), _last_turn])
    return model.start()


# -- the tool services --------------------------------------------------------------------


def _ticket(arguments: dict[str, Any], effect_id: int) -> dict[str, Any]:
    return {"ticket_id": f"T-{effect_id:06d}", "status": "open", "title": arguments["title"]}


def _email(arguments: dict[str, Any], effect_id: int) -> dict[str, Any]:
    return {"message_id": f"<m-{effect_id:06d}@mail.example>", "status": "sent"}


def _charge(arguments: dict[str, Any], effect_id: int) -> dict[str, Any]:
    return {"charge_id": f"ch_{effect_id:06d}", "amount": arguments["amount"], "status": "paid"}


@dataclass
class Services:
    """The three tool services of one side, each a real HTTP server with its own audit."""

    ticketing: FakeToolService
    email: FakeToolService
    billing: FakeToolService

    @classmethod
    def start(cls) -> Services:
        # Each knows the requests it is acting on, as the services it plays do: the lookup
        # says "in progress", a key in use is refused with 409 (REFUSES_KEY_IN_USE).
        ticketing = FakeToolService(standard_tools=False)
        ticketing.add_tool(
            "create_ticket", "lookup", _ticket, required=["title"], tracks_in_flight=True
        )
        email = FakeToolService(standard_tools=False)
        email.add_tool(
            "send_email", "key", _email, required=["to", "subject"], tracks_in_flight=True
        )
        billing = FakeToolService(standard_tools=False)
        billing.add_tool(
            "charge",
            "key",
            _charge,
            required=["amount"],
            reject_key_reuse=True,
            tracks_in_flight=True,
        )
        return cls(ticketing.start(), email.start(), billing.start())

    def by_name(self) -> dict[str, FakeToolService]:
        return {"ticketing": self.ticketing, "email": self.email, "billing": self.billing}

    def endpoint(self, tool: str) -> str:
        return self._service_of(tool).endpoint(tool)

    def lookup_endpoint(self, tool: str) -> str:
        return self._service_of(tool).lookup_endpoint(tool)

    def _service_of(self, tool: str) -> FakeToolService:
        service = next(name for name, t in SERVICES.items() if t == tool)
        return self.by_name()[service]

    def inject_stalls(self, window_s: float) -> None:
        """The latency spike: for ``window_s`` seconds, every new ticket and e-mail commits
        its effect, then answers ``STALL_S`` seconds later, past the tool timeout; billing
        slows down too, but stays under the timeout (``SLOW_BILLING_S``)."""
        self.ticketing.tool("create_ticket").stall_after_commit(STALL_S, n=None, window_s=window_s)
        self.email.tool("send_email").stall_after_commit(STALL_S, n=None, window_s=window_s)
        self.billing.tool("charge").latency(SLOW_BILLING_S, n=None, window_s=window_s)

    def stop(self) -> None:
        for service in self.by_name().values():
            service.stop()


@dataclass
class ServiceAudit:
    """What one service's own audit trail says."""

    tool: str
    deliveries: int = 0  # HTTP requests received
    effects: int = 0  # distinct side effects committed
    replayed: int = 0  # deliveries answered from the idempotency store
    refused_key_reuse: int = 0  # 422: a key reused with other arguments
    lookups: int = 0
    duplicates_same_call: int = 0  # effects beyond the first per provider tool call
    duplicates_same_request: int = 0  # effects beyond the first per business request
    examples: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def audit(service: FakeToolService, tool: str) -> ServiceAudit:
    """Count effects and duplicates from ``service``'s audit trail (the ground truth)."""
    fake = service.tool(tool)
    deliveries, effects = fake.deliveries, fake.effects
    call_of_effect: dict[int, str] = {}
    for delivery in deliveries:
        if delivery.effect_id is not None and not delivery.replayed:
            call_id = delivery.headers.get("x-outbox-tool-call-id") or delivery.key or ""
            call_of_effect[delivery.effect_id] = call_id
    per_call = Counter(call_of_effect.get(e.effect_id) or f"#{e.effect_id}" for e in effects)
    per_request = Counter(e.fingerprint for e in effects)
    result = ServiceAudit(
        tool=tool,
        deliveries=len(deliveries),
        effects=len(effects),
        replayed=sum(1 for d in deliveries if d.replayed),
        refused_key_reuse=sum(1 for d in deliveries if d.status == 422),
        lookups=fake.lookups,
        duplicates_same_call=sum(n - 1 for n in per_call.values()),
        duplicates_same_request=sum(n - 1 for n in per_request.values()),
    )
    repeated = [e for e in effects if per_request[e.fingerprint] > 1]
    result.examples = sorted({str(e.arguments) for e in repeated})[:3]
    return result


def percentile(values: list[float], share: float) -> float | None:
    """The nearest-rank percentile of ``values`` (None when empty)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(share * len(ordered) + 0.5) - 1))
    return ordered[rank]
