"""agent-outbox: a Postgres transactional outbox for tool-using AI agent runs.

The library half: schema access, the writer API that backends call inside their own
transaction (``writer``, ``lifecycle``; ``aio`` for asyncio), history replay (``history``),
the model provider adapters (``providers``), the tool registry and its idempotency modes
(``registry``), run statuses and dedup keys (``constants``), the migrations and SQL it
ships (``migrations``, ``sql``), and ``testing``, the
test doubles users import to test their own agents. It never imports the relay, the CLI
or the demo.
"""
