"""Ports for the tests' server processes: no two live processes hand out the same one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests import helpers

ROOT = Path(__file__).resolve().parents[2]
CLAIM = "from tests import helpers; print(helpers.free_port(), flush=True); input()"


def test_processes_alive_at_once_hand_out_ports_from_blocks_of_their_own():
    """As in two checkouts' suites run at once: the same xdist worker name in each, and
    each process holding its block while it lives."""
    mine = helpers.free_port() // helpers.PORTS_PER_BLOCK
    env = {"PYTEST_XDIST_WORKER": "gw0", "PATH": "/usr/bin:/bin"}
    others = [
        subprocess.Popen(
            [sys.executable, "-c", CLAIM],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    try:
        blocks = [int(p.stdout.readline()) // helpers.PORTS_PER_BLOCK for p in others]  # type: ignore[union-attr]
    finally:
        for p in others:
            p.communicate("\n", timeout=30)
    assert len({mine, *blocks}) == 4, (mine, blocks)
