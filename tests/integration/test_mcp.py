"""MCP tool servers: registered, discovered, and called by the relay (on the spec over HTTP,
through the official SDK over stdio).

The servers are real ones nobody here wrote the protocol side of: ``tests/mcp_fixture.py``
is built with the SDK's ``MCPServer`` and keeps its own audit trail of every call it
receives (the count that says whether a call was made twice), served over streamable HTTP
on loopback or over stdio; ``mcp-server-time`` and ``mcp-server-git`` are the published
servers from the package index.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import psycopg
import pytest
from click.testing import CliRunner

import cli
from outbox import credentials, keys, mcpservers, trace_context, writer
from outbox.commands.mcp import discover
from outbox.relay.mcpclient import MAX_EVENT_BYTES
from outbox.schemas import StartRun
from outbox.testing.scripted_model import HistoryItem, ScriptedModel
from outbox.testing.server import FakeServer, Reply, Request
from outbox.testing.tools import FakeToolService
from tests.helpers import free_port, new_run, turn
from tests.relay_harness import (
    FAST,
    all_settled,
    register_tool,
    relay_thread,
    scalar,
    start_relay_process,
    tool_call_states,
    wait_until,
)
from tests.serve_harness import serve

FIXTURE = Path(__file__).resolve().parent.parent / "mcp_fixture.py"
FORKS = FIXTURE.with_name("mcp_forks.py")
LAUNCH = FIXTURE.with_name("mcp_launch.py")
BIN = Path(sys.executable).parent
META_KEY = "agent-outbox/call"


def audit(path: Path, tool: str | None = None) -> list[dict[str, Any]]:
    """The calls the fixture server received, as it recorded them."""
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [line for line in lines if tool is None or line["tool"] == tool]


class Forked:
    """A fixture server forked by ``Forks``: a process of its own, which a test kills."""

    def __init__(self, forks: Forks, pid: int) -> None:
        self.forks = forks
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            answer = self.forks.ask("poll", self.pid)
            self.returncode = None if answer == "running" else int(answer)
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            os.kill(self.pid, signal.SIGKILL)

    def wait(self) -> int:
        if self.returncode is None:
            self.returncode = int(self.forks.ask("wait", self.pid))
        return self.returncode


class Forks:
    """``tests/mcp_forks.py``: the MCP servers of a module are forked from one process that
    imported the SDK once (about 0.6 s of CPU a server otherwise); each is a process of its
    own. A stdio server is started by a relay or ``outbox mcp add`` as the command
    ``stdio(...)`` gives, which has the fork server serve on that command's pipes."""

    def __init__(self, folder: Path) -> None:
        self.log = folder / "forks.log"
        self.socket = str(folder / "forks.sock")
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, str(FORKS), self.socket],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=out,
            )
        self.lock = threading.Lock()
        wait_until(lambda: os.path.exists(self.socket), what="the fork server to listen")

    def ask(self, *request: Any) -> str:
        assert self.process.stdin is not None and self.process.stdout is not None
        with self.lock:
            self.process.stdin.write(json.dumps(request).encode() + b"\n")
            self.process.stdin.flush()
            answer = self.process.stdout.readline().decode().strip()
        assert answer, f"the fork server ended: {self.log.read_text()}"
        return answer

    def start(self, log: Path, *argv: str) -> Forked:
        """``python FIXTURE ARGV...``, its output to ``log``."""
        return Forked(self, int(self.ask("start", str(log), str(FIXTURE), *argv)))

    def stdio(self, *argv: str) -> list[str]:
        """The command of a stdio server run as ``python ARGV...``."""
        return [sys.executable, str(LAUNCH), self.socket, *argv]

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()  # it kills and reaps the servers left
        self.process.wait(timeout=30)


@pytest.fixture(scope="module")
def forks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Forks]:
    forks = Forks(tmp_path_factory.mktemp("mcp-forks"))
    try:
        yield forks
    finally:
        forks.close()


class HttpFixture:
    """The fixture server over streamable HTTP, in a process of its own."""

    def __init__(self, forks: Forks, tmp_path: Path, answers: str = "http") -> None:
        self.forks = forks
        self.answers = answers  # "http": event streams; "http-json": JSON bodies
        self.audit_path = tmp_path / "audit-http.jsonl"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.log = tmp_path / "mcp-http.log"
        self.process: Forked | None = None
        self.skip = 0  # the audit's lines written before the test began (a shared server)

    def start(self) -> None:
        self.process = self.forks.start(
            self.log, self.answers, str(self.port), str(self.audit_path)
        )
        wait_until(self._accepts, timeout_s=30, what="the MCP server to listen")

    def _accepts(self) -> bool:
        assert self.process is not None
        assert self.process.poll() is None, self.log.read_text()
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
        except OSError:
            return False
        return True

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def calls(self, tool: str | None = None) -> list[dict[str, Any]]:
        lines = audit(self.audit_path)[self.skip :]
        return [line for line in lines if tool is None or line["tool"] == tool]

    def from_here(self) -> HttpFixture:
        """This server, its audit read from the lines written after now."""
        view = copy.copy(self)
        view.skip = len(audit(self.audit_path))
        return view


