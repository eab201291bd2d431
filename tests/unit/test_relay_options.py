"""``outbox relay``'s options default to ``RelayConfig``'s, and what the README says they are.

The CLI once restated each default beside the config: two numbers that
drift apart silently. Each option's default must be the config's, read from the same field,
and the figures in parentheses of the README and docs/relay.md (``--db-connections`` (8))
must be those values.

``--concurrency`` has no fixed default: a fixed 1,000 capped a process
silently. It is derived from the process's open-files limit, which a relay process raises
to the hard limit first, and the memory (``relay.capacity.default_concurrency``).
"""

from __future__ import annotations

import re
import resource
import subprocess
import sys

import pytest

from outbox.commands.relay import relay_command
from outbox.relay.capacity import default_concurrency
from outbox.relay.config import RelayConfig, memory_limit
from tests.relay_harness import REPO

DEFAULTS = RelayConfig(database_url="")
# option -> the RelayConfig field it sets
FIELDS = {
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
    "--metrics-host": "metrics_host",
}


def relay_options() -> dict[str, object]:
    return {opt: param.default for param in relay_command.params for opt in param.opts}


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


@pytest.mark.parametrize("page", ["README.md", "docs/relay.md"])
def test_the_docs_state_no_fixed_concurrency(page):
    assert relay_options()["--concurrency"] is None  # derived when the relay starts
    assert not re.search(r"`--concurrency` \([0-9.,]+\)", (REPO / page).read_text())


def test_a_relay_process_raises_its_open_files_limit_and_derives_its_concurrency():
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard <= 1024:
        pytest.skip(f"the hard open-files limit ({hard}) leaves nothing to raise")
    program = (
        "from relay.config import RelayConfig, raise_open_files_limit\n"
        "embedded = RelayConfig(database_url='').concurrency\n"
        "raised = raise_open_files_limit()\n"
        "print(embedded, raised, RelayConfig(database_url='').concurrency)\n"
    )

    def low_soft_limit() -> None:  # as a service manager starts a process: soft 1024
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))

    done = subprocess.run(
        [sys.executable, "-c", program],
        cwd=REPO,
        capture_output=True,
        timeout=60,
        preexec_fn=low_soft_limit,
    )
    assert done.returncode == 0, done.stderr.decode()
    embedded, raised, derived = (int(v) for v in done.stdout.split())
    # An application embedding the worker keeps its limits, and a default that fits them.
    assert embedded == default_concurrency(1024, memory_limit()) == 384
    assert raised == hard
    assert derived == default_concurrency(hard, memory_limit()) > embedded
