"""agent-outbox: a Postgres transactional outbox for tool-using AI agent runs.

The library half: schema access, the writer API that backends call inside their own
transaction, history replay, and provider adapters. It never imports the relay or the CLI.
"""
