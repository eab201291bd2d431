"""Model fallbacks, a circuit per model base URL, and routing rules pinned per run.

Revision ID: 0052
Revises: 0051
Create Date: 2026-12-07

``model_fallbacks`` says where a model's turns go when its server fails them (after a
number of failed attempts of a turn, or while its base URL's circuit is open), across
models, base URLs and the two model APIs. ``model_circuits`` holds one circuit per base
URL, shared by every relay, written by ``report_model_calls_v1`` from the completer's
transaction and probed through ``claim_model_probe_v1``. ``model_routes`` holds each
tenant's routing rules by version; a trigger pins a new run to the newest
(``runs.route_version``). ``model_turns`` records the model and base URL that answered;
``record_model_turns_v1`` writes them, prices the turn by that model and journals the
choice. The SQL is ``0052_model_fallback.sql`` beside this file, frozen; the downgrade
drops them and puts back 0046's ``record_model_turns_v1``
(``0052_model_fallback_down.sql``).
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0052"
down_revision = "0051"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0052_model_fallback.sql")
DOWN = frozen_sql(__file__, "0052_model_fallback_down.sql")


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql(DOWN)
