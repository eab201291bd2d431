"""Model turns: build the thread's history, call the model, hand back the turn to record.

The relay owns the agent loop. A ``model_turn`` row carries a step number; its executor
reads the run and the thread's history (replayed so every call has its result), calls an
OpenAI-compatible server with the run's tools (the request the ``openai`` SDK would send,
posted by ``ModelServer``), and returns the response as a ``ModelTurnIn``. The completer
records it with ``writer.record_model_turns``, together with the other turns of its fenced
transaction, with the batch of tool-call intents and their outbox rows. Only
one response is ever recorded per (run, step) (a unique constraint): a crash before the
record may call the model again, never record twice; a turn already recorded is reused.

The call is a coroutine on the relay's event loop (``relay.engine``): a turn waiting seconds
for its model holds no thread and no database connection. ``ModelServer`` POSTs the
request as the ``openai`` SDK would (base URL, bearer key, OpenAI's organization and
project headers, OpenAI's error body) through ``relay.poster``, without the SDK's client,
which cost as much CPU per request as the HTTP itself (``relay.poster`` has the figures). The two
provider adapters, chosen per run (``api``), live in ``outbox.providers``: the Responses
API (``function_call`` and ``function_call_output`` items) and chat completions
(``tool_calls``), with the history and tool-list conversions; the reasoning items of a
Responses answer are recorded with its turn and given back to the model, verbatim, before
that turn's text and calls (a reasoning model refuses a call without them). 429, 5xx, timeouts
and connection errors retry with backoff, or after what a ``Retry-After`` header asks;
other 4xx answers fail the run with reason ``model_error`` (sending the same request
again would not help). Which model, base URL and API a turn goes to is chosen with its
preparation (``outbox.routing``: routing rules, a fallback after failed attempts, the
circuit of each base URL); each outcome says what its call showed of its server, for that
server's circuit (``Outcome.circuit``), and a recorded turn names what answered it.

Every request of a conversation carries its ``prompt_cache_key`` (``outbox.providers``);
a server configured with an affinity header (``--affinity-header``) gets the key in that
header too, for a self-hosted router that keeps a conversation on the replica holding its
KV cache.

An answer is read up to ``--max-model-answer`` bytes (``OUTBOX_MAX_MODEL_ANSWER_BYTES``,
32 MiB: twice the largest turn that can be recorded) and no further, so a server answering
gigabytes costs the relay the cap, not its memory. An answer past the cap is most likely a
broken server: the turn is retried with backoff like a 5xx, and when it is out of
attempts the run fails naming the size and the cap (a turn parked for an operator would
hold its run for nothing: there is no answer to reconcile). An answer that parses but
that PostgreSQL cannot store (``outbox.storable``: a NUL, ``NaN``, nesting 100,000 deep)
fails the run at once, naming the problem, like any answer that cannot be recorded.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx2
from pydantic import ValidationError

from outbox import config as outbox_config
from outbox import failpoints, providers, routing, storable
from outbox.errors import OutboxError
from outbox.relay import compaction, spans
from outbox.relay.outcomes import Claimed, Outcome, retry, retry_after_s
from outbox.relay.poster import Answered, Poster
from outbox.relay.preparer import Turn, step_of
from outbox.schemas import ModelTurnIn

MODEL_TIMEOUT_S = float(os.environ.get("OUTBOX_MODEL_TIMEOUT_S", "120"))  # per request
DEFAULT_BASE_URL = routing.DEFAULT_BASE_URL  # the SDK's, when neither run nor env names one
PREVIEW_CHARS = 500  # of an error answer that is not OpenAI's error JSON


class ModelAnswered(Exception):
    """The model's server answered with an HTTP error (``status_code``); ``message`` is
    its error's message (OpenAI's ``{"error": {"message"}}``) or the start of its body."""

    def __init__(self, status_code: int, message: str, response: Answered) -> None:
        super().__init__(f"HTTP {status_code}: {message}")
        self.status_code = status_code
        self.message = message
        self.response = response

    @property
    def transient(self) -> bool:
        """Worth sending again: the server is busy (429) or broken (5xx)."""
        return self.status_code == 429 or self.status_code >= 500


class ModelAnswerTooLarge(Exception):
    """The model's server answered more than the cap (``max_body`` bytes); the rest was not
    read."""

    def __init__(self, max_body: int) -> None:
        super().__init__(
            f"the model answered over {max_body} bytes, the cap of a model answer "
            "(--max-model-answer, OUTBOX_MAX_MODEL_ANSWER_BYTES); it was not read further"
        )
        self.max_body = max_body


class ModelServer:
    """An OpenAI-compatible server at ``base_url``, reached through a ``Poster``; its
    answers are read up to ``max_body`` bytes."""

    def __init__(
        self,
        poster: Poster,
        base_url: str,
        api_key: str,
        max_body: int = outbox_config.MAX_MODEL_ANSWER_BYTES,
        affinity_header: str | None = None,
    ) -> None:
        self.poster = poster
        self.max_body = max_body
        self.affinity_header = affinity_header  # carries each request's prompt_cache_key
        self.base_url = base_url.rstrip("/")
        self.headers = {"authorization": f"Bearer {api_key}"}
        for header, variable in (
            ("openai-organization", "OPENAI_ORG_ID"),
            ("openai-project", "OPENAI_PROJECT_ID"),
        ):
            if os.environ.get(variable):
                self.headers[header] = os.environ[variable]

    async def post(
        self, path: str, body: dict[str, Any], trace: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """POST ``body`` to ``path``, with the trace context ``trace`` (the turn's span:
        ``relay.spans.headers``); the answer's JSON object. ``ModelAnswered`` for an
        HTTP error, ``httpx2.HTTPError`` when no answer came, ``ModelAnswerTooLarge`` past
        the cap, ``storable.NotStorable`` for JSON PostgreSQL cannot store (``ValueError``
        for no JSON at all)."""
        # Sent as bytes, and the body, its bytes and the headers let go before the answer is
        # awaited: a turn waits for seconds to minutes, and its request (the history it
        # posts) is the largest thing a waiting turn would keep. Only the poster's frame
        # gets them (the coroutine is made here, awaited below), and it lets go of them
        # once they are handed to the connection.
        sending = self.poster.post(
            self.base_url + path,
            content=json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode(),
            headers=self._headers(body, trace),
            timeout=MODEL_TIMEOUT_S,
            max_body=self.max_body,
            repeatable=True,  # a lost turn is retried: it has no effect to settle
        )
        del body, trace
        response = await sending
        if response.status_code >= 400:
            raise ModelAnswered(response.status_code, _error_message(response), response)
        if "body_cut_at" in response.extensions:
            raise ModelAnswerTooLarge(self.max_body)
        decoded = storable.loads(response.content, "the model's answer")
        if not isinstance(decoded, dict):
            raise ValueError(f"the model answered {type(decoded).__name__}, not a JSON object")
        return decoded

    def _headers(self, body: dict[str, Any], trace: dict[str, str] | None) -> dict[str, str]:
        """A request's headers: the server's, the trace context, the affinity header, and
        the body's type."""
        headers = {**self.headers, **trace} if trace else {**self.headers}
        if self.affinity_header and isinstance(body.get("prompt_cache_key"), str):
            headers[self.affinity_header] = body["prompt_cache_key"]
        if not any(name.lower() == "content-type" for name in headers):
            headers["content-type"] = "application/json"
        return headers


