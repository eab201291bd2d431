"""``outbox relay``'s options default to ``RelayConfig``'s, and what the README says they are.

The CLI once restated each default beside the config (issue 15 item 7): two numbers that
drift apart silently. Each option's default must be the config's, read from the same field,
and the figures in parentheses of the README and docs/relay.md (``--concurrency`` (1000))
must be those values.
"""

from __future__ import annotations

import re

import pytest

import cli
from relay.config import RelayConfig
from tests.relay_harness import REPO

DEFAULTS = RelayConfig(database_url="")
# option -> the RelayConfig field it sets
FIELDS = {
    "--concurrency": "concurrency",
    "--tenant-share": "tenant_share",
    "--db-connections": "db_connections",
    "--inprocess-slots": "inprocess_slots",
    "--inprocess-threads": "inprocess_threads",
    "--lease": "lease_s",
    "--poll-interval": "poll_interval_s",
    "--grace": "grace_s",
    "--retry-base": "retry_base_s",
    "--rescue-interval": "rescue_interval_s",
    "--max-model-answer": "max_model_answer_bytes",
}


def relay_options() -> dict[str, object]:
    return {opt: param.default for param in cli.relay_command.params for opt in param.opts}


@pytest.mark.parametrize("option,field", FIELDS.items())
def test_each_option_defaults_to_the_config(option, field):
    assert relay_options()[option] == getattr(DEFAULTS, field)


@pytest.mark.parametrize("page", ["README.md", "docs/relay.md"])
def test_the_docs_state_the_configs_defaults(page):
    stated = re.findall(r"`(--[a-z-]+)` \(([0-9.]+)\)", (REPO / page).read_text())
    assert stated, f"{page} no longer states the relay's defaults"
    for option, value in stated:
        if option in FIELDS:
            assert float(value) == getattr(DEFAULTS, FIELDS[option]), option
