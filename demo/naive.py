"""A naive agent coordinator: the code that had the duplicate-ticket incident.

The demo runs the incident's scenario through this coordinator right after the outbox, with
the same conversations and the same faults, to show that the faults really bite. It is a
plain Python loop with no outbox semantics, written the way such loops usually are:

- a **job queue** of "answer thread T" jobs, consumed by W workers of K threads each; a job
  whose worker dies is delivered again after a visibility timeout (at-least-once);
- a **conversation store** per thread (a list of Responses API input items). A job loads
  the conversation, calls the model, and saves the conversation back with the model's
  answer appended (read-modify-write: two jobs on one thread overwrite each other);
- **callbacks and polling both dispatch**: each tool call is sent at once (the callback
  path), and a poller sends again any call that has no result after ``poll_after_s``;
- **retries on timeout without a stable key**: every attempt carries a fresh
  ``Idempotency-Key``, so a tool that did the work but answered late does it again;
- **results stored as they arrive**: every tool result (and every client-submitted output)
  is appended to the thread when it lands, whether or not the turn that asked for it is
  still alive, and whether or not the call already has one;
- **no turn dedup**: a double-submitted user turn runs twice.

The worker "kill -9" is simulated in-process: the worker's epoch is bumped, its jobs stop
at their next step and are delivered again later; the HTTP requests they started keep
going and their results still land, as they would from a real callback endpoint.
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx2
import openai

from demo.incident import CLIENT_TOOL, MODEL

JOB_POLL_S = 0.1  # seconds a worker thread waits on the queue before checking for stop
TURN_WAIT_S = 30.0  # seconds a turn waits for its tool results before giving up
WAIT_SLICE_S = 0.2  # seconds between two checks of a waiting turn (crash, results)
Item = dict[str, Any]


class Crashed(Exception):
    """The job's worker was killed: abandon the job (it will be delivered again)."""


@dataclass
class Outcome:
    """How one conversation ended on the naive side."""

    completed: bool = False
    bricked: str | None = None  # the model's 400 message
    failed: str | None = None
    submitted_at: float = 0.0  # time.monotonic()
    completed_at: float | None = None


@dataclass
class _Pending:
    thread: str
    name: str
    arguments: dict[str, Any]
    sent_at: float
    polled: bool = False


@dataclass
class NaiveStats:
    tool_calls: int = 0  # calls the model asked for
    dispatches: Counter[str] = field(default_factory=Counter)  # by path
    timeouts: int = 0
    redeliveries: int = 0
    crashes: int = 0
    client_submissions: int = 0


