"""``bench.clients`` runs end to end with tiny numbers (a smoke test: no timing asserts).

It runs ``python -m bench.clients`` as a user would, in a subprocess against the test
server, and checks that each measurement produced its figures.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from tests.relay_harness import REPO

# Looked up, not imported: importing the Agents SDK costs about 0.9 s of CPU in every
# process that collects this module, and the bench imports it in its own process.
pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("psutil") is None, reason="the bench extra is not installed"
    ),
    pytest.mark.skipif(
        importlib.util.find_spec("agents") is None,
        reason="the dev extra (openai-agents) is not installed",
    ),
]


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "measure", [["waiting", "5"], ["agents", "3"], ["shed", "5", "--queue-timeout", "1"]]
)
def test_the_clients_bench_runs_with_tiny_numbers(server_url, measure):
    command = [sys.executable, "-m", "bench.clients", *measure]
    # No wait for the sockets of the tests around it to close (bench.inflight.settle_sockets).
    env = {**os.environ, "OUTBOX_DATABASE_URL": server_url, "OUTBOX_BENCH_SETTLE_S": "0"}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=230)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    if measure[0] == "waiting":
        assert results["api"]["wall_s"] > 0 and results["api"]["server_db_connections"] > 0
        # The writer API's legs: queued first, and started live beside the relay.
        assert results["writer_wall_s"] > 0 and results["live_writer_wall_s"] > 0
        assert 0 < results["live_writer_stored_after_s"] <= results["live_writer_wall_s"]
    elif measure[0] == "shed":
        assert results["answers"] == {"completed": 5} and results["refusals_logged"] >= 0
        assert (results["runs_started"], results["runs_started_twice"]) == (5, 0)
    else:
        # The three, and the one run before the clock.
        assert results["server_runs_completed"] == results["server_runs"] == 4
        assert results["relay_leg_extra_s_p50"] > 0 and results["client_leg_extra_s_p50"] > 0
