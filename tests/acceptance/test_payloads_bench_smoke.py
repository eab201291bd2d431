"""``bench.payloads`` runs end to end with tiny numbers (a smoke test: no timing asserts).

It runs ``python -m bench.payloads`` as a user would, in a subprocess against the test
server, and checks what each case stored: by reference, one body per distinct result (and
the warm-up call's), one for a result repeated; inline, none.
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
def test_the_payloads_bench_runs_with_tiny_numbers(server_url):
    command = [sys.executable, "-m", "bench.payloads", "--calls", "3", "--bytes", "20000"]
    env = {**os.environ, "OUTBOX_DATABASE_URL": server_url}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=230)
    assert done.returncode == 0, done.stderr[-3000:]
    results = {r["case"]: r for r in json.loads(done.stdout.strip().splitlines()[-1])}
    stored = {case: r["payload_rows"] for case, r in results.items()}
    assert stored == {
        "large_distinct_inline": 0,
        "large_distinct_ref": 4,
        "large_same_inline": 0,
        "large_same_ref": 2,
        "small_inline": 0,
        "small_ref": 0,
    }
    assert all(r["wal_bytes_per_call"] > 0 for r in results.values())