class NaiveCoordinator:
    """The naive loop. ``endpoints`` maps tool names to URLs; client tools are answered
    through ``pending_client_calls`` / ``submit_tool_outputs`` by the backend."""

    def __init__(
        self,
        model_url: str,
        endpoints: dict[str, str],
        *,
        workers: int,
        slots: int,
        tool_timeout_s: float,
        attempts: int = 3,
        poll_after_s: float = 0.5,
        redeliver_after_s: float = 2.0,
    ) -> None:
        self.endpoints = endpoints
        self.workers = workers
        self.tool_timeout_s = tool_timeout_s
        self.attempts = attempts
        self.poll_after_s = poll_after_s
        self.redeliver_after_s = redeliver_after_s
        self.model = openai.OpenAI(base_url=model_url + "/v1", api_key="naive", max_retries=0)
        self.http = httpx2.Client(limits=httpx2.Limits(max_connections=128))
        self.lock = threading.Condition()
        self.store: dict[str, list[Item]] = {}
        self.outcomes: dict[str, Outcome] = {}
        self.pending: dict[str, _Pending] = {}  # call_id -> unanswered dispatch
        self.client_calls: dict[str, str] = {}  # call_id -> thread, unanswered client calls
        self.epochs = [0] * workers
        self.stats = NaiveStats()
        self.jobs: queue.Queue[str] = queue.Queue()
        self.stopping = threading.Event()
        self.tools = ThreadPoolExecutor(64, thread_name_prefix="naive-dispatch")
        self.threads = [
            threading.Thread(target=self._work, args=(n // slots,), daemon=True)
            for n in range(workers * slots)
        ]
        self.threads.append(threading.Thread(target=self._poll, daemon=True))
        self.timers: list[threading.Timer] = []

    # -- the backend's side ---------------------------------------------------------------

    def start(self) -> NaiveCoordinator:
        for thread in self.threads:
            thread.start()
        return self

    def submit_turn(self, thread: str, text: str) -> None:
        """A user turn: store the message, queue a job (no dedup: twice is twice)."""
        with self.lock:
            self.store.setdefault(thread, []).append({"role": "user", "content": text})
            self.outcomes.setdefault(thread, Outcome(submitted_at=time.monotonic()))
        self.jobs.put(thread)

    def pending_client_calls(self) -> list[tuple[str, str]]:
        """(thread, call_id) of client calls waiting for an output."""
        with self.lock:
            return [(thread, call_id) for call_id, thread in self.client_calls.items()]

    def submit_tool_outputs(self, thread: str, outputs: list[tuple[str, Any]]) -> None:
        """The backend's outputs: appended as they arrive (a repeat is appended again)."""
        with self.lock:
            self.stats.client_submissions += 1
            for call_id, output in outputs:
                self.client_calls.pop(call_id, None)
                self._append_output(thread, call_id, output)

    def crash_worker(self, index: int) -> None:
        """kill -9 of worker ``index``: its jobs are abandoned and delivered again later."""
        with self.lock:
            self.epochs[index % self.workers] += 1
            self.stats.crashes += 1
            self.lock.notify_all()

    def busy(self) -> bool:
        with self.lock:
            unfinished = [o for o in self.outcomes.values() if not o.completed]
            return any(o.bricked is None and o.failed is None for o in unfinished)

    def stop(self) -> None:
        self.stopping.set()
        for timer in self.timers:
            timer.cancel()
        with self.lock:
            self.lock.notify_all()
        for thread in self.threads:
            thread.join(timeout=5)
        self.tools.shutdown(wait=False, cancel_futures=True)
        self.http.close()
        self.model.close()

    # -- workers --------------------------------------------------------------------------

    def _work(self, worker: int) -> None:
        while not self.stopping.is_set():
            try:
                thread = self.jobs.get(timeout=JOB_POLL_S)
            except queue.Empty:
                continue
            with self.lock:
                epoch = self.epochs[worker]
            try:
                self._answer(thread, worker, epoch)
            except Crashed:
                self._redeliver(thread)
            except Exception as err:  # a naive loop logs and moves on
                with self.lock:
                    self.outcomes[thread].failed = f"{type(err).__name__}: {err}"

    def _redeliver(self, thread: str) -> None:
        def put_back() -> None:
            with self.lock:
                self.stats.redeliveries += 1
            self.jobs.put(thread)

        timer = threading.Timer(self.redeliver_after_s, put_back)
        timer.daemon = True
        self.timers.append(timer)
        timer.start()

    def _alive(self, worker: int, epoch: int) -> None:
        if self.epochs[worker] != epoch or self.stopping.is_set():
            raise Crashed

    def _answer(self, thread: str, worker: int, epoch: int) -> None:
        """One job: call the model, save, dispatch, wait for results; until a text answer."""
        while True:
            with self.lock:
                self._alive(worker, epoch)
                conversation = list(self.store[thread])  # load
            try:
                response = self.model.responses.create(model=MODEL, input=conversation)  # type: ignore[arg-type]
            except openai.BadRequestError as err:
                with self.lock:
                    self.outcomes[thread].bricked = error_message(err)
                return
            items: list[Item] = []
            text = ""
            for out in response.output:
                if out.type == "function_call":
                    items.append(
                        {
                            "type": "function_call",
                            "call_id": out.call_id,
                            "name": out.name,
                            "arguments": out.arguments,
                        }
                    )
                elif out.type == "message":
                    text += "".join(c.text for c in out.content if c.type == "output_text")
            if text:
                items.insert(0, {"role": "assistant", "content": text})
            with self.lock:
                self._alive(worker, epoch)
                self.store[thread] = conversation + items  # save (last writer wins)
                calls = [i for i in items if i.get("type") == "function_call"]
                if not calls:
                    outcome = self.outcomes[thread]
                    outcome.completed = True
                    outcome.completed_at = time.monotonic()
                    return
                self.stats.tool_calls += len(calls)
                for call in calls:
                    self._dispatch_later(thread, call)
            self._wait_for_results(thread, [c["call_id"] for c in calls], worker, epoch)

    def _dispatch_later(self, thread: str, call: Item) -> None:
        """Register a call and send it (the callback path); lock held."""
        arguments = json.loads(call["arguments"] or "{}")
        if call["name"] == CLIENT_TOOL:
            self.client_calls[call["call_id"]] = thread
            return
        self.pending[call["call_id"]] = _Pending(thread, call["name"], arguments, time.monotonic())
        self.tools.submit(
            self._dispatch, thread, call["call_id"], call["name"], arguments, "callback"
        )

    def _wait_for_results(self, thread: str, call_ids: list[str], worker: int, epoch: int) -> None:
        deadline = time.monotonic() + TURN_WAIT_S
        with self.lock:
            while True:
                self._alive(worker, epoch)
                answered = {
                    i.get("call_id")
                    for i in self.store[thread]
                    if i.get("type") == "function_call_output"
                }
                if answered.issuperset(call_ids):
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"tool results for {thread} never all arrived")
                self.lock.wait(WAIT_SLICE_S)

    # -- dispatch ---------------------------------------------------------------------------

    def _poll(self) -> None:
        """The poller: a call without a result after ``poll_after_s`` is sent again."""
        while not self.stopping.wait(WAIT_SLICE_S / 2):
            now = time.monotonic()
            with self.lock:
                late = [
                    (call_id, p)
                    for call_id, p in self.pending.items()
                    if not p.polled and now - p.sent_at > self.poll_after_s
                ]
                for _, p in late:
                    p.polled = True
            for call_id, p in late:
                self.tools.submit(self._dispatch, p.thread, call_id, p.name, p.arguments, "poll")

    def _dispatch(
        self, thread: str, call_id: str, name: str, arguments: dict[str, Any], path: str
    ) -> None:
        output: Any = {"error": f"{name} timed out {self.attempts} times"}
        for _ in range(self.attempts):
            with self.lock:
                self.stats.dispatches[path] += 1
            headers = {"Idempotency-Key": uuid.uuid4().hex, "X-Outbox-Tool-Call-Id": call_id}
            try:
                response = self.http.post(
                    self.endpoints[name],
                    json=arguments,
                    headers=headers,
                    timeout=self.tool_timeout_s,
                )
            except httpx2.TimeoutException:
                with self.lock:
                    self.stats.timeouts += 1
                continue  # retry: a fresh key, since "the last attempt failed"
            except httpx2.HTTPError as err:
                output = {"error": str(err)}
                break
            with contextlib.suppress(ValueError):
                output = response.json()
            break
        with self.lock:
            self.pending.pop(call_id, None)
            self._append_output(thread, call_id, output)

    def _append_output(self, thread: str, call_id: str, output: Any) -> None:
        """Store a result as it arrives (lock held)."""
        text = output if isinstance(output, str) else json.dumps(output)
        self.store[thread].append(
            {"type": "function_call_output", "call_id": call_id, "output": text}
        )
        self.lock.notify_all()


def error_message(err: openai.APIStatusError) -> str:
    """The provider's error message of a refused request."""
    body = err.body
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return str(body["message"])
    return err.message


def history_problems(items: list[Item]) -> Counter[str]:
    """Orphan and duplicate tool outputs in a stored conversation."""
    called: set[str] = set()
    answered: set[str] = set()
    problems: Counter[str] = Counter()
    for item in items:
        if item.get("type") == "function_call":
            called.add(item["call_id"])
        elif item.get("type") == "function_call_output":
            if item["call_id"] not in called:
                problems["orphan"] += 1
            elif item["call_id"] in answered:
                problems["duplicate"] += 1
            answered.add(item["call_id"])
    return problems
