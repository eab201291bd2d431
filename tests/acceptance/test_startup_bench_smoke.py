"""``bench.startup`` runs end to end once per command (a smoke test: no timing asserts).

It runs ``python -m bench.startup 1`` as a user would, in a subprocess against the test
server, and checks that each command's CPU was measured and its scratch database dropped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psycopg

from tests.relay_harness import REPO


def test_the_startup_bench_measures_each_command(server_url):
    env = {**os.environ, "OUTBOX_DATABASE_URL": server_url}
    done = subprocess.run(
        [sys.executable, "-m", "bench.startup", "1"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(results["cpu_s_median"]) == {"relay", "runs list", "--help"}
    assert all(cpu > 0 for cpu in results["cpu_s_median"].values())
    with psycopg.connect(server_url) as conn:
        left = conn.execute("SELECT count(*) FROM pg_database WHERE datname LIKE '%startup%'")
        assert left.fetchone() == (0,)
