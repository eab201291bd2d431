"""Local HTTP fakes the test suite and the demo start instead of mocking clients.

``ScriptedModel`` (an OpenAI-compatible scripted model) and ``FakeToolService`` (audited
side-effecting tools). Design choice: names are resolved lazily so that
``python -m outbox.fakes.model`` does not import its own module twice.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from outbox.fakes.model import ModelFaults, ScriptedModel
    from outbox.fakes.server import FakeServer
    from outbox.fakes.tools import FakeTool, FakeToolService, fingerprint

__all__ = [
    "FakeServer",
    "FakeTool",
    "FakeToolService",
    "ModelFaults",
    "ScriptedModel",
    "fingerprint",
]

_HOMES = {
    "FakeServer": "outbox.fakes.server",
    "FakeTool": "outbox.fakes.tools",
    "FakeToolService": "outbox.fakes.tools",
    "ModelFaults": "outbox.fakes.model",
    "ScriptedModel": "outbox.fakes.model",
    "fingerprint": "outbox.fakes.tools",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
