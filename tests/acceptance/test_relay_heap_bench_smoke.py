"""``bench.inflight_wide --tracemalloc`` runs end to end with tiny numbers (a smoke test).

The relay runs under ``bench.relay_heap`` (``tracemalloc`` on, snapshots on a signal); the
bench prints what its heap held per run while every run waited for its model and for its
tools, against the first lease, by line and by traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.relay_harness import REPO

pytest.importorskip("psutil", reason="the bench extra is not installed (bench smoke only)")


@pytest.mark.timeout(300)
def test_the_heap_of_runs_in_flight_is_broken_down_by_traceback(server_url):
    command = [sys.executable, "-m", "bench.inflight_wide", "--runs", "20", "--model-s", "1"]
    command += ["--tool-s", "0.5", "--tracemalloc", "8"]
    env = {**os.environ, "OUTBOX_DATABASE_URL": server_url, "OUTBOX_BENCH_SETTLE_S": "0"}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=290)
    assert done.returncode == 0, done.stderr[-3000:]
    for moment in ("every first turn sent", "every tool call sent"):
        assert f"relay 0, {moment}, against the first lease" in done.stderr
    assert "bytes a run" in done.stderr
    assert "-- by traceback, bytes a run" in done.stderr
    # the relay's own lines among them (which ones lead at 20 runs moves with the timing)
    tracebacks = done.stderr.split("-- by traceback, bytes a run", 1)[1]
    assert "relay/" in tracebacks


def test_tracemalloc_needs_a_frame(server_url):
    command = [sys.executable, "-m", "bench.inflight_wide", "--tracemalloc", "0"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--tracemalloc FRAMES must be at least 1" in done.stderr
