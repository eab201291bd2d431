"""``FakeToolService``: fake side-effecting tools with an audit, to prove "no duplicate effects".

One HTTP server hosts several tools at ``POST /tools/{name}`` (JSON arguments in the body,
``Idempotency-Key``, ``X-Outbox-Run-Id``, ``X-Outbox-Tool-Call-Id``, ``X-Correlation-Id`` and
``traceparent`` headers). Each tool declares how it treats retries:

- ``key``: honours ``Idempotency-Key``; a repeat returns the stored answer, no new effect
  (tools built with ``reject_key_reuse`` answer 422 when the arguments differ, like Stripe).
- ``lookup``: ignores keys, every delivery is a new effect, but ``POST /tools/{name}/lookup``
  with ``{"idempotency_key", "arguments"}`` tells whether an effect already happened.
- ``none``: neither; every delivery is a new effect.

A tool built with ``tracks_in_flight`` knows the requests it is acting on, from the moment
it takes them: a ``key`` tool answers 409 ``idempotency_key_in_use`` to a repeat of a key
in use (Stripe, the Idempotency-Key draft's concurrent request) and a ``lookup`` tool's
lookup answers ``{"found": false, "in_progress": true}`` for one. Without it, a repeat or
a lookup that arrives while the first request acts finds nothing (``act_after``).

Design choice: each tool records every raw delivery and every distinct effect, and the
"is this key already done?" check, the handler and the record run under the tool's lock, so
the audit is the ground truth a test compares against (``duplicate_effects``). Faults
(latency, failures, dropped connections, a stall after the effect is committed) are queued
per tool for the next N deliveries or a time window; lookups are never faulted.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from outbox.registry import ModeName
from outbox.testing.server import (
    FakeServer,
    HttpError,
    Reply,
    Request,
    canonical_json,
    dropped,
    json_reply,
    serve_main,
)

IdempotencyMode = ModeName  # the modes of outbox.registry.IDEMPOTENCY_MODES
FaultKind = Literal[
    "latency",
    "fail",
    "drop",
    "stall_after_commit",
    "act_after",
    "echo_credentials",
    "answer_raw",
]
ToolHandler = Callable[[dict[str, Any], int], dict[str, Any]]  # (arguments, effect_id) -> result

TOOLS_PREFIX = "/tools/"
RETRY_AFTER_S = 1  # seconds, sent with injected 429/503


def fingerprint(arguments: Any) -> str:
    """sha256 hex of the canonical JSON of the arguments: the lookup's fallback match."""
    return hashlib.sha256(canonical_json(arguments).encode()).hexdigest()