def _error_message(response: Answered) -> str:
    try:
        message = storable.loads(response.content, "error")["error"]["message"]
    except (ValueError, KeyError, TypeError, storable.NotStorable):
        return response.text[:PREVIEW_CHARS]
    return str(message)


def retry_after(err: Exception) -> float | None:
    """What the ``Retry-After`` header of a failed model call asks, if anything."""
    response = err.response if isinstance(err, ModelAnswered) else None
    return retry_after_s(response.headers.get("retry-after") if response is not None else None)


class ModelExecutor:
    """Runs ``model_turn`` rows on the engine's event loop.

    ``prepare`` reads what the call needs (batched with other turns', ``relay.preparer``);
    ``servers`` gives the ``ModelServer`` of a base URL (``relay.engine``).
    """

    def __init__(
        self,
        prepare: Callable[[Claimed], Awaitable[Turn | str]],
        servers: Callable[[str | None], ModelServer],
    ) -> None:
        self.prepare = prepare
        self.servers = servers
        # Base URLs whose server asked, with Retry-After, that nobody call before a moment
        # (monotonic seconds): their turns wait without calling, and without a charge.
        self.held_until: dict[str | None, float] = {}

    async def run(self, row: Claimed) -> Outcome:
        step_no = step_of(row)
        prepared = await self.prepare(row)
        if isinstance(prepared, str):
            return Outcome(row, "skip", error=prepared)
        run, choice = prepared.run, prepared.choice
        if choice is not None and choice.target is None:  # every server's circuit is open
            why = (choice.route or {}).get("reason", "circuit_open").replace("_", " ")
            error = f"model servers unavailable ({why}): {', '.join(choice.skipped)}"
            return Outcome(row, "defer", error=error, delay_s=choice.wait_s)
        base_url = run["base_url"]
        hold = self.held_until.get(base_url, 0.0) - time.monotonic()
        if hold > 0:
            # A probe not sent: its circuit opens again for another cool-down (reported as
            # a failure: the server asked everyone to wait), rather than staying half-open
            # until the probe times out.
            probe = choice is not None and choice.probe
            return Outcome(
                row,
                "defer",
                error=f"{base_url} asked to wait (Retry-After)",
                delay_s=hold,
                server=base_url if probe else None,
                circuit="failed" if probe else None,
            )
        started, started_at = time.monotonic(), time.time()
        server = self.servers(base_url)
        post = functools.partial(server.post, trace=spans.headers(row))
        outcome = await self._call(row, post, prepared, step_no)
        # What the call's outcome gains here, in one copy: thousands of turns a second.
        changes: dict[str, Any] = {
            "duration_s": time.monotonic() - started,
            "started_at": started_at,
            "server": server.base_url,
            "model": run["model"],
        }
        if outcome.action == "retry" and choice is not None and choice.fallback_left:
            # The server's Retry-After holds its base URL (``held_until``), and the
            # routing sends the next attempt elsewhere: the turn need not wait as long.
            changes["delay_s"] = None
            changes["fallback"] = "next" if choice.last_here else "if_open"
        if isinstance(outcome.output, ModelTurnIn):
            route = choice.route if choice is not None else None
            changes["output"] = outcome.output.model_copy(
                update={"model": run["model"], "base_url": server.base_url, "route": route}
            )
        if outcome.circuit == "answered" and not (choice is not None and choice.dirty):
            changes["circuit"] = None  # a clean circuit: nothing to report
        return dataclasses.replace(outcome, **changes)

    async def _call(
        self,
        row: Claimed,
        post: providers.Post,
        prepared: Turn,
        step_no: int,
    ) -> Outcome:
        """The turn's request to its model (after its compaction when it needs one,
        ``relay.compaction``): the outcome of its answer (or of none)."""
        base_url = prepared.run["base_url"]
        try:
            turn, compacted = await compaction.call(
                post, prepared, step_no, functools.partial(self.prepare, row)
            )
        except httpx2.HTTPError as err:  # no answer: refused, timed out, cut
            error = f"model call failed: {type(err).__name__}: {err}"
            return self._retry(row, base_url, error, err)
        except ModelAnswered as err:
            if err.transient:
                error = f"model answered HTTP {err.status_code}: {err.message}"
                return self._retry(row, base_url, error, err)
            return Outcome(
                row,
                "fail_run",
                error=f"model refused the request: {err.message}",
                circuit="answered",
            )
        except ModelAnswerTooLarge as err:
            if row.failures + 1 >= row.max_attempts:  # no answer to park for an operator
                error = f"{err}; the run failed after {row.max_attempts} attempts"
                return Outcome(row, "fail_run", error=error, circuit="failed")
            return self._retry(row, base_url, str(err), err)
        except storable.NotStorable as err:
            error = f"model response cannot be recorded: {err.args[0]}"
            return Outcome(row, "fail_run", error=error)
        except (ValidationError, OutboxError, KeyError, TypeError, ValueError) as err:
            error = f"model response cannot be recorded: {type(err).__name__}: {err}"
            return Outcome(row, "fail_run", error=error)
        failpoints.hit("model.after_call")
        compaction_row = compacted.row(prepared.run, step_no) if compacted is not None else None
        return Outcome(row, "turn", output=turn, circuit="answered", compaction=compaction_row)

    def _retry(self, row: Claimed, base_url: str | None, error: str, err: Exception) -> Outcome:
        """Try the turn again later; when the server said how long to wait, every turn of
        that base URL waits as long."""
        delay = retry_after(err)
        if delay:
            self.held_until[base_url] = max(
                self.held_until.get(base_url, 0.0), time.monotonic() + delay
            )
        return dataclasses.replace(retry(row, error, delay), circuit="failed")