@pytest.fixture
def http_server(forks: Forks, tmp_path: Path) -> Iterator[HttpFixture]:
    server = HttpFixture(forks, tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture(scope="module")
def module_server(forks: Forks, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpFixture]:
    server = HttpFixture(forks, tmp_path_factory.mktemp("mcp-http"))
    server.start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def shared_server(module_server: HttpFixture) -> HttpFixture:
    """The fixture server of the module, for a test that neither stops it nor leaves a call
    open on it (its state then is as new: its answers depend on the call's arguments and
    key only), its audit read from the test's start: a fixture process costs about 0.6 s
    of CPU to start."""
    assert module_server.process is not None and module_server.process.poll() is None
    return module_server.from_here()


@pytest.fixture
def json_server(forks: Forks, tmp_path: Path) -> Iterator[HttpFixture]:
    """The fixture server answering every request with a JSON body, not an event stream."""
    server = HttpFixture(forks, tmp_path, "http-json")
    server.start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture(scope="module")
def fixture_tools(module_server: HttpFixture) -> list[dict[str, Any]]:
    """The tools the fixture server lists, as `outbox mcp add` reads them, once for the
    module: for a test that registers them for another server answering in its place."""
    spec = mcpservers.ServerSpec(name="fixture", url=module_server.url)
    return discover({**spec.model_dump(), "transport": spec.transport})


def add_server(
    db_url: str, listed: list[dict[str, Any]] | None = None, **spec: Any
) -> dict[str, Any]:
    """Register a server as `outbox mcp add` does: list its tools (or take ``listed``, the
    listing of another server), then write both."""
    spec.setdefault("timeout_s", 5.0)
    spec.setdefault("settle_s", 0.5)
    server = mcpservers.ServerSpec(**spec)
    if listed is None:
        listed = discover({**server.model_dump(), "transport": server.transport})
    with psycopg.connect(db_url) as conn:
        row = mcpservers.add(conn, server, listed, actor="test")
        conn.commit()
    return row


def call_once(db_url: str, tool: str, arguments: dict[str, Any]) -> int:
    """A run whose model asked for ``tool`` once; the tool call's ref."""
    with psycopg.connect(db_url) as conn:
        run = new_run(conn, tools=[tool])
        refs = writer.record_model_turn(
            conn, turn(run, 1, ("call_1", tool, json.dumps(arguments)))
        ).tool_call_refs
        conn.commit()
    return refs[0]


def call_row(db_url: str, ref: int) -> dict[str, Any]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.row_factory = psycopg.rows.dict_row
        row = conn.execute(
            "SELECT tc.*, r.status AS result_status, r.output, r.error "
            "FROM outbox.tool_calls tc LEFT JOIN outbox.tool_results r ON r.tool_call_ref = tc.id "
            "WHERE tc.id = %s",
            (ref,),
        ).fetchone()
    assert row is not None
    return row


LOW = {"create_ticket": {"risk_tier": "low"}, "reject": {"risk_tier": "low"}}


# -- registration and discovery ---------------------------------------------------------


def test_add_registers_every_listed_tool_with_its_schema_and_journals_the_actor(
    db_url, http_server, monkeypatch
):
    monkeypatch.setenv("OUTBOX_DATABASE_URL", db_url)
    runner = CliRunner()
    done = runner.invoke(
        cli.main,
        ["mcp", "add", "tk", "--url", http_server.url, "--actor", "ops@example", "--json"],
        catch_exceptions=False,
    )
    assert done.exit_code == 0, done.output
    added = json.loads(done.output)
    names = {
        "create_ticket",
        "read_ticket",
        "set_label",
        "reject",
        "big",
        "echo_auth",
        "die",
        "whoami",
    }
    assert sorted(added["added"]) == sorted(f"tk__{n} v1" for n in names)
    assert added["headers"] == [] and added["trusted"] is False

    shown = json.loads(runner.invoke(cli.main, ["mcp", "show", "tk", "--json"]).output)
    tools = {t["mcp_tool"]: t for t in shown["tools"]}
    assert set(tools) == names
    # An untrusted server's annotations are kept but give nothing: none and high, all.
    assert {(t["idempotency_mode"], t["risk_tier"]) for t in tools.values()} == {("none", "high")}
    assert tools["read_ticket"]["annotations"]["readOnlyHint"] is True
    ticket = tools["create_ticket"]["json_schema"]
    assert ticket["required"] == ["title"] and set(ticket["properties"]) == {"title", "hold_s"}
    assert tools["create_ticket"]["executor"] == "mcp"

    listed = json.loads(runner.invoke(cli.main, ["mcp", "list", "--json"]).output)
    assert [(s["name"], s["tools"]) for s in listed] == [("tk", len(names))]
    events = scalar(
        db_url,
        "SELECT array_agg(event || ':' || actor ORDER BY id) FROM outbox.journal "
        "WHERE event LIKE 'mcp.%'",
    )
    assert events == ["mcp.server_added:ops@example", "mcp.synced:ops@example"]

    # Adding it again is refused, naming what to do; nothing changes.
    again = runner.invoke(cli.main, ["mcp", "add", "tk", "--url", http_server.url])
    assert again.exit_code == 2 and "already registered" in again.output

    # The operator trusts it afterwards and sets one tool's tier: new versions where that
    # changes a tool, without asking the server; the override holds across a sync.
    stop = http_server.process
    http_server.kill()
    configured = json.loads(
        runner.invoke(
            cli.main,
            ["mcp", "set", "tk", "--trusted", "--risk", "create_ticket=low", "--json"],
        ).output
    )
    assert sorted(configured["changed"]) == sorted(
        f"tk__{n} v2"
        for n in ("create_ticket", "read_ticket", "set_label", "big", "echo_auth", "whoami")
    )
    http_server.start()
    assert stop is not http_server.process
    shown = json.loads(runner.invoke(cli.main, ["mcp", "show", "tk", "--json"]).output)
    tools = {t["mcp_tool"]: (t["idempotency_mode"], t["risk_tier"]) for t in shown["tools"]}
    assert tools["read_ticket"] == ("key", "low") and tools["create_ticket"] == ("none", "low")
    assert tools["reject"] == ("none", "high")

    # Listing again registers nothing new; removing disables every tool.
    synced = json.loads(runner.invoke(cli.main, ["mcp", "sync", "tk", "--json"]).output)
    assert synced["added"] == [] and synced["changed"] == [] and len(synced["unchanged"]) == 8
    removed = json.loads(runner.invoke(cli.main, ["mcp", "remove", "tk", "--json"]).output)
    assert removed["disabled_tools"] == sorted(f"tk__{n}" for n in names)
    assert scalar(db_url, "SELECT count(*) FROM outbox.tools WHERE enabled") == 0


def test_a_server_that_cannot_be_reached_is_refused_and_nothing_is_written(db_url, monkeypatch):
    monkeypatch.setenv("OUTBOX_DATABASE_URL", db_url)
    url = f"http://127.0.0.1:{free_port()}/mcp"
    done = CliRunner().invoke(cli.main, ["mcp", "add", "gone", "--url", url])
    assert done.exit_code == 2
    assert "could not list the tools of MCP server gone" in done.output
    assert scalar(db_url, "SELECT count(*) FROM outbox.mcp_servers") == 0
    assert scalar(db_url, "SELECT count(*) FROM outbox.tools") == 0


class Garbage(FakeServer):
    """An HTTP server that answers every request with bytes that are not MCP."""

    def handle(self, request: Request) -> Reply:
        return Reply(200, b"<html>hello</html>", {"content-type": "application/json"})


def test_a_server_that_answers_garbage_is_refused_and_nothing_is_written(db_url, monkeypatch):
    monkeypatch.setenv("OUTBOX_DATABASE_URL", db_url)
    with Garbage() as garbage:
        done = CliRunner().invoke(cli.main, ["mcp", "add", "junk", "--url", garbage.url + "/mcp"])
    assert done.exit_code == 2
    assert "could not list the tools of MCP server junk" in done.output
    assert scalar(db_url, "SELECT count(*) FROM outbox.mcp_servers") == 0


NO_TOOLS = "from mcp.server.mcpserver import MCPServer; MCPServer('empty').run('stdio')"


def test_a_server_that_lists_no_tools_is_refused_and_nothing_is_written(db_url, forks, monkeypatch):
    monkeypatch.setenv("OUTBOX_DATABASE_URL", db_url)
    command = shlex.join(forks.stdio("-c", NO_TOOLS))
    done = CliRunner().invoke(cli.main, ["mcp", "add", "empty", "--command", command])
    assert done.exit_code == 2, done.output
    assert "MCP server empty lists no tools" in done.output
    assert scalar(db_url, "SELECT count(*) FROM outbox.mcp_servers") == 0


BAD_SCHEMA = Path(__file__).resolve().parent.parent / "mcp_bad_schema.py"


def test_a_live_servers_tool_with_an_invalid_schema_is_refused_by_name_and_the_others_kept(
    db_url, forks, monkeypatch
):
    """A server built on the SDK's low-level ``Server`` lists ``broken`` with a schema that is
    not JSON Schema: add and sync refuse that tool, naming the server, the tool and where
    its schema is wrong; its other tool is registered and answers through the relay."""
    monkeypatch.setenv("OUTBOX_DATABASE_URL", db_url)
    runner = CliRunner()
    command = shlex.join(forks.stdio(str(BAD_SCHEMA)))
    done = runner.invoke(
        cli.main,
        ["mcp", "add", "calc", "--command", command, "--risk", "add=low"],
        catch_exceptions=False,
    )
    assert done.exit_code == 0, done.output
    assert "added: calc__add v1" in done.output
    assert (
        "skipped: tool broken of MCP server calc: its inputSchema is not a valid JSON Schema "
        "at inputSchema.properties.n.minimum: 'zero' is not of type 'number'"
    ) in done.output
    assert scalar(db_url, "SELECT array_agg(name) FROM outbox.tools") == ["calc__add"]
    synced = json.loads(runner.invoke(cli.main, ["mcp", "sync", "calc", "--json"]).output)
    assert synced["unchanged"] == ["calc__add"]
    [skipped] = synced["skipped"]
    assert (skipped["server"], skipped["tool"]) == ("calc", "broken")
    assert "minimum" in skipped["problem"] and "'zero'" in skipped["problem"]
    journaled = scalar(
        db_url, "SELECT detail FROM outbox.journal WHERE event = 'mcp.synced' ORDER BY id DESC"
    )
    assert journaled["skipped"] == [skipped]

    ref = call_once(db_url, "calc__add", {"a": 2, "b": 3})
    with relay_thread(db_url):
        wait_until(lambda: all_settled(db_url), what="the call of the kept tool")
    row = call_row(db_url, ref)
    assert (row["status"], row["output"]["content"][0]["text"]) == ("succeeded", "5")


def test_trusted_annotations_give_modes_and_tiers_untrusted_ones_do_not(db_url, tmp_path):
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    command = [str(BIN / "mcp-server-git"), "--repository", str(repo)]
    # One listing of the server (each costs a start of it), registered trusted and not.
    spec = mcpservers.ServerSpec(name="git", command=command)
    listed = discover({**spec.model_dump(), "transport": spec.transport})
    add_server(db_url, copy.deepcopy(listed), name="git", command=command, trusted=True)
    add_server(db_url, listed, name="rawgit", command=command)
    with psycopg.connect(db_url) as conn:
        trusted = {t["mcp_tool"]: t for t in mcpservers.newest_tools(conn, "git", "*")}
        untrusted = mcpservers.newest_tools(conn, "rawgit", "*")
    mode_tier = {name: (t["idempotency_mode"], t["risk_tier"]) for name, t in trusted.items()}
    assert mode_tier["git_status"] == ("key", "low")  # readOnlyHint
    assert mode_tier["git_add"] == ("key", "medium")  # idempotentHint, not destructive
    assert mode_tier["git_reset"] == ("key", "high")  # idempotentHint, destructive
    assert mode_tier["git_commit"] == ("none", "high")  # neither
    assert {(t["idempotency_mode"], t["risk_tier"]) for t in untrusted} == {("none", "high")}


def test_a_published_servers_effect_happens_once_per_call(db_url, tmp_path):
    """mcp-server-git on a temporary repository: its commits are effects to count."""
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    for key, value in (("user.name", "t"), ("user.email", "t@example.com")):
        subprocess.run(["git", "-C", str(repo), "config", key, value], check=True)
    (repo / "a.txt").write_text("a\n")
    command = [str(BIN / "mcp-server-git"), "--repository", str(repo)]
    # git_commit is neither read-only nor idempotent: tier high, approved by its override.
    low = {"git_add": {"risk_tier": "low"}, "git_commit": {"risk_tier": "low"}}
    add_server(db_url, name="git", command=command, trusted=True, overrides=low)
    with relay_thread(db_url):
        added = call_once(db_url, "git__git_add", {"repo_path": str(repo), "files": ["a.txt"]})
        wait_until(lambda: all_settled(db_url), what="git_add")
        committed = call_once(db_url, "git__git_commit", {"repo_path": str(repo), "message": "m"})
        wait_until(lambda: all_settled(db_url), what="git_commit")
    assert call_row(db_url, added)["status"] == "succeeded"
    assert call_row(db_url, committed)["status"] == "succeeded"
    count = subprocess.run(
        ["git", "-C", str(repo), "rev-list", "--count", "HEAD"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert count.strip() == "1"


def test_a_changed_schema_is_a_new_version_and_a_pinned_run_keeps_the_old(db_url, shared_server):
    add_server(db_url, name="tk", url=shared_server.url, overrides=LOW)
    with psycopg.connect(db_url) as conn:
        pinned = new_run(conn, tools=["tk__create_ticket"])
        conn.commit()
        server = mcpservers.get(conn, "tk")
        listed = discover(server)
        for tool in listed:
            if tool["name"] == "create_ticket":
                tool["inputSchema"]["properties"]["priority"] = {"type": "integer"}
        report = mcpservers.sync(conn, server, listed, actor="test")
        conn.commit()
        assert report["changed"] == ["tk__create_ticket v2"] and report["added"] == []
        later = new_run(conn, tools=["tk__create_ticket"])
        conn.commit()
        refs = {}
        for run in (pinned, later):
            call = turn(run, 1, ("c", "tk__create_ticket", '{"title": "x"}'))
            refs[run.id] = writer.record_model_turn(conn, call).tool_call_refs[0]
        conn.commit()
    planned = {run_id: call_row(db_url, ref)["tool_version"] for run_id, ref in refs.items()}
    assert planned == {pinned.id: 1, later.id: 2}


def test_an_untrusted_servers_tool_waits_for_approval_like_any_high_tier_tool(
    db_url, shared_server
):
    add_server(db_url, name="tk", url=shared_server.url)
    ref = call_once(db_url, "tk__read_ticket", {"title": "t"})
    assert scalar(db_url, "SELECT count(*) FROM outbox.approvals WHERE tool_call_ref = %s", (ref,))
    assert call_row(db_url, ref)["idempotency_mode"] == "none"


# -- calls through the relay ------------------------------------------------------------


def test_a_call_gets_its_result_once_with_our_key_in_meta_and_header(db_url, shared_server):
    add_server(db_url, name="tk", url=shared_server.url, overrides=LOW)
    ref = call_once(db_url, "tk__create_ticket", {"title": "printer on fire"})
    with relay_thread(db_url):
        wait_until(lambda: all_settled(db_url), what="the call to finish")
    row = call_row(db_url, ref)
    assert (row["status"], row["result_status"]) == ("succeeded", "ok")
    assert row["output"]["structuredContent"] == {"ticket": "printer on fire"}
    assert row["output"]["content"][0]["type"] == "text"
    [received] = shared_server.calls("create_ticket")
    ours = received["meta"][META_KEY]
    assert ours["idempotency_key"] == row["idempotency_key"]
    assert ours["tool_call_id"] == "call_1" and ours["attempt"] == 1
    assert ours["run_id"] == str(row["run_id"])
    assert received["idempotency_key_header"] == row["idempotency_key"]
    # The call's span continues its run's trace (started without one: its own, by its id).
    trace_id = received["meta"]["traceparent"].split("-")[1]
    assert trace_id == f"{trace_context.own_trace_id(row['run_id']):032x}"
    assert scalar(db_url, "SELECT count(*) FROM outbox.submissions") == 1


def test_the_credential_goes_to_the_server_and_is_cut_from_its_answer(
    db_url, shared_server, monkeypatch
):
    monkeypatch.setenv("TICKETS_TOKEN", "s3cr3t-t0ken-value")
    monkeypatch.setenv("OUTBOX_DATABASE_URL", db_url)  # listing finds the credential there
    with psycopg.connect(db_url) as conn:
        credentials.set_credential(conn, "tickets", env="TICKETS_TOKEN", actor="test")
        conn.commit()
    add_server(db_url, name="tk", url=shared_server.url, trusted=True, credential_ref="tickets")
    ref = call_once(db_url, "tk__echo_auth", {})
    with relay_thread(db_url):
        wait_until(lambda: all_settled(db_url), what="the call to finish")
    row = call_row(db_url, ref)
    assert row["status"] == "succeeded"
    text = row["output"]["content"][0]["text"]
    assert "s3cr3t" not in json.dumps(row["output"]) and "[redacted credential]" in text
    [received] = shared_server.calls("echo_auth")
    assert received["meta"][META_KEY]["idempotency_key"] == row["idempotency_key"]


def test_is_error_is_a_terminal_error_result_the_model_sees(db_url, shared_server):
    add_server(db_url, name="tk", url=shared_server.url, overrides=LOW)
    ref = call_once(db_url, "tk__reject", {"reason": "no budget"})
    with relay_thread(db_url):
        wait_until(lambda: all_settled(db_url), what="the call to finish")
    row = call_row(db_url, ref)
    assert (row["status"], row["result_status"], row["attempts"]) == ("failed", "error", 1)
    assert "refused: no budget" in row["error"]
    assert len(shared_server.calls("reject")) == 1


def test_relay_killed_mid_call_of_a_none_tool_parks_it_and_never_calls_again(
    db_url, http_server, tmp_path
):
    add_server(db_url, name="tk", url=http_server.url, overrides=LOW)
    ref = call_once(db_url, "tk__create_ticket", {"title": "once", "hold_s": 60})
    assert call_row(db_url, ref)["idempotency_mode"] == "none"
    relay = start_relay_process(db_url, tmp_path / "relay.log", *FAST)
    try:
        wait_until(lambda: http_server.calls("create_ticket"), what="the call to reach the server")
        relay.send_signal(signal.SIGKILL)
        relay.wait()
    finally:
        if relay.poll() is None:
            relay.kill()
    with relay_thread(db_url, lease_s=2.0):
        wait_until(
            lambda: tool_call_states(db_url) == {"outcome_unknown": 1},
            what="the call to be parked outcome_unknown",
        )
    assert len(http_server.calls("create_ticket")) == 1
    assert "outcome unknown" in scalar(
        db_url, "SELECT last_error FROM outbox.outbox WHERE tool_call_ref = %s", (ref,)
    )


def test_relay_killed_mid_call_of_a_key_tool_resends_the_same_key_and_the_server_dedups(
    db_url, http_server, tmp_path
):
    add_server(db_url, name="tk", url=http_server.url, trusted=True)  # set_label: idempotent
    ref = call_once(db_url, "tk__set_label", {"label": "urgent", "hold_s": 3})
    assert call_row(db_url, ref)["idempotency_mode"] == "key"
    relay = start_relay_process(db_url, tmp_path / "relay.log", *FAST)
    try:
        wait_until(lambda: http_server.calls("set_label"), what="the call to reach the server")
        relay.send_signal(signal.SIGKILL)
        relay.wait()
    finally:
        if relay.poll() is None:
            relay.kill()
    with relay_thread(db_url, lease_s=2.0):
        wait_until(lambda: all_settled(db_url), timeout_s=60, what="the call to finish")
    row = call_row(db_url, ref)
    assert (row["status"], row["output"]["structuredContent"]) == (
        "succeeded",
        {"result": "label urgent set"},
    )
    received = http_server.calls("set_label")
    # Sent again after the crash (a later claim), with the same key: the server's dedup
    # answered the second from the first.
    assert len(received) == 2
    assert {c["meta"][META_KEY]["idempotency_key"] for c in received} == {row["idempotency_key"]}
    first, again = (c["meta"][META_KEY]["attempt"] for c in received)
    assert first == 1 and again > 1


@pytest.mark.parametrize(
    ("tool", "ending"),
    [("read_ticket", "succeeded"), ("create_ticket", "outcome_unknown")],
)
def test_the_server_killed_mid_call_retries_a_read_only_tool_and_parks_a_none_one(
    db_url, http_server, tool, ending
):
    # A deadline: the attempts refused while the server starts again are not charged (a
    # slow start used to use up max_attempts and park the call).
    add_server(db_url, name="tk", url=http_server.url, trusted=True, overrides=LOW, deadline_s=300)
    ref = call_once(db_url, f"tk__{tool}", {"title": "t", "hold_s": 30})
    with relay_thread(db_url):
        wait_until(lambda: http_server.calls(tool), what="the call to reach the server")
        http_server.kill()
        http_server.start()
        wait_until(lambda: call_row(db_url, ref)["status"] == ending, what=ending)
    assert len(http_server.calls(tool)) == (2 if ending == "succeeded" else 1)


@pytest.mark.parametrize(
    ("tool", "ending"),
    [("read_ticket", "succeeded"), ("create_ticket", "outcome_unknown")],
)
def test_a_server_that_hangs_past_the_timeout_is_ambiguous(db_url, http_server, tool, ending):
    """read_ticket hangs only the first time a call arrives: its retry answers."""
    add_server(db_url, name="tk", url=http_server.url, trusted=True, overrides=LOW, timeout_s=1.0)
    ref = call_once(db_url, f"tk__{tool}", {"title": "t", "hold_s": 30})
    with relay_thread(db_url):
        wait_until(lambda: call_row(db_url, ref)["status"] == ending, what=ending)
    assert len(http_server.calls(tool)) == (2 if ending == "succeeded" else 1)
    journal = scalar(db_url, "SELECT string_agg(detail::text, ' ') FROM outbox.journal")
    assert "no answer from MCP server tk" in journal


@pytest.mark.parametrize("transport", ["http", "stdio"])
def test_a_relay_paused_past_the_timeout_uses_the_answer_that_came_in_time(
    db_url, forks, tmp_path, transport
):
    """The server answers a none-mode call a second after it came; the relay, paused
    (SIGSTOP) meanwhile, wakes after the call's timeout (and, over HTTP, the bound of its
    whole answer): the answer in its socket or pipe is read before a timeout is declared,
    so the call succeeds, sent once, not parked as ``outcome_unknown``."""
    timeout_s = 2.0
    server: HttpFixture | None = None
    if transport == "http":
        server = HttpFixture(forks, tmp_path)
        server.start()
        where: dict[str, Any] = {"url": server.url}
        audit_path = server.audit_path
    else:
        command, audit_path = stdio_command(forks, tmp_path)
        where = {"command": command}
    add_server(db_url, name="tk", trusted=True, overrides=LOW, timeout_s=timeout_s, **where)
    ref = call_once(db_url, "tk__create_ticket", {"title": "t", "hold_s": 1.0})
    relay = start_relay_process(db_url, tmp_path / "relay.log", *FAST[2:], "--lease", "30")
    try:
        wait_until(lambda: audit(audit_path, "create_ticket"), what="the call at the server")
        relay.send_signal(signal.SIGSTOP)
        paused_at = time.monotonic()
        wait_until(  # the answer, the timeout and the bound of the whole answer, all past
            lambda: time.monotonic() > paused_at + timeout_s + 1.0 + 1.5,
            what="the call's timeout to pass",
        )
        relay.send_signal(signal.SIGCONT)
        wait_until(lambda: all_settled(db_url), what="the call to finish")
    finally:
        relay.send_signal(signal.SIGCONT)
        relay.kill()
        relay.wait()
        if server is not None:
            server.kill()
    journal = scalar(db_url, "SELECT string_agg(detail::text, ' ') FROM outbox.journal")
    assert call_row(db_url, ref)["status"] == "succeeded", journal
    assert len(audit(audit_path, "create_ticket")) == 1
    assert "no answer" not in journal


def test_calls_of_one_server_in_flight_stay_within_its_limit(db_url, http_server):
    add_server(db_url, name="tk", url=http_server.url, overrides=LOW, max_concurrency=2)
    with psycopg.connect(db_url) as conn:
        run = new_run(conn, tools=["tk__create_ticket"])
        calls = [
            (f"call_{i}", "tk__create_ticket", json.dumps({"title": f"t{i}", "hold_s": 0.5}))
            for i in range(6)
        ]
        writer.record_model_turn(conn, turn(run, 1, *calls))
        conn.commit()
    with relay_thread(db_url):
        wait_until(lambda: all_settled(db_url), what="the calls to finish")
    assert tool_call_states(db_url) == {"succeeded": 6}
    received = http_server.calls("create_ticket")
    assert len(received) == 6
    # Each arrived while at most one other was open at the server.
    assert max(c["in_flight"] for c in received) == 2


def test_a_result_over_the_cap_is_an_error_result_and_not_asked_again(db_url, shared_server):
    add_server(db_url, name="tk", url=shared_server.url, trusted=True)
    # Four times the event cap crosses it; a text of many megabytes keeps the server
    # building, validating and framing it for seconds, near the call's 5 s timeout.
    ref = call_once(db_url, "tk__big", {"size": 4 * MAX_EVENT_BYTES})
    with relay_thread(db_url):
        wait_until(lambda: all_settled(db_url), what="the call to finish")
    row = call_row(db_url, ref)
    assert (row["status"], row["attempts"]) == ("failed", 1)
    assert "not read further" in row["error"] and "cap of a tool result" in row["error"]
    assert len(shared_server.calls("big")) == 1


def test_a_server_back_before_the_calls_deadline_gets_it_once_unsent_attempts_uncharged(
    db_url, http_server
):
    """Whether the session is found dead before the call or the call's POST cannot
    connect, the request never left: a none-mode call is retried, not parked, and with a
    deadline not charged (max_attempts 1, and yet attempt after attempt)."""
    add_server(
        db_url, name="tk", url=http_server.url, overrides=LOW, max_attempts=1, deadline_s=120
    )
    with relay_thread(db_url):
        warm = call_once(db_url, "tk__create_ticket", {"title": "first"})
        wait_until(lambda: all_settled(db_url), what="the first call (its session opened)")
        http_server.kill()
        ref = call_once(db_url, "tk__create_ticket", {"title": "later"})
        wait_until(
            lambda: (call_row(db_url, ref)["attempts"] or 0) >= 3,
            what="attempts against the stopped server",
        )
        assert call_row(db_url, ref)["dispatched_attempt"] is None  # never ambiguous
        http_server.start()
        wait_until(lambda: all_settled(db_url), what="the call to finish")
    assert call_row(db_url, warm)["status"] == "succeeded"
    assert call_row(db_url, ref)["status"] == "succeeded"  # none mode, and yet called
    assert [c["arguments"]["title"] for c in http_server.calls()] == ["first", "later"]


def test_a_deadline_is_set_at_add_and_changed_by_set_as_new_tool_versions(
    db_url, shared_server, monkeypatch
):
    monkeypatch.setenv("OUTBOX_DATABASE_URL", db_url)
    runner = CliRunner()

    def deadlines() -> set[tuple[int, float | None]]:
        rows = scalar(
            db_url,
            "SELECT array_agg(DISTINCT jsonb_build_array(version, deadline_s)) FROM outbox.tools",
        )
        return {(v, d) for v, d in rows}

    added = runner.invoke(
        cli.main, ["mcp", "add", "tk", "--url", shared_server.url, "--deadline", "90"]
    )
    assert added.exit_code == 0, added.output
    assert deadlines() == {(1, 90.0)}
    both = runner.invoke(cli.main, ["mcp", "set", "tk", "--deadline", "5", "--no-deadline"])
    assert both.exit_code == 2 and "opposite" in both.output
    done = runner.invoke(cli.main, ["mcp", "set", "tk", "--deadline", "30", "--actor", "ops"])
    assert done.exit_code == 0, done.output
    assert deadlines() == {(1, 90.0), (2, 30.0)}
    runner.invoke(cli.main, ["mcp", "set", "tk", "--no-deadline"], catch_exceptions=False)
    assert deadlines() == {(1, 90.0), (2, 30.0), (3, None)}
    assert scalar(db_url, "SELECT deadline_s FROM outbox.mcp_servers") is None
    journaled = scalar(
        db_url,
        "SELECT array_agg(detail->'deadline_s' ORDER BY id) FROM outbox.journal "
        "WHERE event = 'mcp.server_configured'",
    )
    assert journaled == [30.0, None]
    out_of_range = runner.invoke(cli.main, ["mcp", "set", "tk", "--deadline", "0"])
    assert out_of_range.exit_code == 2 and "out of range" in out_of_range.output


def test_a_server_down_past_the_calls_deadline_ends_it_not_executed_at_the_deadline(db_url):
    """No session can be opened: uncharged attempts until the deadline, then an error
    result the model sees, naming the server; never parked, never ambiguous."""
    url = f"http://127.0.0.1:{free_port()}/mcp"
    with psycopg.connect(db_url) as conn:
        spec = mcpservers.ServerSpec(
            name="tk", url=url, overrides=LOW, max_attempts=1, deadline_s=2, timeout_s=5
        )
        listed = [{"name": "create_ticket", "inputSchema": {"type": "object"}}]
        mcpservers.add(conn, spec, listed, actor="test")
        conn.commit()
    ref = call_once(db_url, "tk__create_ticket", {"title": "t"})
    with relay_thread(db_url):
        wait_until(lambda: all_settled(db_url), what="the call to end at its deadline")
    row = call_row(db_url, ref)
    assert (row["status"], row["dispatched_attempt"]) == ("failed", None)
    assert (row["attempts"] or 0) >= 2
    assert row["error"].startswith("not executed: the call's deadline passed"), row["error"]
    assert f"MCP server tk ({url})" in row["error"]
    assert scalar(
        db_url,
        "SELECT r.created_at >= c.created_at + interval '2 seconds' "
        "FROM outbox.tool_results r JOIN outbox.tool_calls c ON c.id = r.tool_call_ref",
    )
    journal = scalar(
        db_url,
        "SELECT string_agg(detail->>'error', ' ') FROM outbox.journal "
        "WHERE event = 'tool_call.retry_scheduled'",
    )
    assert "could not open a session with MCP server tk" in journal


def test_a_server_answering_json_bodies_gives_results_and_errors_as_one_answering_streams(
    db_url, json_server
):
    add_server(db_url, name="tk", url=json_server.url, overrides=LOW)
    done = call_once(db_url, "tk__create_ticket", {"title": "json"})
    refused = call_once(db_url, "tk__reject", {"reason": "no"})
    with relay_thread(db_url):
        wait_until(lambda: all_settled(db_url), what="the calls to finish")
    row = call_row(db_url, done)
    assert (row["status"], row["output"]["structuredContent"]) == ("succeeded", {"ticket": "json"})
    assert call_row(db_url, refused)["status"] == "failed"
    assert "refused: no" in call_row(db_url, refused)["error"]
    (received,) = json_server.calls("create_ticket")
    assert received["idempotency_key_header"] == row["idempotency_key"]
    assert received["meta"][META_KEY]["idempotency_key"] == row["idempotency_key"]


def test_a_session_the_server_forgot_is_opened_again_and_a_none_call_is_not_parked(
    db_url, http_server
):
    """A server restarted between calls answers the old session's next request 404: that
    request was not processed, so a none-mode call is retried over a new session."""
    add_server(db_url, name="tk", url=http_server.url, overrides=LOW, max_attempts=100)
    with relay_thread(db_url):
        warm = call_once(db_url, "tk__create_ticket", {"title": "first"})
        wait_until(lambda: all_settled(db_url), what="the first call (its session opened)")
        http_server.kill()
        http_server.start()
        ref = call_once(db_url, "tk__create_ticket", {"title": "later"})
        wait_until(lambda: all_settled(db_url), what="the call to finish")
    assert call_row(db_url, warm)["status"] == "succeeded"
    row = call_row(db_url, ref)
    # The 404's attempt took its mark back: the next was a plain call, not an ambiguous one.
    assert (row["status"], row["attempts"], row["dispatched_attempt"]) == ("succeeded", 2, 2)
    assert [c["arguments"]["title"] for c in http_server.calls()] == ["first", "later"]
    journal = scalar(db_url, "SELECT string_agg(detail::text, ' ') FROM outbox.journal")
    assert "no longer knows the session" in journal


class Scripted(FakeServer):
    """A streamable HTTP MCP server in a few lines, for answers the SDK's server never
    gives: a session for ``initialize``, 202 for a notification, and for each
    ``tools/call`` the next scripted answer (a function of the request's id)."""

    def __init__(self, *answers: Any) -> None:
        super().__init__()
        self.answers = list(answers)
        self.calls: list[dict[str, Any]] = []

    def handle(self, request: Request) -> Reply:
        body = request.json_object()
        if body.get("method") == "initialize":
            result = {
                "protocolVersion": "2025-06-18",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "scripted", "version": "1"},
            }
            answer = {"jsonrpc": "2.0", "id": body["id"], "result": result}
            return Reply(200, answer, {"mcp-session-id": "s1"})
        if "id" not in body:
            return Reply(202, b"")
        with self.lock:
            self.calls.append(body)
            answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        reply: Reply = answer(body["id"])
        return reply


def rpc(result: Any = None, error: Any = None, status: int = 200) -> Any:
    def answer(request_id: int) -> Reply:
        said = {"result": result} if error is None else {"error": error}
        return Reply(status, {"jsonrpc": "2.0", "id": request_id, **said})

    return answer


def raw(status: int, body: bytes, kind: str) -> Any:
    return lambda request_id: Reply(status, body, {"content-type": kind})


DONE = {"content": [{"type": "text", "text": "done"}], "isError": False}
NOTE = b'event: message\ndata: {"jsonrpc":"2.0","method":"notifications/message","params":{}}\n\n'


@pytest.mark.parametrize(
    ("answers", "ending", "calls", "said"),
    [
        ([raw(200, b"<html>", "application/json")], "outcome_unknown", 1, "not JSON"),
        ([raw(200, b"hello", "text/plain")], "outcome_unknown", 1, "content type"),
        ([raw(200, NOTE, "text/event-stream")], "outcome_unknown", 1, "ended before its answer"),
        ([rpc({"content": "no list"})], "outcome_unknown", 1, "not a tool result"),
        ([raw(500, b"boom", "text/plain")], "outcome_unknown", 1, "HTTP 500"),
        ([rpc(error={"code": -32000, "message": "bad day"})], "outcome_unknown", 1, "bad day"),
        ([rpc(error={"code": -32602, "message": "no title"})], "failed", 1, "refused the call"),
        ([rpc(error={"code": -32602, "message": "no title"}, status=400)], "failed", 1, "no title"),
        ([raw(403, b"forbidden", "text/plain")], "failed", 1, "HTTP 403"),
        ([raw(429, b"slow down", "text/plain"), rpc(DONE)], "succeeded", 2, None),
        ([raw(404, b"gone", "text/plain"), rpc(DONE)], "succeeded", 2, None),
    ],
)
def test_each_answer_of_an_http_server_means_what_docs_mcp_says(
    db_url, fixture_tools, answers, ending, calls, said
):
    """A none-mode tool: what may have acted is parked, what the server refused is an error
    result, what it did not process (429, a session it forgot) is called again."""
    with Scripted(*answers) as scripted:
        url = scripted.url + "/mcp"  # the fixture server's tools, served by the scripted one
        add_server(db_url, fixture_tools, name="tk", url=url, overrides=LOW, max_attempts=5)
        ref = call_once(db_url, "tk__create_ticket", {"title": "t"})
        with relay_thread(db_url):
            wait_until(lambda: all_settled(db_url), what="the call to settle")
    row = call_row(db_url, ref)
    assert row["status"] == ending
    assert len(scripted.calls) == calls
    assert (
        scripted.calls[0]["params"]["_meta"][META_KEY]["idempotency_key"] == row["idempotency_key"]
    )
    if said is not None:
        journal = scalar(db_url, "SELECT string_agg(detail::text, ' ') FROM outbox.journal")
        assert said in (row["error"] or "") + journal


# -- stdio servers ----------------------------------------------------------------------


def stdio_command(forks: Forks, tmp_path: Path) -> tuple[list[str], Path]:
    path = tmp_path / "audit-stdio.jsonl"
    return forks.stdio(str(FIXTURE), "stdio", str(path)), path


def test_a_stdio_server_that_died_is_started_again_for_the_next_call(db_url, forks, tmp_path):
    command, audit_path = stdio_command(forks, tmp_path)
    add_server(db_url, name="local", command=command, trusted=True)
    with relay_thread(db_url):
        first = call_once(db_url, "local__whoami", {})
        wait_until(lambda: all_settled(db_url), what="the first call")
        pid = call_row(db_url, first)["output"]["structuredContent"]["result"]
        os.kill(pid, signal.SIGKILL)
        second = call_once(db_url, "local__whoami", {})
        wait_until(lambda: all_settled(db_url), what="the second call")
    row = call_row(db_url, second)
    assert row["status"] == "succeeded" and row["attempts"] == 1
    assert row["output"]["structuredContent"]["result"] != pid
    assert next(line["pid"] for line in audit(audit_path, "whoami")) == pid


def test_a_stdio_server_dying_mid_call_leaves_a_none_call_unknown(db_url, forks, tmp_path):
    command, audit_path = stdio_command(forks, tmp_path)
    low = {"die": {"risk_tier": "low"}, "read_ticket": {"risk_tier": "low"}}
    add_server(db_url, name="local", command=command, overrides=low)
    ref = call_once(db_url, "local__die", {})
    with relay_thread(db_url):
        wait_until(lambda: tool_call_states(db_url) == {"outcome_unknown": 1}, what="parked")
        after = call_once(db_url, "local__read_ticket", {"title": "t"})
        wait_until(lambda: call_row(db_url, after)["status"] == "succeeded", what="next call")
    assert len(audit(audit_path, "die")) == 1
    assert call_row(db_url, ref)["status"] == "outcome_unknown"
    # The server was started again for the next call.
    assert len({line["pid"] for line in audit(audit_path)}) == 2


def test_a_published_stdio_server_answers_through_the_relay(db_url, monkeypatch):
    monkeypatch.setenv("OUTBOX_DATABASE_URL", db_url)
    command = f"{BIN / 'mcp-server-time'} --local-timezone UTC"
    done = CliRunner().invoke(
        cli.main, ["mcp", "add", "time", "--command", command, "--trusted", "--json"]
    )
    assert done.exit_code == 0, done.output
    assert sorted(json.loads(done.output)["added"]) == [
        "time__convert_time v1",
        "time__get_current_time v1",
    ]
    ref = call_once(db_url, "time__get_current_time", {"timezone": "UTC"})
    with relay_thread(db_url):
        wait_until(lambda: all_settled(db_url), what="the call")
    row = call_row(db_url, ref)
    assert row["status"] == "succeeded"
    text = row["output"]["content"][0]["text"]
    assert json.loads(text)["timezone"] == "UTC"


# -- a run of a model --------------------------------------------------------------------


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_a_models_parallel_mcp_and_http_calls_are_answered_once(db_url, shared_server, api):
    add_server(db_url, name="tk", url=shared_server.url, overrides=LOW)
    outputs: list[dict[str, str]] = []

    def after_tools(items: list[HistoryItem]) -> dict[str, Any]:
        outputs.append({i.call_id or "": i.text for i in items if i.kind == "tool_output"})
        return {"text": "filed"}

    ticket = {"name": "tk__create_ticket", "arguments": {"title": "printer"}}
    email = {"name": "send_email", "arguments": {"to": "a@b.c"}}
    with ScriptedModel() as model, FakeToolService() as service:
        with psycopg.connect(db_url) as conn:
            register_tool(conn, service, "send_email", "key")
            conn.commit()
        model.add_script("both", [{"tool_calls": [ticket, email]}, after_tools])
        with psycopg.connect(db_url) as conn:
            writer.start_run(
                conn,
                StartRun(
                    tenant_id="acme",
                    thread_id=writer.create_thread(conn, "acme").id,
                    model="scripted-1",
                    message="script:both please",
                    tools=["tk__create_ticket", "send_email"],
                    base_url=model.url + "/v1",
                    api=api,
                ),
            )
            conn.commit()
        with relay_thread(db_url, kinds=("model_turn", "tool_call", "deliver_batch")):
            wait_until(
                lambda: scalar(db_url, "SELECT status FROM outbox.runs") == "completed",
                what="the run to complete",
            )
        sent = {
            tool.get("name") or tool["function"]["name"]: tool for tool in model.requests[0].tools
        }
    # The model was offered the MCP tool under its registry name, with the server's schema.
    offered = sent["tk__create_ticket"]
    parameters = offered.get("parameters") or offered["function"]["parameters"]
    assert parameters["required"] == ["title"]
    # Each call answered once, both results in the model's next request.
    [seen] = outputs
    assert len(seen) == 2
    assert any("printer" in text for text in seen.values())
    assert len(shared_server.calls("create_ticket")) == 1
    assert len(service.tool("send_email").deliveries) == 1


@pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:The Assistants API is deprecated:DeprecationWarning")
def test_an_mcp_tool_through_outbox_serve(db_url, shared_server):
    """A client of `outbox serve` (the openai SDK, Assistants protocol) names the MCP tool
    as it names any registered tool; the relay calls it once."""
    add_server(db_url, name="tk", url=shared_server.url, overrides=LOW)
    ticket = {"name": "tk__create_ticket", "arguments": {"title": "via serve"}}
    with ScriptedModel() as model:
        model.add_script("ticket", [{"tool_calls": [ticket]}, {"text": "ticket filed"}])
        with psycopg.connect(db_url) as conn:
            key = keys.create_key(conn, "acme", name="test")[1]
            conn.commit()
        with (
            serve(db_url, model_base_url=model.url + "/v1") as base_url,
            relay_thread(db_url, kinds=("model_turn", "tool_call", "deliver_batch")),
        ):
            sdk = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0)
            assistant = sdk.beta.assistants.create(
                model="scripted-1",
                tools=[{"type": "function", "function": {"name": "tk__create_ticket"}}],
            )
            thread = sdk.beta.threads.create(
                messages=[{"role": "user", "content": "script:ticket please"}]
            )
            run = sdk.beta.threads.runs.create_and_poll(
                thread_id=thread.id, assistant_id=assistant.id, poll_interval_ms=100
            )
            sdk.close()
    assert run.status == "completed", run
    [received] = shared_server.calls("create_ticket")
    assert received["arguments"]["title"] == "via serve"


def test_an_mcp_tool_through_outbox_serves_responses(db_url, shared_server):
    """A client of `outbox serve`'s Responses API declares the MCP registry tool as a
    function: the relay calls the server once, and the answer the model made of its result
    comes back in the response (the relay's call never shows as a function_call item)."""
    add_server(db_url, name="tk", url=shared_server.url, overrides=LOW)
    seen: list[str] = []

    def after_tool(items: list[HistoryItem]) -> dict[str, Any]:
        seen.extend(i.text for i in items if i.kind == "tool_output")
        return {"text": "ticket filed: " + seen[-1]}

    ticket = {"name": "tk__create_ticket", "arguments": {"title": "via responses"}}
    with ScriptedModel() as model:
        model.add_script("ticket", [{"tool_calls": [ticket]}, after_tool])
        with psycopg.connect(db_url) as conn:
            key = keys.create_key(conn, "acme", name="test")[1]
            conn.commit()
        with (
            serve(db_url, model_base_url=model.url + "/v1") as base_url,
            relay_thread(db_url, kinds=("model_turn", "tool_call", "deliver_batch")),
        ):
            sdk = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0)
            response = sdk.responses.create(
                model="scripted-1",
                input="script:ticket please",
                tools=[{"type": "function", "name": "tk__create_ticket", "parameters": {}}],
            )
            sdk.close()
    assert response.status == "completed", response
    assert [item.type for item in response.output] == ["message"]
    [received] = shared_server.calls("create_ticket")
    assert received["arguments"]["title"] == "via responses"
    key_sent = received["meta"][META_KEY]["idempotency_key"]
    assert key_sent == scalar(db_url, "SELECT idempotency_key FROM outbox.tool_calls")
    [output] = seen
    assert "via responses" in output
    assert response.output_text == "ticket filed: " + output


