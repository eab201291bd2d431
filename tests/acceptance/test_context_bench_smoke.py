"""``bench.context`` runs end to end with tiny numbers (a smoke test: no timing asserts).

It runs ``python -m bench.context`` as a user would, in a subprocess against the test
server: 12 steps of 4 KB results under an 8,192-token window compact and stay under it,
and the CPU part measures a few short runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.relay_harness import REPO

pytest.importorskip("psutil", reason="the bench extra is not installed (bench smoke only)")


@pytest.mark.timeout(300)
def test_the_context_bench_runs_with_tiny_numbers(server_url):
    command = [sys.executable, "-m", "bench.context", "--steps", "12", "--bytes", "4096",
               "--window", "8192", "--runs", "5", "--rounds", "1"]  # fmt: skip
    env = {**os.environ, "OUTBOX_DATABASE_URL": server_url}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=290)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    for api in ("responses", "chat"):
        assert result[api]["run"] == "completed"
        assert result[api]["turns"] == 13
        assert result[api]["summaries"] >= 1
        assert result[api]["over_window"] == 0
    assert result["relay_cpu_ms_per_run"] > 0