class ToolError(Exception):
    """Raise from a handler to answer a 4xx/5xx without recording a side effect."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body: dict[str, Any] = {"error": {"code": code, "message": message}}
        if field is not None:
            self.body["error"]["field"] = field


@dataclass(frozen=True)
class Delivery:
    """One raw request to a tool (``status`` None = connection dropped on purpose)."""

    key: str | None
    headers: dict[str, str]
    arguments: Any
    status: int | None
    replayed: bool  # answered from the idempotency store, no new effect
    effect_id: int | None
    at: float  # seconds since the epoch


@dataclass(frozen=True)
class Effect:
    """One distinct side effect, with the key it was first created with."""

    effect_id: int
    key: str | None
    fingerprint: str
    arguments: dict[str, Any]
    result: dict[str, Any]
    at: float  # seconds since the epoch


@dataclass
class _Fault:
    kind: FaultKind
    seconds: float = 0.0
    status: int = 500
    remaining: int | None = 1  # None: no count limit
    until: float | None = None  # time.monotonic() deadline; None: no time limit
    padding: int = 0  # echo_credentials: characters of filler before the echoed secret
    encoded: bool = False  # echo_credentials: the secret re-encoded beside the plain echo
    body: bytes = b""  # answer_raw: the body answered

    def active(self, now: float) -> bool:
        fresh = self.until is None or now < self.until
        return fresh and (self.remaining is None or self.remaining > 0)

    def consume(self) -> None:
        if self.remaining is not None:
            self.remaining -= 1


def credential_encodings(secret: str) -> dict[str, str]:
    """The secret as careless tools send it back re-encoded: base64 (alone, and inside the
    ``Basic`` credentials of a user, where it starts at another byte alignment), base64url
    without padding (as JWTs carry it), URL-encoded both ways and inside a JSON text.
    Built here with the standard library, never with the relay's masker, so that a test
    compares the masker against what tools really produce."""
    raw = secret.encode()
    return {
        "base64": base64.b64encode(raw).decode(),
        "basic": "Basic " + base64.b64encode(b"user:" + raw).decode(),
        "base64url": base64.urlsafe_b64encode(raw).decode().rstrip("="),
        "url": urllib.parse.quote(secret, safe=""),
        "url_plus": urllib.parse.quote_plus(secret),
        "json": json.dumps({"token": secret}),
    }


def echo_body(echoed: str, padding: int = 0, *, encoded: bool = False) -> dict[str, Any]:
    """The body ``echo_credentials`` answers for the header value ``echoed``. With
    ``encoded``, the credential (the header without its scheme) is also sent back in each
    of its ``credential_encodings``, in the message and under ``encoded``."""
    message = "." * padding + f"credentials rejected: {echoed}"
    if not encoded:
        return {"message": message, "got": echoed}
    scheme, _, secret = echoed.partition(" ")
    encodings = credential_encodings(secret or scheme)
    message += "".join(f"; {name}: {form}" for name, form in encodings.items())
    return {"message": message, "got": echoed, "encoded": encodings}


def _generic_handler(name: str) -> ToolHandler:
    def handler(arguments: dict[str, Any], effect_id: int) -> dict[str, Any]:
        return {"ok": True, "tool": name, "effect_id": effect_id}

    return handler


class FakeTool:
    """One fake tool: its idempotency behaviour, its audit and its queued faults."""

    def __init__(
        self,
        name: str,
        mode: IdempotencyMode = "key",
        handler: ToolHandler | None = None,
        *,
        required: Sequence[str] = (),
        reject_key_reuse: bool = False,
        tracks_in_flight: bool = False,
    ) -> None:
        self.name = name
        self.mode = mode
        self.handler = handler or _generic_handler(name)
        self.required = tuple(required)
        self.reject_key_reuse = reject_key_reuse
        self.tracks_in_flight = tracks_in_flight
        self._acting: list[tuple[str | None, str]] = []  # (key, fingerprint) being acted on
        self._lock = threading.Lock()
        self._deliveries: list[Delivery] = []
        self._effects: list[Effect] = []
        self._in_flight = 0  # requests being answered now
        self._max_in_flight = 0
        self._starts: list[float] = []  # time.monotonic() at each request's arrival
        self._by_key: dict[str, Effect] = {}
        self._faults: list[_Fault] = []
        self._lookups = 0
        self._lookup_starts: list[float] = []  # time.monotonic() at each lookup's arrival

    # -- faults: each applies to the next ``n`` deliveries (None: unlimited) and/or for
    #    ``window_s`` seconds from now; ``clear_faults`` removes them all.

    def latency(self, seconds: float, n: int | None = 1, window_s: float | None = None) -> None:
        """Delay the answer by ``seconds`` before anything happens."""
        self._add_fault(_Fault("latency", seconds=seconds), n, window_s)

    def fail(self, status: int = 500, n: int | None = 1, window_s: float | None = None) -> None:
        """Answer ``status`` without a side effect."""
        self._add_fault(_Fault("fail", status=status), n, window_s)

    def drop_connection(self, n: int | None = 1, window_s: float | None = None) -> None:
        """Close the socket without an answer and without a side effect."""
        self._add_fault(_Fault("drop"), n, window_s)

    def stall_after_commit(
        self, seconds: float, n: int | None = 1, window_s: float | None = None
    ) -> None:
        """Record the side effect, then hold the answer ``seconds`` (a timeout after send)."""
        self._add_fault(_Fault("stall_after_commit", seconds=seconds), n, window_s)

    def act_after(self, seconds: float, n: int | None = 1, window_s: float | None = None) -> None:
        """Take the request and check its key at once, but act ``seconds`` later, recording
        the effect (and the key, for a ``key`` tool) only then, as a tool whose work and
        idempotency record finish after a while: a repeat or a lookup that arrives
        meanwhile finds nothing, and a repeat acts a second time."""
        self._add_fault(_Fault("act_after", seconds=seconds), n, window_s)

    def answer_raw(self, body: bytes, n: int | None = 1, window_s: float | None = None) -> None:
        """Record the side effect, then answer 200 with ``body`` as it is (``application/
        json``): JSON that PostgreSQL cannot store (a NUL, ``NaN``, nesting 100,000 deep),
        or bytes that are not JSON at all. For tests that an answer which arrived is never
        a reason to call the tool again."""
        self._add_fault(_Fault("answer_raw", body=body), n, window_s)

    def echo_credentials(
        self,
        status: int = 401,
        n: int | None = 1,
        window_s: float | None = None,
        *,
        padding: int = 0,
        encoded: bool = False,
    ) -> None:
        """Answer ``status`` with a body that echoes the request's ``Authorization`` (else
        ``X-Api-Key``) header, and with that header echoed back in the response headers
        (``X-Echoed-Authorization``, ``WWW-Authenticate``), as careless APIs do in their
        errors, without a side effect (a 200 plays an API that puts it in a result).
        ``padding`` puts that many characters of filler before the echo in the message, so
        that a long error body is cut somewhere inside the secret. ``encoded`` also sends
        the credential back re-encoded (``credential_encodings``), in the message and in a
        field of its own, as an API that dumps the request it got does (``echo_body``).
        For tests that secrets never leave the relay."""
        fault = _Fault("echo_credentials", status=status, padding=padding, encoded=encoded)
        self._add_fault(fault, n, window_s)

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def _add_fault(self, fault: _Fault, n: int | None, window_s: float | None) -> None:
        fault.remaining = n
        fault.until = None if window_s is None else time.monotonic() + window_s
        with self._lock:
            self._faults.append(fault)

    def _take(self, *kinds: FaultKind) -> _Fault | None:
        """Consume and return the first active fault of the given kinds (lock held)."""
        now = time.monotonic()
        self._faults = [f for f in self._faults if f.active(now)]
        for fault in self._faults:
            if fault.kind in kinds:
                fault.consume()
                return fault
        return None

    # -- audit ----------------------------------------------------------------------------

    @property
    def deliveries(self) -> list[Delivery]:
        with self._lock:
            return list(self._deliveries)

    @property
    def effects(self) -> list[Effect]:
        with self._lock:
            return list(self._effects)

    @property
    def lookups(self) -> int:
        """How many lookup requests were answered."""
        with self._lock:
            return self._lookups

    @property
    def lookup_starts(self) -> list[float]:
        """When each lookup request arrived (``time.monotonic()``, as ``starts``)."""
        with self._lock:
            return list(self._lookup_starts)

    def duplicate_effects(self) -> int:
        """Effects beyond one per idempotency key (effects without a key are not counted)."""
        seen: set[str] = set()
        duplicates = 0
        for effect in self.effects:
            if effect.key is None:
                continue
            if effect.key in seen:
                duplicates += 1
            seen.add(effect.key)
        return duplicates

    def find_effect(self, idempotency_key: str | None, arguments: Any = None) -> Effect | None:
        """The first effect delivered with this key; else one with the same fingerprint.

        The fingerprint fallback only matches effects delivered without a key (or any
        effect when no key is given): the same arguments under another key are another
        intent, not this one.
        """
        wanted = None if arguments is None else fingerprint(arguments)
        with self._lock:
            for effect in self._effects:
                if idempotency_key is not None and effect.key == idempotency_key:
                    return effect
            for effect in self._effects:
                keyless = idempotency_key is None or effect.key is None
                if wanted is not None and keyless and effect.fingerprint == wanted:
                    return effect
        return None

    def clear_audit(self) -> None:
        with self._lock:
            self._deliveries.clear()
            self._effects.clear()
            self._by_key.clear()
            self._lookups = 0
            self._lookup_starts.clear()

    def to_json(self) -> dict[str, Any]:
        with self._lock:
            deliveries = [asdict(d) for d in self._deliveries]
            effects = [asdict(e) for e in self._effects]
            lookups = self._lookups
        return {
            "mode": self.mode,
            "deliveries": deliveries,
            "effects": effects,
            "lookups": lookups,
            "duplicate_effects": self.duplicate_effects(),
        }

    # -- serving ----------------------------------------------------------------------------

    @property
    def max_in_flight(self) -> int:
        """The most requests this tool was answering at once (to check concurrency limits)."""
        with self._lock:
            return self._max_in_flight

    @property
    def in_flight(self) -> int:
        """How many requests the tool is answering now (an abandoned one included)."""
        with self._lock:
            return self._in_flight

    @property
    def starts(self) -> list[float]:
        """When each request arrived (``time.monotonic()``), to check rate limits."""
        with self._lock:
            return list(self._starts)

    def deliver(self, request: Request) -> Reply:
        """Answer one delivery of ``POST /tools/{name}``, counting requests in flight."""
        with self._lock:
            self._in_flight += 1
            self._max_in_flight = max(self._max_in_flight, self._in_flight)
            self._starts.append(time.monotonic())
        try:
            return self._deliver(request)
        finally:
            with self._lock:
                self._in_flight -= 1

    def _deliver(self, request: Request) -> Reply:
        key = request.headers.get("idempotency-key")
        arguments = request.json_object()
        with self._lock:
            latency = self._take("latency")
            failure = self._take("drop", "fail", "echo_credentials")
        if latency is not None:
            time.sleep(latency.seconds)  # simulated tool latency
        if failure is not None and failure.kind == "drop":
            self._record(request, key, arguments, None)
            return dropped()
        if failure is not None and failure.kind == "echo_credentials":
            self._record(request, key, arguments, failure.status)
            echoed = request.headers.get("authorization") or request.headers.get("x-api-key", "")
            headers = {
                "X-Echoed-Authorization": echoed,
                "WWW-Authenticate": f'Bearer error="invalid_token", token="{echoed}"',
            }
            body = echo_body(echoed, failure.padding, encoded=failure.encoded)
            return json_reply(failure.status, body, headers)
        if failure is not None:
            self._record(request, key, arguments, failure.status)
            headers = {"retry-after": str(RETRY_AFTER_S)} if failure.status in (429, 503) else {}
            body = {"error": {"code": "injected_fault", "message": f"injected {failure.status}"}}
            return json_reply(failure.status, body, headers)
        for name in self.required:
            if name not in arguments:
                self._record(request, key, arguments, 400)
                error = ToolError(
                    400, "missing_argument", f"missing required argument '{name}'", name
                )
                return json_reply(400, error.body)
        return self._apply(request, key, arguments)

    def _apply(self, request: Request, key: str | None, arguments: dict[str, Any]) -> Reply:
        """Dedup by key, run the handler and record the effect: one critical section (or
        two, the key checked in the first and the effect recorded in the second, for a
        request under ``act_after``)."""
        with self._lock:
            late = self._take("act_after")
            stored = self._by_key.get(key) if key is not None else None
            if stored is None and self._key_in_use(key):
                self._record_locked(request, key, arguments, 409)
                error = ToolError(
                    409,
                    "idempotency_key_in_use",
                    "a request with this idempotency key is in progress; retry later",
                )
                return json_reply(409, error.body)
            if stored is not None:
                if self.reject_key_reuse and stored.fingerprint != fingerprint(arguments):
                    self._record_locked(request, key, arguments, 422)
                    error = ToolError(
                        422,
                        "idempotency_key_reused",
                        "idempotency key reused with different arguments",
                    )
                    return json_reply(422, error.body)
                self._record_locked(request, key, arguments, 200, stored.effect_id, True)
                return json_reply(200, stored.result)
            if late is None:
                return self._act_locked(request, key, arguments)
            acting = (key, fingerprint(arguments))
            self._acting.append(acting)
        time.sleep(late.seconds)  # the tool's work, before it records the effect and key
        with self._lock:
            self._acting.remove(acting)
            return self._act_locked(request, key, arguments)

    def _key_in_use(self, key: str | None) -> bool:
        """A ``tracks_in_flight`` key tool is acting on a request with ``key`` (lock held)."""
        in_use = self.tracks_in_flight and self.mode == "key" and key is not None
        return in_use and any(k == key for k, _ in self._acting)

    def _acting_on(self, key: str | None, arguments: Any) -> bool:
        """A ``tracks_in_flight`` tool is acting on the request a lookup asks about: the same
        key, or the same arguments when there is no key (lock held; ``find_effect``)."""
        if not self.tracks_in_flight:
            return False
        wanted = None if arguments is None else fingerprint(arguments)
        return any(
            (key is not None and k == key)
            or (wanted is not None and (key is None or k is None) and f == wanted)
            for k, f in self._acting
        )

    def _act_locked(self, request: Request, key: str | None, arguments: dict[str, Any]) -> Reply:
        """Run the handler and record the effect (lock held)."""
        effect_id = len(self._effects) + 1
        try:
            result = self.handler(arguments, effect_id)
        except ToolError as exc:
            self._record_locked(request, key, arguments, exc.status)
            return json_reply(exc.status, exc.body)
        effect = Effect(effect_id, key, fingerprint(arguments), arguments, result, time.time())
        self._effects.append(effect)
        if self.mode == "key" and key is not None:
            self._by_key[key] = effect
        self._record_locked(request, key, arguments, 200, effect_id)
        stall = self._take("stall_after_commit")
        raw = self._take("answer_raw")
        body: Any = result if raw is None else raw.body
        return Reply(200, body, delay_s=stall.seconds if stall else 0.0)

    def lookup(self, request: Request) -> Reply:
        """Answer ``POST /tools/{name}/lookup`` (lookup-mode tools only)."""
        if self.mode != "lookup":
            raise HttpError(404, {"error": {"message": f"tool {self.name!r} has no lookup"}})
        arrived = time.monotonic()
        body = request.json_object()
        key = body.get("idempotency_key")
        key = key if isinstance(key, str) else None
        effect = self.find_effect(key, body.get("arguments"))
        with self._lock:
            self._lookups += 1
            self._lookup_starts.append(arrived)
            acting = effect is None and self._acting_on(key, body.get("arguments"))
        if acting:
            return json_reply(200, {"found": False, "in_progress": True})
        if effect is None:
            return json_reply(200, {"found": False})
        return json_reply(200, {"found": True, "result": effect.result})

    def _record(
        self, request: Request, key: str | None, arguments: Any, status: int | None
    ) -> None:
        with self._lock:
            self._record_locked(request, key, arguments, status)

    def _record_locked(
        self,
        request: Request,
        key: str | None,
        arguments: Any,
        status: int | None,
        effect_id: int | None = None,
        replayed: bool = False,
    ) -> None:
        self._deliveries.append(
            Delivery(
                key, dict(request.headers), arguments, status, replayed, effect_id, time.time()
            )
        )


def _ticket(arguments: dict[str, Any], effect_id: int) -> dict[str, Any]:
    return {"ticket_id": f"T-{effect_id:06d}", "status": "open", "title": arguments["title"]}


def _email(arguments: dict[str, Any], effect_id: int) -> dict[str, Any]:
    return {"message_id": f"<m-{effect_id:06d}@fake.outbox>", "status": "sent"}


def _charge(arguments: dict[str, Any], effect_id: int) -> dict[str, Any]:
    return {
        "charge_id": f"ch_{effect_id:06d}",
        "amount": arguments["amount"],
        "currency": arguments.get("currency", "usd"),
        "status": "succeeded",
    }


_NOOP_RESULT: dict[str, Any] = {"ok": True}


def _noop(arguments: dict[str, Any], effect_id: int) -> dict[str, Any]:
    return _NOOP_RESULT


class FaultRequest(BaseModel):
    """Body of ``POST /_faults``: one fault for one tool, or ``"fault": "clear"``."""

    model_config = ConfigDict(extra="forbid")

    tool: str
    fault: Literal[
        "latency", "fail", "drop", "stall_after_commit", "echo_credentials", "answer_raw", "clear"
    ]
    seconds: float = 0.0  # for latency and stall_after_commit
    status: int = 500  # for fail and echo_credentials
    body: str = ""  # for answer_raw: the body's text, sent as UTF-8
    n: int | None = 1
    window_s: float | None = None  # seconds


class ToolRequest(BaseModel):
    """Body of ``POST /_tools``: mount a generic tool out of process."""

    model_config = ConfigDict(extra="forbid")

    name: str
    mode: IdempotencyMode = "key"
    required: list[str] = []
    reject_key_reuse: bool = False


class FakeToolService(FakeServer):
    """Several fake tools on one server, with ready-made ones for the demo.

    Parameters
    ----------
    standard_tools:
        Mount ``create_ticket`` (lookup), ``send_email`` (key), ``charge`` (key, refuses key
        reuse with other arguments) and ``noop`` (key, ``{"ok": true}``).

    Example
    -------
    >>> with FakeToolService() as tools:
    ...     httpx2.post(tools.endpoint("send_email"), json={"to": "a@b", "subject": "hi"},
    ...                 headers={"Idempotency-Key": "run1:call1"})
    ...     assert tools.duplicate_effects() == 0
    """

    def __init__(
        self, *, standard_tools: bool = True, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        super().__init__(host, port)
        self._tools: dict[str, FakeTool] = {}
        if standard_tools:
            self.add_tool("create_ticket", "lookup", _ticket, required=["title"])
            self.add_tool("send_email", "key", _email, required=["to", "subject"])
            self.add_tool("charge", "key", _charge, required=["amount"], reject_key_reuse=True)
            self.add_tool("noop", "key", _noop)

    def add_tool(
        self,
        name: str,
        mode: IdempotencyMode = "key",
        handler: ToolHandler | None = None,
        *,
        required: Sequence[str] = (),
        reject_key_reuse: bool = False,
        tracks_in_flight: bool = False,
    ) -> FakeTool:
        """Mount (or replace) a tool at ``POST /tools/{name}``; returns it for faults/audit."""
        tool = FakeTool(
            name,
            mode,
            handler,
            required=required,
            reject_key_reuse=reject_key_reuse,
            tracks_in_flight=tracks_in_flight,
        )
        with self.lock:
            self._tools[name] = tool
        return tool

    def tool(self, name: str) -> FakeTool:
        with self.lock:
            return self._tools[name]

    @property
    def tools(self) -> Mapping[str, FakeTool]:
        with self.lock:
            return dict(self._tools)

    def endpoint(self, name: str) -> str:
        """URL the registry should point at for this tool."""
        return f"{self.url}{TOOLS_PREFIX}{name}"

    def lookup_endpoint(self, name: str) -> str:
        return f"{self.endpoint(name)}/lookup"

    def duplicate_effects(self, name: str | None = None) -> int:
        """Duplicate effects of one tool, or of all tools when ``name`` is None."""
        tools = [self.tool(name)] if name is not None else list(self.tools.values())
        return sum(tool.duplicate_effects() for tool in tools)

    def audit(self) -> dict[str, Any]:
        """Everything ``GET /_audit`` returns: ``{"tools": {name: {...}}}``."""
        return {"tools": {name: tool.to_json() for name, tool in self.tools.items()}}

    def clear_audit(self) -> None:
        for tool in self.tools.values():
            tool.clear_audit()

    def set_fault(self, fault: FaultRequest | Mapping[str, Any]) -> None:
        """Apply one ``FaultRequest`` (what ``POST /_faults`` does)."""
        spec = FaultRequest.model_validate(fault)
        tool = self.tool(spec.tool)
        if spec.fault == "clear":
            tool.clear_faults()
        elif spec.fault == "latency":
            tool.latency(spec.seconds, spec.n, spec.window_s)
        elif spec.fault == "fail":
            tool.fail(spec.status, spec.n, spec.window_s)
        elif spec.fault == "drop":
            tool.drop_connection(spec.n, spec.window_s)
        elif spec.fault == "echo_credentials":
            tool.echo_credentials(spec.status, spec.n, spec.window_s)
        elif spec.fault == "answer_raw":
            tool.answer_raw(spec.body.encode(), spec.n, spec.window_s)
        else:
            tool.stall_after_commit(spec.seconds, spec.n, spec.window_s)

    def handle(self, request: Request) -> Reply:
        route = (request.method, request.path)
        if request.method == "POST" and request.path.startswith(TOOLS_PREFIX):
            name, _, action = request.path[len(TOOLS_PREFIX) :].partition("/")
            tool = self._tools.get(name)
            if tool is None or action not in ("", "lookup"):
                raise HttpError(404, {"error": {"message": f"no tool at {request.path}"}})
            return tool.lookup(request) if action else tool.deliver(request)
        if route == ("GET", "/_audit"):
            return json_reply(200, self.audit())
        try:
            if route == ("POST", "/_faults"):
                self.set_fault(request.json_object())
                return json_reply(200, {"ok": True})
            if route == ("POST", "/_tools"):
                spec = ToolRequest.model_validate(request.json_object())
                self.add_tool(
                    spec.name,
                    spec.mode,
                    required=spec.required,
                    reject_key_reuse=spec.reject_key_reuse,
                )
                return json_reply(200, {"ok": True, "endpoint": self.endpoint(spec.name)})
        except (ValidationError, KeyError) as exc:
            raise HttpError(400, {"error": {"message": str(exc)}}) from exc
        raise HttpError(404, {"error": {"message": f"no route {request.method} {request.path}"}})


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m outbox.testing.tools --port N``: serve the standard tools until SIGTERM."""
    return serve_main(
        lambda host, port: FakeToolService(host=host, port=port),
        "Fake side-effecting tools with an audit (GET /_audit).",
        argv,
    )


if __name__ == "__main__":
    raise SystemExit(main())
