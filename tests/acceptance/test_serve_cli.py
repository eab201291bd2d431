"""``outbox keys`` and ``outbox serve --with-relay`` as an operator runs them: separate
processes on a test database, the openai SDK as the client, a run completed end to end."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator

import httpx2
import openai
import pytest

from outbox.testing.scripted_model import ScriptedModel
from tests.helpers import free_port
from tests.relay_harness import wait_until

START_S = (
    90  # seconds `outbox serve` gets to answer: its processes import it all, on a busy machine
)

pytestmark = [
    pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:The Assistants API is deprecated:DeprecationWarning"),
]


def outbox(db_url: str, *args: str) -> str:
    env = {**os.environ, "OUTBOX_DATABASE_URL": db_url}
    done = subprocess.run(
        [sys.executable, "-m", "outbox.commands", *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def model() -> Iterator[ScriptedModel]:
    with ScriptedModel(default=[{"text": "hello from the model"}]) as server:
        yield server


def test_keys_and_serve_with_relay_complete_a_run(db_url, model, tmp_path):
    key = outbox(db_url, "keys", "create", "--tenant", "acme", "--name", "ci").strip()
    assert key.startswith("ob-")
    (listed,) = json.loads(outbox(db_url, "keys", "list", "--json"))
    assert listed["tenant_id"] == "acme" and "key_hash" not in listed
    assert key.startswith(listed["key_prefix"])

    port = free_port()
    env = {**os.environ, "OUTBOX_DATABASE_URL": db_url}
    command = [
        sys.executable,
        "-m",
        "outbox.commands",
        "serve",
        "--port",
        str(port),
        "--with-relay",
    ]
    command += ["--model-base-url", model.url + "/v1", "--log-level", "warning"]
    # Started outside the checkout, as an installed package is: the workers import the app
    # by its installed name, not a top-level `server` the checkout's folder would provide.
    server = subprocess.Popen(command, env=env, cwd=tmp_path)
    base_url = f"http://127.0.0.1:{port}/v1"
    try:

        def answers() -> bool:
            try:
                return httpx2.get(f"{base_url}/assistants").status_code == 401
            except httpx2.TransportError:
                return False

        wait_until(answers, timeout_s=START_S, what="outbox serve to answer")
        sdk = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0)
        assistant = sdk.beta.assistants.create(model="scripted-1")
        run = sdk.beta.threads.create_and_run_poll(
            assistant_id=assistant.id,
            thread={"messages": [{"role": "user", "content": "hi"}]},
            poll_interval_ms=100,
        )
        assert run.status == "completed"
        outbox(db_url, "keys", "revoke", listed["id"])
        with pytest.raises(openai.AuthenticationError):
            sdk.beta.assistants.retrieve(assistant.id)
        sdk.close()
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(60) == 0


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (read from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry))
    return found


def test_serve_with_workers_answers_from_several_processes(db_url, model, tmp_path):
    key = outbox(db_url, "keys", "create", "--tenant", "acme").strip()
    port = free_port()
    env = {**os.environ, "OUTBOX_DATABASE_URL": db_url}
    command = [
        sys.executable,
        "-m",
        "outbox.commands",
        "serve",
        "--port",
        str(port),
        "--workers",
        "2",
    ]
    command += ["--model-base-url", model.url + "/v1", "--log-level", "warning"]
    # Started outside the checkout, as an installed package is: the workers import the app
    # by its installed name, not a top-level `server` the checkout's folder would provide.
    server = subprocess.Popen(command, env=env, cwd=tmp_path)
    base_url = f"http://127.0.0.1:{port}/v1"
    try:

        def answers() -> bool:
            try:
                return httpx2.get(f"{base_url}/assistants").status_code == 401
            except httpx2.TransportError:
                return False

        wait_until(answers, timeout_s=START_S, what="outbox serve --workers 2 to answer")
        sdk = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0)
        made = [sdk.beta.assistants.create(model="scripted-1").id for _ in range(10)]
        listed = {a.id for a in sdk.beta.assistants.list(limit=100).data}
        assert set(made) <= listed
        sdk.close()
        assert len(children(server.pid)) >= 2  # the worker processes under uvicorn's parent
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(60) == 0


def readme_http_blocks() -> tuple[list[str], str]:
    """The shell lines and the Python block of the README's "Over HTTP" section."""
    from tests.relay_harness import REPO

    readme = (REPO / "README.md").read_text()
    section = readme.split("## Over HTTP", 1)[1].split("\n## ", 1)[0]
    shell, python = re.findall(r"```(?:python)?\n(.*?)```", section, re.S)
    return shell.strip().splitlines(), python


def test_the_readme_http_example_runs_as_written(db_url, tmp_path):
    """The README's first screen: its commands (on free ports, in one bash) and its SDK
    example, against the scripted model it starts."""
    shell, python = readme_http_blocks()
    assert shell[-1].startswith(".venv/bin/outbox serve ")
    model_port, serve_port = free_port(), free_port()
    lines = [
        line.replace(".venv/bin/python", sys.executable)
        .replace(".venv/bin/outbox", f"{sys.executable} -m outbox.commands")
        .replace("8080", str(model_port))
        for line in shell
    ]
    lines[-1] = f'echo "$KEY" > key && exec {lines[-1]} --port {serve_port} --log-level warning'
    env = {**os.environ, "OUTBOX_DATABASE_URL": db_url}
    bash = subprocess.Popen(
        ["bash", "-euc", "\n".join(lines)], cwd=tmp_path, env=env, start_new_session=True
    )
    base_url = f"http://127.0.0.1:{serve_port}/v1"
    try:

        def answers() -> bool:
            assert bash.poll() is None, "a command of the README's block failed"
            try:
                return httpx2.get(f"{base_url}/assistants").status_code == 401
            except httpx2.TransportError:
                return False

        wait_until(answers, timeout_s=START_S, what="the README's outbox serve to answer")
        key = (tmp_path / "key").read_text().strip()
        script = python.replace("http://127.0.0.1:8000/v1", base_url)
        done = subprocess.run(
            [sys.executable, "-W", "ignore::DeprecationWarning", "-c", script],
            env={**env, "KEY": key},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("completed "), done.stdout
    finally:
        os.killpg(bash.pid, signal.SIGTERM)  # the server and the model it started
        bash.wait(60)