class OpenStream:
    """A streamable HTTP MCP server on loopback that answers a ``tools/call`` with an event
    stream (chunked) holding a log notification and the answer, and then keeps the stream
    open, sending nothing, until the client closes the connection (which it records) or a
    minute has passed. The SDK's server ends its streams after the answer; this one plays
    one that does not."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.closed_by_client = 0
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.port = 0

    def __enter__(self) -> OpenStream:
        self.thread.start()
        assert self.ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self.ready.set()
        self.loop.run_forever()
        server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                body = json.loads(await reader.readexactly(length))
                if body.get("method") == "initialize":
                    result = {
                        "protocolVersion": "2025-11-25",
                        "capabilities": {"tools": {}},
                        "serverInfo": {"name": "open-stream", "version": "1"},
                    }
                    answer = json.dumps({"jsonrpc": "2.0", "id": body["id"], "result": result})
                    writer.write(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                        b"mcp-session-id: s1\r\ncontent-length: %d\r\n\r\n%s"
                        % (len(answer), answer.encode())
                    )
                    continue
                if "id" not in body:
                    writer.write(b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n")
                    continue
                self.calls.append(body)
                note = {"jsonrpc": "2.0", "method": "notifications/message", "params": {}}
                title = body["params"]["arguments"].get("title")
                result = {"content": [{"type": "text", "text": f"opened {title}"}]}
                events = (
                    f"event: message\ndata: {json.dumps(note)}\n\n"
                    f"event: message\ndata: "
                    f"{json.dumps({'jsonrpc': '2.0', 'id': body['id'], 'result': result})}\n\n"
                ).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"transfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n" % (len(events), events)
                )
                await writer.drain()
                # The stream stays open: nothing more, and no end, until the client goes.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(60):
                        if await reader.read(1) == b"":
                            self.closed_by_client += 1
                return
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()


def test_an_answer_on_a_stream_the_server_leaves_open_is_taken_at_once(db_url):
    """The server keeps the event stream open after its answer: the relay takes the answer
    as it arrives and closes the stream, far before the call's timeout (60 s, where the
    wait for the call is 30 s); the next call goes over a new connection of the session."""
    with OpenStream() as server:
        with psycopg.connect(db_url) as conn:
            spec = mcpservers.ServerSpec(name="op", url=server.url, timeout_s=60, overrides=LOW)
            listed = [{"name": "create_ticket", "inputSchema": {"type": "object"}}]
            mcpservers.add(conn, spec, listed, actor="test")
            conn.commit()
        first = call_once(db_url, "op__create_ticket", {"title": "one"})
        with relay_thread(db_url):
            wait_until(lambda: all_settled(db_url), what="the answer, before the timeout")
            second = call_once(db_url, "op__create_ticket", {"title": "two"})
            wait_until(lambda: all_settled(db_url), what="the second answer")
        wait_until(lambda: server.closed_by_client == 2, what="the relay to close both streams")
    for ref, title in ((first, "one"), (second, "two")):
        row = call_row(db_url, ref)
        assert (row["status"], row["attempts"]) == ("succeeded", 1)
        assert row["output"]["content"] == [{"type": "text", "text": f"opened {title}"}]
    assert [c["params"]["arguments"]["title"] for c in server.calls] == ["one", "two"]
