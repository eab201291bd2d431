"""MCP tool servers in the registry.

Revision ID: 0032
Revises: 0030
Create Date: 2026-11-27

``mcp_servers`` holds how the relay reaches each registered MCP server; a tool version with
``executor = 'mcp'`` names its server and its name there (``mcp_server``, ``mcp_tool``) and
keeps the annotations it was listed with. The SQL is ``0032_mcp_servers.sql`` beside this
file, frozen.
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0032"
down_revision = "0031"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0032_mcp_servers.sql")

DOWNGRADE = """
ALTER TABLE {s}.tool_calls DROP CONSTRAINT tool_calls_executor_check;
ALTER TABLE {s}.tool_calls ADD CONSTRAINT tool_calls_executor_check
    CHECK (executor IN ('http', 'client', 'python', 'none'));
ALTER TABLE {s}.tools DROP CONSTRAINT tools_mcp_has_server;
ALTER TABLE {s}.tools DROP CONSTRAINT tools_executor_check;
ALTER TABLE {s}.tools ADD CONSTRAINT tools_executor_check
    CHECK (executor IN ('http', 'client', 'python'));
ALTER TABLE {s}.tools DROP COLUMN annotations, DROP COLUMN mcp_tool, DROP COLUMN mcp_server;
DROP TABLE {s}.mcp_servers;
"""


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql(DOWNGRADE)
