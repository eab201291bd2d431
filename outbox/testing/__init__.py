"""Test doubles for testing your own agents: a scripted model, audited tools, a relay.

A supported module (docs/testing.md), used by this project's own tests and demo too:

- ``ScriptedModel``: an OpenAI-compatible model server (Responses and chat completions)
  answering from scripts, as strict as OpenAI about tool-call pairing, with faults;
- ``FakeToolService`` / ``FakeTool``: HTTP tools that keep an audit of every delivery and
  side effect (idempotency keys honoured, looked up or ignored), with faults;
- ``FakeOIDCProvider``: an OpenID Connect provider that signs in whom a test scripts
  (the console's sign-in), with spoilt ID tokens on demand;
- ``relay_process`` / ``wait_for_run``: run ``outbox relay`` on your test database and
  wait for a run to end.

They are real local HTTP servers and processes, never patched clients. Design choice:
names are resolved lazily so that ``python -m outbox.testing.scripted_model`` does not import its
own module twice.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from outbox.testing.oidc import FakeOIDCProvider
    from outbox.testing.relay import relay_process, wait_for_run
    from outbox.testing.scripted_model import ModelFaults, ScriptedModel
    from outbox.testing.server import FakeServer
    from outbox.testing.tools import FakeTool, FakeToolService, fingerprint

__all__ = [
    "FakeOIDCProvider",
    "FakeServer",
    "FakeTool",
    "FakeToolService",
    "ModelFaults",
    "ScriptedModel",
    "fingerprint",
    "relay_process",
    "wait_for_run",
]

_HOMES = {
    "FakeOIDCProvider": "outbox.testing.oidc",
    "FakeServer": "outbox.testing.server",
    "FakeTool": "outbox.testing.tools",
    "FakeToolService": "outbox.testing.tools",
    "ModelFaults": "outbox.testing.scripted_model",
    "ScriptedModel": "outbox.testing.scripted_model",
    "fingerprint": "outbox.testing.tools",
    "relay_process": "outbox.testing.relay",
    "wait_for_run": "outbox.testing.relay",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
