"""``bench.fallback`` runs end to end with tiny numbers (a smoke test: no timing asserts).

It runs ``python -m bench.fallback`` as a user would, in a subprocess against the test
server: every run completes on the fallback, none twice, and the circuit opened.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.relay_harness import REPO

pytest.importorskip("psutil", reason="the bench extra is not installed (bench smoke only)")


@pytest.mark.timeout(240)
def test_the_fallback_bench_runs_with_tiny_numbers(server_url):
    command = [sys.executable, "-m", "bench.fallback", "--runs", "20", "--model-latency", "0.05"]
    env = {**os.environ, "OUTBOX_DATABASE_URL": server_url, "OUTBOX_BENCH_SETTLE_S": "0"}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=230)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["completed"] == 20
    assert figures["on_fallback"] == 40
    assert figures["on_primary"] == figures["recorded_twice"] == 0
    assert figures["open_after_s"] is not None and figures["open_after_s"] >= 0
