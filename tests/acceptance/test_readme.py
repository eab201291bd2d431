"""What a new user reads matches what runs: every command of the README, run.

- Synopsis blocks (lines ``outbox ...`` in plain code blocks): every command and
  subcommand named answers ``--help``, and every ``--option`` shown is in that help.
- Shell blocks (```sh): run top to bottom in one bash, ``set -e``, against a fresh test
  database (``OUTBOX_DATABASE_URL``). ``make`` lines are skipped (CI runs them itself);
  ``outbox relay`` gets SIGINT a second after each of its processes logged
  ``relay.started`` (the README says Ctrl-C drains and stops) and must exit 0: counted
  from their start, not from its launch, since on a loaded machine the imports alone can
  take longer than that, and an interrupt during them is not the Ctrl-C the README speaks
  of.
  ``RUN_PREFIX`` is the newest run's id prefix.
- Python blocks: run after the shell blocks, with ``url`` the same database; those that
  talk to ``outbox serve`` (``base_url=``) need it running, so
  ``test_serve_cli.py`` runs them with it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.relay_harness import REPO

README = (REPO / "README.md").read_text()
BLOCKS = re.findall(r"```(\w*)\n(.*?)```", README, re.S)
RELAY_RUNS_S = 1  # seconds `outbox relay` runs after its processes started, before its Ctrl-C
RELAY_START_S = 60  # at most this long for it to start, else it is killed and the test fails
PLACEHOLDERS = {
    "RUN_PREFIX": "$(outbox runs list --limit 1 --json | python -c "
    "'import json, sys; print(json.load(sys.stdin)[0][\"id\"][:8])')",
}


def synopsis() -> list[tuple[list[str], list[str]]]:
    """(command path, options shown) for every command a synopsis line names."""
    found = []
    lines = [
        line
        for lang, body in BLOCKS
        if lang == ""
        for line in re.sub(r"\n\s+\[", " [", body).splitlines()
        if line.startswith("outbox ")
    ]
    for line in lines:
        tokens = line.split()[1:]
        options = re.findall(r"--[a-z][a-z-]*", line)
        subs = []
        alternatives = False  # "list|show NAME": subcommands side by side, not nested
        for token in tokens[1:]:
            if token.startswith(("-", "[-")):
                break
            alternatives = alternatives or "|" in token
            subs += [w for w in token.strip("[]").split("|") if re.fullmatch(r"[a-z][a-z-]*", w)]
        for top in tokens[0].split("|"):
            if not alternatives and len(subs) > 1:  # "console users add": one nested command
                paths = [[top, *subs]]
            else:
                paths = [[top, sub] for sub in subs] or [[top]]
            for path in paths:
                found.append((path, options if len(paths) == 1 else []))
    return found


@pytest.mark.parametrize("path,options", synopsis(), ids=lambda v: " ".join(v) or "-")
def test_every_command_of_the_synopsis_exists_with_its_options(path, options):
    from click.testing import CliRunner

    from cli import main

    done = CliRunner().invoke(main, [*path, "--help"])
    assert done.exit_code == 0, f"`outbox {' '.join(path)}`: {done.output}"
    assert [o for o in options if o not in done.output] == [], f"`outbox {' '.join(path)}`"


def test_the_shell_and_python_blocks_run(db_url, tmp_path: Path):
    script = ["set -euo pipefail"]
    for lang, body in BLOCKS:
        if lang != "sh":
            continue
        for line in body.replace("\\\n", " ").splitlines():
            if line.strip() and not line.startswith("make "):
                for name, value in PLACEHOLDERS.items():
                    line = line.replace(name, value)
                script.append(line)
    assert len(script) > 5, "the README lost its shell examples"
    wrapper = f"""
outbox() {{
    if [ "$1" = relay ]; then
        {sys.executable} -m outbox.commands "$@" 2>> relay.log &
        local pid=$! deadline=$((SECONDS + {RELAY_START_S})) processes=1 previous=
        for arg in "$@"; do
            [ "$previous" = --processes ] && processes=$arg
            previous=$arg
        done
        until [ "$(grep -c '"event": "relay.started"' relay.log 2>/dev/null)" -ge $processes ]; do
            kill -0 $pid 2>/dev/null || break  # it stopped by itself: its status says why
            [ $SECONDS -lt $deadline ] || {{ echo "outbox relay did not start" >&2; kill -9 $pid; }}
            sleep 0.1
        done
        sleep {RELAY_RUNS_S}
        kill -INT $pid 2>/dev/null || true
        wait $pid
    else
        {sys.executable} -m outbox.commands "$@"
    fi
}}
python() {{ {sys.executable} "$@"; }}
"""
    env = {**os.environ, "OUTBOX_DATABASE_URL": db_url, "OUTBOX_HOME": str(tmp_path / "home")}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run(
        ["bash", "-c", wrapper + "\n".join(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        timeout=120,
    )
    log = (tmp_path / "relay.log").read_text() if (tmp_path / "relay.log").exists() else ""
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode() + log[-2000:]
    assert not (tmp_path / "home" / "pgdata").exists(), "a README command started a server"
    out = done.stdout.decode()
    assert "created run" in out and "lookup_order" in out

    for lang, body in BLOCKS:
        if lang == "python" and "base_url=" not in body:
            namespace = {"url": db_url}
            exec(compile(body, "README.md", "exec"), namespace)
