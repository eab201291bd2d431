"""The benchmark runs end to end with tiny numbers (CI smoke test: no timing asserts).

It runs ``python -m bench`` as a user would, in a subprocess against the test server, and
checks that every section produced a figure and the table was printed; what the figures
are is the benchmark's business, not the test suite's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.relay_harness import REPO

pytest.importorskip("pgqueuer", reason="the bench extra is not installed")
pytest.importorskip("matplotlib", reason="the bench extra is not installed")


@pytest.mark.timeout(180)
def test_bench_runs_with_tiny_numbers(server_url, tmp_path):
    out = tmp_path / "bench.json"
    command = [sys.executable, "-m", "bench", "--quick", "--calls", "300", "--http-calls", "100"]
    command += ["--processes", "1,2", "--latency-intents", "20", "--notify-commits", "5"]
    command += ["--inflight", "20:0.2:0.1:2", "--serve-runs", "10", "--poster-requests", "200"]
    command += ["--mcp-calls", "20", "--tracing", "20:0.2:0.1:2", "--footprint-runs", "5"]
    command += ["--json", str(out), "--no-chart"]
    # No wait for the sockets of the tests around it to close (bench.inflight.settle_sockets).
    env = {**os.environ, "OUTBOX_DATABASE_URL": server_url, "OUTBOX_BENCH_SETTLE_S": "0"}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "### Relay overhead" in done.stdout and "relay / raw" in done.stdout
    results = json.loads(out.read_text())
    assert set(results["relay"]) == set(results["raw"]) == {"1", "2"}
    assert all(rate > 0 for rate in results["relay"].values())
    assert results["pgqueuer"] > 0
    assert set(results["http"]["relay"]) == {"1", "2"}
    assert results["latency"]["n"] == 20
    assert results["notify"]["on"] > 0 and results["notify"]["off"] > 0
    [case] = results["inflight"]
    assert case["completed"] == 20 and case["duplicates"] == 0 and case["wall_s"] > 0
    assert "### Runs in flight" in done.stdout
    traced = results["tracing"]
    assert len(traced["off_ms_per_run"]) == len(traced["on_ms_per_run"]) == 1
    assert traced["exports"] > 0  # the relay with tracing on exported its spans
    assert all(f["completed"] == 20 for way in ("off", "on") for f in traced["measurements"][way])
    assert "### Tracing off and on" in done.stdout
    assert results["serve"]["runs"] == 10 and results["serve"]["api_stream"]["per_s"] > 0
    assert "### Starting a run: `outbox serve`" in done.stdout
    clients = results["poster"]["cpu_ms"]
    assert set(clients) == {"relay.poster", "httpx2.AsyncClient"}
    assert all(v > 0 for values in clients.values() for v in values)
    assert "### CPU per request of the relay's HTTP client" in done.stdout
    for answers in ("sse", "json", "raw"):
        mcp = results["mcp"][answers]
        assert mcp["overhead"]["mcp_p50_ms"] > 0 and mcp["in_flight"]["failed"] == 0
        assert answers == "raw" or mcp["sdk_baseline"]["failed"] == 0
    assert "### MCP tool calls beside HTTP tool calls" in done.stdout
    footprint = results["footprint"]
    assert footprint["calls"] == 20 and footprint["total"]["journal_rows"] > 0
    assert footprint["total"]["wal_bytes"] > 0 and footprint["total"]["table_bytes"] > 0
    assert "### Journal rows, WAL bytes and table bytes per completed tool call" in done.stdout
