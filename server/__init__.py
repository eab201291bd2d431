"""``outbox serve``: the HTTP surface of the outbox (OpenAI's Assistants protocol, our run
event stream over SSE), an ASGI app on Starlette served by uvicorn.

It is a thin layer over the library: every state change goes through ``outbox.writer``,
``outbox.lifecycle``, ``outbox.assistants`` and ``outbox.keys`` in one transaction per
request, acting as the role ``outbox_api`` scoped to the API key's tenant, so row-level
security decides what a request may see and change. The relay stays a separate process.
"""

from __future__ import annotations

from importlib import resources

QUERIES = resources.files(__name__) / "queries"  # the server's named reads (api.sql)
