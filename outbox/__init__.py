"""agent-outbox: a Postgres transactional outbox for tool-using AI agent runs.

The library half: schema access, the writer API that backends call inside their own
transaction (``writer``, ``lifecycle``; ``aio`` for asyncio), history replay (``history``),
the model provider adapters (``providers``), the tool registry and its idempotency modes
(``registry``), run statuses and dedup keys (``constants``), the action layer (``policy``:
risk policies, kill switches, paused tenants; ``approvals``; ``credentials``: the
credential broker; ``budgets``: prices and the platform's limits; ``limits``: per tool and
per tenant), tenant scope and login roles bound to a tenant (``tenancy``), the API keys
and assistants of ``outbox serve`` (``keys``, ``assistants``), the operator's actions
(``ops``), the migrations and SQL it ships (``migrations``, ``sql``), and ``testing``, the
test doubles users import to test their own agents. It never imports the relay, the
server, the CLI or the demo.
"""
