"""``bench.inflight_wide`` runs end to end with tiny numbers (a smoke test: no timing asserts).

It runs ``python -m bench.inflight_wide`` as a user would, in a subprocess against the test
server, a curve of two points over two relay processes and two fake model/tool processes:
every run completes, each fake answered its own runs' every request, none twice, and the
chart is written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.relay_harness import REPO

pytest.importorskip("psutil", reason="the bench extra is not installed (bench smoke only)")
pytest.importorskip("matplotlib", reason="the bench extra is not installed (bench smoke only)")


@pytest.mark.timeout(300)
def test_the_wide_inflight_bench_runs_with_tiny_numbers(server_url, tmp_path):
    figures_path, chart = tmp_path / "wide.json", tmp_path / "wide.png"
    command = [sys.executable, "-m", "bench.inflight_wide", "--curve", "20,40"]
    command += ["--relays", "2", "--fakes", "2", "--model-s", "0.2", "--tool-s", "0.05"]
    command += ["--json", str(figures_path), "--chart", str(chart)]
    # No wait for the sockets of the tests around it to close (bench.inflight.settle_sockets).
    env = {**os.environ, "OUTBOX_DATABASE_URL": server_url, "OUTBOX_BENCH_SETTLE_S": "0"}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=290)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| runs in flight |" in done.stdout
    cases = json.loads(figures_path.read_text())
    assert [case["runs"] for case in cases] == [20, 40]
    for case in cases:
        runs = case["runs"]
        assert case["completed"] == runs
        assert case["duplicates"] == 0
        assert case["model_requests"] == 2 * runs
        assert case["model_requests_per_fake"] == [runs, runs]  # half the runs' two turns each
        assert case["tool_requests"] == 2 * runs
        assert (case["relays"], case["fakes"]) == (2, 2)
        assert 0 < case["max_db_connections"] <= 8 * case["relays"]
        assert case["peak_relay_rss_mb"] > 0
    assert chart.stat().st_size > 0
