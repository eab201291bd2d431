"""In-process tool callables for the tests, registered as ``tests.tooling:<name>``.

A relay process imports them by path like any python tool, so they keep their evidence
where a test in another process can read it: ``record_run`` appends one line per
execution to a file named in the arguments.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from outbox import config
from outbox.testing.tools import credential_encodings

RELEASE = threading.Event()  # set by a test to let ``block`` return
BLOCK_MAX_S = 10.0  # seconds ``block`` waits at most, so no test can hang on it
CRASH_SLEEP_S = 60.0  # seconds the first execution of ``record_run`` sleeps (it is killed)


def echo(**arguments: Any) -> dict[str, Any]:
    return {"echo": arguments}


def boom(**arguments: Any) -> None:
    raise ValueError(f"boom with {sorted(arguments)}")


def exits(**arguments: Any) -> None:
    raise SystemExit(3)


def count_call(path: str, **arguments: Any) -> dict[str, Any]:
    """Append a line to ``path`` per execution: a test counts how often a call really ran."""
    with open(path, "a") as handle:
        handle.write("ran\n")
    return {"ran": True}


def pause(seconds: float, **arguments: Any) -> dict[str, Any]:
    """A slow tool: takes ``seconds`` to answer."""
    time.sleep(seconds)  # the tool's own work, not a wait for another thread
    return {"paused": seconds}


def block(**arguments: Any) -> dict[str, Any]:
    """Wait until a test sets ``RELEASE`` (bounded): longer than any tool timeout used."""
    RELEASE.wait(BLOCK_MAX_S)
    return {"released": True}


def hang(**arguments: Any) -> None:
    """Never return: a tool stuck for good (only ever run in a relay process of its own)."""
    threading.Event().wait()


def too_big(**arguments: Any) -> str:
    return "x" * (config.MAX_PAYLOAD_BYTES + 1)


def not_json(**arguments: Any) -> object:
    return object()


def record_run(path: str, **arguments: Any) -> dict[str, Any]:
    """Append a line to ``path``; the first execution then sleeps (to be killed mid-call)."""
    with open(path, "a") as handle:
        handle.write("ran\n")
    runs = len(Path(path).read_text().splitlines())
    if runs == 1:
        time.sleep(CRASH_SLEEP_S)  # the call in flight when the test kills the relay
    return {"runs": runs}


def with_context(outbox_context: Any, **arguments: Any) -> dict[str, Any]:
    """Answer what the relay handed it, secret included (the relay must cut that out)."""
    return {
        "arguments": arguments,
        "idempotency_key": outbox_context.idempotency_key,
        "credentials": outbox_context.credentials,
        "tenant_id": outbox_context.tenant_id,
    }


def secret_in_a_tuple(outbox_context: Any, **arguments: Any) -> dict[str, Any]:
    """Answer the secret inside a tuple (JSON makes it a list) and as a tuple's only item."""
    (secret,) = outbox_context.credentials.values()
    return {"pair": ("token", secret), "nested": [{"inner": (secret,)}]}


def secret_re_encoded(outbox_context: Any, **arguments: Any) -> dict[str, Any]:
    """Answer the secret in each form a careless tool re-encodes it in."""
    (secret,) = outbox_context.credentials.values()
    return credential_encodings(secret)


UNSTORABLE: dict[str, Any] = {
    "nul": {"note": "a\x00b"},
    "nan": {"score": float("nan")},
    "surrogate": {"text": "\ud800"},
}


def unstorable(kind: str, path: str, **arguments: Any) -> Any:
    """Record the call in ``path`` (as ``count_call``), then return what PostgreSQL or
    Python cannot store: ``UNSTORABLE[kind]``, or for ``deep`` a list nested 100,000 deep."""
    with open(path, "a") as handle:
        handle.write("ran\n")
    if kind != "deep":
        return UNSTORABLE[kind]
    value: list[Any] = []
    for _ in range(100_000):
        value = [value]
    return value
