"""`outbox demo` end to end, small: the outbox side is clean under the incident's faults,
and the naive coordinator, under the very same faults, is not (the faults have teeth).

It runs the real command (`python -m cli demo`, what `make demo` runs) against the test
server, in a database of its own, and reads the figures from its JSON report; every figure
there comes from the fake services' audit trails and from replaying the stored threads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import psycopg

from tests.relay_harness import REPO


def test_demo_is_clean_on_our_side_and_not_on_the_naive_side(server_url, tmp_path):
    name = f"outbox_demo_{uuid.uuid4().hex[:10]}"
    report = tmp_path / "demo.json"
    env = {**os.environ, "OUTBOX_HOME": str(tmp_path / "home")}
    command = [sys.executable, "-m", "outbox.commands", "demo", "--runs", "20", "--processes", "2"]
    command += ["--seed", "3", "--json", str(report), "--database-url", server_url]
    command += ["--database-name", name]
    try:
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, timeout=100)
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    out = done.stdout.decode()
    assert done.returncode == 0, out + done.stderr.decode()[-3000:]
    data = json.loads(report.read_text())
    ours, naive = data["outbox"], data["naive"]

    assert data["ok"] and ours["clean"]
    assert ours["runs"] == {"completed": 20}
    for service in ours["services"].values():
        assert service["effects"] == 20  # one ticket, one e-mail, one charge per conversation
        assert service["duplicates_same_call"] == service["duplicates_same_request"] == 0
    assert ours["orphan_results"] == ours["repaired_threads"] == ours["rejected_threads"] == 0
    assert ours["stuck_requires_action"] == ours["unfinished"] == 0
    assert ours["runs_per_turn_violations"] == ours["noop_violations"] == 0
    injected = ours["injected"]
    assert injected["relay processes killed (-9)"] >= 2
    assert injected["tool results re-reported"] > 0 and injected["batch deliveries re-polled"] > 0
    assert injected.get("user turns deduplicated", 0) == ours["double_submitted"]
    # The faults really bit: the timeouts forced retries, answered from the key store or by
    # a lookup, never by a second effect.
    assert ours["services"]["email"]["replayed"] + ours["services"]["ticketing"]["lookups"] > 0

    # The same scenario through the naive coordinator: duplicates and bricked threads.
    assert naive["duplicate_side_effects"] > 0
    assert naive["services"]["ticketing"]["duplicates_same_call"] > 0
    assert naive["rejected_threads"] > 0
    assert "DUPLICATE side effects" in out and "naive" in out


def test_demo_without_the_openai_package_names_the_extra_to_install(tmp_path):
    # The product no longer depends on the SDK, so `pip install -e .` leaves it out; the
    # process is made to find no `openai` package, as in such an install.
    program = "import sys; sys.modules['openai'] = None; import cli; cli.main()"
    env = {**os.environ, "OUTBOX_HOME": str(tmp_path / "home")}
    done = subprocess.run(
        [sys.executable, "-c", program, "demo", "--runs", "1"],
        cwd=REPO,
        env=env,
        capture_output=True,
        timeout=60,
    )
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert "error: `outbox demo` needs the openai package" in err
    assert "[demo]" in err and "Traceback" not in err
