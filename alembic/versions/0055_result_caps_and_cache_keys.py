"""Tool results the model sees by head and handle, and the prompt_cache_key switch per model.

Revision ID: 0055
Revises: 0054
Create Date: 2026-12-07

``tools.model_result_cap``: the most bytes of a result of the tool the model is given; a
result past it reaches the model as its first part and a handle that the built-in
``read_result`` tool pages (NULL: the platform's default, 0: no cap). ``tool_calls`` may
be run by the relay itself (``executor`` ``builtin``: ``read_result``, a read of the
thread). ``model_catalogue.prompt_cache_key``: which ``prompt_cache_key`` a model's
requests carry (``derived``: the caller's, else one derived from the thread; ``caller``:
only a caller's; ``never``: none). The SQL is ``0055_result_caps_and_cache_keys.sql``
beside this file, frozen; ``0055_result_caps_and_cache_keys_down.sql`` undoes it.
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0055"
down_revision = "0054"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0055_result_caps_and_cache_keys.sql")
DOWN = frozen_sql(__file__, "0055_result_caps_and_cache_keys_down.sql")


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql(DOWN)
