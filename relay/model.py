"""Model turns: build the thread's history, call the model, hand back the turn to record.

The relay owns the agent loop. A ``model_turn`` row carries a step number; its executor
reads the run and the thread's history (replayed so every call has its result), calls an
OpenAI-compatible server through the ``openai`` SDK with the run's tools, and returns the
response as a ``ModelTurnIn``. The completer records it with ``writer.record_model_turn``
in a fenced transaction, with the batch of tool-call intents and their outbox rows. Only
one response is ever recorded per (run, step) (a unique constraint): a crash before the
record may call the model again, never record twice; a turn already recorded is reused.

Two adapters, chosen per run (``api``): the Responses API (``function_call`` and
``function_call_output`` items) and chat completions (``tool_calls``). 429, 5xx, timeouts
and connection errors retry with backoff; other 4xx answers fail the run with reason
``model_error`` (sending the same request again would not help).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import openai
import psycopg
from pydantic import ValidationError

from outbox import history, registry, writer
from outbox.errors import OutboxError
from outbox.schemas import ModelTurnIn, ToolCallIn
from relay import failpoints
from relay.outcomes import Claimed, Outcome, retry

MODEL_TIMEOUT_S = float(os.environ.get("OUTBOX_MODEL_TIMEOUT_S", "120"))  # per request
RETRYABLE = (
    openai.RateLimitError,
    openai.InternalServerError,
    openai.APIConnectionError,
    openai.APITimeoutError,
)


class ModelExecutor:
    """Runs ``model_turn`` rows. ``connect`` gives this thread a database connection."""

    def __init__(self, connect: Callable[[], psycopg.Connection[Any]]) -> None:
        self.connect = connect
        self._clients: dict[tuple[str | None, str], openai.OpenAI] = {}
        self._lock = threading.Lock()

    def run(self, row: Claimed) -> Outcome:
        step_no = int((row.payload or {}).get("step_no", 1))
        conn = self.connect()
        with conn.transaction():
            run = writer.get_run(conn, row.run_id)
            if run["status"] in writer.ENDED:
                return Outcome(row, "skip", error=f"run is {run['status']}")
            recorded = writer.fetch_one(
                conn, writer.Q.model_turn_by_step, {"run_id": run["id"], "step_no": step_no}
            )
            if recorded:
                return Outcome(row, "skip", error=f"step {step_no} is already recorded")
            messages, _ = history.replay(conn, run["thread_id"], run["tenant_id"], api=run["api"])
            tools = registry.resolve(conn, run["tenant_id"], run["tool_names"])
        client = self._client(run["base_url"])
        try:
            if run["api"] == "chat":
                turn = self._chat(client, run, step_no, messages, tools)
            else:
                turn = self._responses(client, run, step_no, messages, tools)
        except RETRYABLE as err:
            return retry(row, f"model call failed: {type(err).__name__}: {err}")
        except openai.APIStatusError as err:
            if err.status_code >= 500:
                return retry(row, f"model answered HTTP {err.status_code}: {err.message}")
            return Outcome(row, "fail_run", error=f"model refused the request: {err.message}")
        except (ValidationError, OutboxError) as err:
            return Outcome(row, "fail_run", error=f"model response cannot be recorded: {err}")
        failpoints.hit("model.after_call")
        return Outcome(row, "turn", output=turn)

    def _client(self, base_url: str | None) -> openai.OpenAI:
        api_key = os.environ.get("OPENAI_API_KEY", "not-needed")
        key = (base_url, api_key)
        with self._lock:
            client = self._clients.get(key)
            if client is None:
                client = openai.OpenAI(
                    base_url=base_url or os.environ.get("OPENAI_BASE_URL"),
                    api_key=api_key,
                    max_retries=0,  # retries are the outbox's job: backoff, attempts, journal
                    timeout=MODEL_TIMEOUT_S,
                )
                self._clients[key] = client
        return client

    def _responses(
        self,
        client: openai.OpenAI,
        run: dict[str, Any],
        step_no: int,
        items: list[dict[str, Any]],
        tools: dict[str, dict[str, Any]],
    ) -> ModelTurnIn:
        kwargs: dict[str, Any] = {"model": run["model"], "input": items}
        if run["instructions"]:
            kwargs["instructions"] = run["instructions"]
        if tools:
            kwargs["tools"] = [
                {
                    "type": "function",
                    "name": name,
                    "description": tool["description"],
                    "parameters": tool["json_schema"],
                }
                for name, tool in sorted(tools.items())
            ]
        response = client.responses.create(**kwargs)
        texts: list[str] = []
        calls: list[ToolCallIn] = []
        for item in response.output:
            if item.type == "message":
                texts += [c.text for c in item.content if c.type == "output_text"]
            elif item.type == "function_call":
                calls.append(
                    ToolCallIn(tool_call_id=item.call_id, name=item.name, arguments=item.arguments)
                )
        usage = response.usage
        return ModelTurnIn(
            tenant_id=run["tenant_id"],
            run_id=run["id"],
            step_no=step_no,
            content="".join(texts) or None,
            tool_calls=calls,
            response_id=response.id,
            input_tokens=usage.input_tokens if usage else 0,
            output_tokens=usage.output_tokens if usage else 0,
        )

    def _chat(
        self,
        client: openai.OpenAI,
        run: dict[str, Any],
        step_no: int,
        messages: list[dict[str, Any]],
        tools: dict[str, dict[str, Any]],
    ) -> ModelTurnIn:
        if run["instructions"]:
            messages = [{"role": "system", "content": run["instructions"]}, *messages]
        kwargs: dict[str, Any] = {"model": run["model"], "messages": messages}
        if tools:
            kwargs["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": name,
                        "description": tool["description"],
                        "parameters": tool["json_schema"],
                    },
                }
                for name, tool in sorted(tools.items())
            ]
        response = client.chat.completions.create(**kwargs)
        message = response.choices[0].message
        calls = [
            ToolCallIn(tool_call_id=c.id, name=c.function.name, arguments=c.function.arguments)
            for c in message.tool_calls or []
            if c.type == "function"
        ]
        usage = response.usage
        return ModelTurnIn(
            tenant_id=run["tenant_id"],
            run_id=run["id"],
            step_no=step_no,
            content=message.content,
            tool_calls=calls,
            response_id=response.id,
            input_tokens=usage.prompt_tokens if usage else 0,
            output_tokens=usage.completion_tokens if usage else 0,
        )
