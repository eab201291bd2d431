"""FakeToolService over real HTTP with ``httpx2`` (no database)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest

from outbox.testing.server import FakeServer, Reply, Request
from outbox.testing.tools import FakeToolService, fingerprint

CLIENT_TIMEOUT_S = 5.0  # seconds, generous for loaded CI machines
SHORT_TIMEOUT_S = 0.3  # seconds, shorter than the injected stalls
STALL_S = 2.0  # seconds the fake holds an answer after committing the effect
PROCESS_TIMEOUT_S = 10.0  # seconds for the subprocess fake to start or exit


@pytest.fixture
def service() -> Iterator[FakeToolService]:
    with FakeToolService() as srv:
        yield srv


@pytest.fixture
def http(service: FakeToolService) -> Iterator[httpx2.Client]:
    with httpx2.Client(base_url=service.url, timeout=CLIENT_TIMEOUT_S) as client:
        yield client


def call(
    http: httpx2.Client, tool: str, arguments: dict[str, Any], key: str | None = None
) -> httpx2.Response:
    headers = {
        "X-Outbox-Run-Id": "run-1",
        "X-Outbox-Tool-Call-Id": "call_1",
        "X-Correlation-Id": "corr-1",
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    }
    if key is not None:
        headers["Idempotency-Key"] = key
    return http.post(f"/tools/{tool}", json=arguments, headers=headers)


EMAIL = {"to": "a@b.c", "subject": "hello"}


def test_key_mode_dedups_by_idempotency_key(service: FakeToolService, http: httpx2.Client) -> None:
    first = call(http, "send_email", EMAIL, key="run-1:call_1")
    again = call(http, "send_email", EMAIL, key="run-1:call_1")
    other = call(http, "send_email", EMAIL, key="run-1:call_2")

    assert first.status_code == again.status_code == other.status_code == 200
    assert first.json() == again.json() != other.json()
    tool = service.tool("send_email")
    assert [d.replayed for d in tool.deliveries] == [False, True, False]
    assert [e.key for e in tool.effects] == ["run-1:call_1", "run-1:call_2"]
    assert tool.deliveries[0].headers["x-outbox-run-id"] == "run-1"
    assert tool.deliveries[0].headers["traceparent"].startswith("00-")
    assert service.duplicate_effects() == 0


def test_concurrent_deliveries_of_one_key_make_one_effect(
    service: FakeToolService, http: httpx2.Client
) -> None:
    answers: list[int] = []
    start = threading.Barrier(10)

    def deliver() -> None:
        start.wait()
        answers.append(call(http, "noop", {}, key="k").status_code)

    threads = [threading.Thread(target=deliver) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(CLIENT_TIMEOUT_S)
    assert answers == [200] * 10
    assert len(service.tool("noop").effects) == 1


def test_billing_refuses_key_reuse_with_other_arguments(
    service: FakeToolService, http: httpx2.Client
) -> None:
    assert call(http, "charge", {"amount": 100}, key="pay-1").status_code == 200
    assert call(http, "charge", {"amount": 100}, key="pay-1").status_code == 200
    refused = call(http, "charge", {"amount": 999}, key="pay-1")
    assert refused.status_code == 422
    assert refused.json()["error"]["message"] == "idempotency key reused with different arguments"
    assert len(service.tool("charge").effects) == 1


def test_missing_argument_is_a_400_naming_the_field(
    service: FakeToolService, http: httpx2.Client
) -> None:
    answer = call(http, "send_email", {"to": "a@b.c"}, key="k")
    assert answer.status_code == 400
    assert answer.json()["error"]["field"] == "subject"
    assert service.tool("send_email").effects == []


def test_lookup_mode_finds_by_key_or_fingerprint(
    service: FakeToolService, http: httpx2.Client
) -> None:
    made = call(http, "create_ticket", {"title": "printer"}, key="run-1:call_1").json()
    assert made["ticket_id"] == "T-000001"

    def lookup(body: dict[str, Any]) -> dict[str, Any]:
        answer = http.post("/tools/create_ticket/lookup", json=body)
        assert answer.status_code == 200
        return dict(answer.json())

    assert lookup({"idempotency_key": "run-1:call_1", "arguments": {"title": "printer"}}) == {
        "found": True,
        "result": made,
    }
    # the same arguments under another key are another intent
    assert lookup({"idempotency_key": "run-1:call_9", "arguments": {"title": "printer"}}) == {
        "found": False
    }
    keyless = call(http, "create_ticket", {"title": "scanner"}).json()
    assert lookup({"idempotency_key": None, "arguments": {"title": "scanner"}}) == {
        "found": True,
        "result": keyless,
    }
    assert service.tool("create_ticket").effects[1].fingerprint == fingerprint({"title": "scanner"})
    assert service.tool("create_ticket").lookups == 3
    assert http.post("/tools/send_email/lookup", json={}).status_code == 404


def test_lookup_mode_does_not_honour_keys(service: FakeToolService, http: httpx2.Client) -> None:
    a = call(http, "create_ticket", {"title": "x"}, key="k1").json()
    b = call(http, "create_ticket", {"title": "x"}, key="k1").json()
    assert a["ticket_id"] != b["ticket_id"]
    assert service.duplicate_effects("create_ticket") == 1


def test_duplicate_effects_counts_none_mode_repeats(
    service: FakeToolService, http: httpx2.Client
) -> None:
    service.add_tool("webhook", "none")
    for key in ["a", "a", "a", "b", None]:
        assert call(http, "webhook", {"n": 1}, key=key).status_code == 200
    assert len(service.tool("webhook").effects) == 5
    assert service.duplicate_effects("webhook") == 2
    assert service.duplicate_effects() == 2


def test_stall_after_commit_times_out_yet_one_effect(
    service: FakeToolService, http: httpx2.Client
) -> None:
    service.tool("send_email").stall_after_commit(STALL_S)
    with pytest.raises(httpx2.TimeoutException):
        http.post(
            "/tools/send_email",
            json=EMAIL,
            headers={"Idempotency-Key": "k"},
            timeout=SHORT_TIMEOUT_S,
        )
    assert len(service.tool("send_email").effects) == 1  # the effect happened anyway

    retry = call(http, "send_email", EMAIL, key="k")  # a safe retry: same key
    assert retry.status_code == 200
    assert len(service.tool("send_email").effects) == 1


def test_stall_on_lookup_tool_is_reconciled_by_lookup(
    service: FakeToolService, http: httpx2.Client
) -> None:
    service.tool("create_ticket").stall_after_commit(STALL_S)
    with pytest.raises(httpx2.TimeoutException):
        http.post(
            "/tools/create_ticket",
            json={"title": "t"},
            headers={"Idempotency-Key": "k"},
            timeout=SHORT_TIMEOUT_S,
        )
    found = http.post("/tools/create_ticket/lookup", json={"idempotency_key": "k"}).json()
    assert found["found"] is True
    assert found["result"]["ticket_id"] == "T-000001"
    assert service.duplicate_effects() == 0


def test_fail_and_drop_make_no_effect(service: FakeToolService, http: httpx2.Client) -> None:
    tool = service.tool("noop")
    tool.fail(status=503, n=2)
    assert [call(http, "noop", {}, key="k").status_code for _ in range(3)] == [503, 503, 200]
    tool.drop_connection(n=1)
    with pytest.raises(httpx2.TransportError):
        call(http, "noop", {}, key="k2")
    assert [d.status for d in tool.deliveries] == [503, 503, 200, None]
    assert len(tool.effects) == 1


def test_fault_time_window_until_cleared(service: FakeToolService, http: httpx2.Client) -> None:
    tool = service.tool("noop")
    tool.fail(status=500, n=None, window_s=60)
    assert [call(http, "noop", {}).status_code for _ in range(3)] == [500] * 3
    tool.clear_faults()
    assert call(http, "noop", {}).status_code == 200


def test_latency_delays_before_the_effect(service: FakeToolService, http: httpx2.Client) -> None:
    service.tool("noop").latency(STALL_S)
    with pytest.raises(httpx2.TimeoutException):
        http.post("/tools/noop", json={}, timeout=SHORT_TIMEOUT_S)
    assert call(http, "noop", {}).json() == {"ok": True}


def test_http_control_and_audit(service: FakeToolService, http: httpx2.Client) -> None:
    added = http.post("/_tools", json={"name": "refund", "mode": "none", "required": ["id"]})
    assert added.json()["endpoint"] == service.endpoint("refund")
    fault = {"tool": "refund", "fault": "fail", "status": 400, "n": 1}
    assert http.post("/_faults", json=fault).status_code == 200
    assert http.post("/_faults", json={"tool": "nope", "fault": "drop"}).status_code == 400

    assert call(http, "refund", {"id": 1}, key="r").status_code == 400
    assert call(http, "refund", {"id": 1}, key="r").status_code == 200
    assert call(http, "refund", {"id": 1}, key="r").status_code == 200
    assert http.post("/tools/unknown", json={}).status_code == 404

    audit = http.get("/_audit").json()["tools"]["refund"]
    assert audit["mode"] == "none"
    assert [d["status"] for d in audit["deliveries"]] == [400, 200, 200]
    assert len(audit["effects"]) == 2
    assert audit["duplicate_effects"] == 1


def test_runs_as_a_process() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "outbox.testing.tools", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        with httpx2.Client(base_url=url, timeout=PROCESS_TIMEOUT_S) as client:
            answer = client.post("/tools/noop", json={}, headers={"Idempotency-Key": "k"})
            assert answer.json() == {"ok": True}
            assert client.get("/_audit").json()["tools"]["noop"]["duplicate_effects"] == 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=PROCESS_TIMEOUT_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_a_fake_reply_naming_its_content_type_sends_one() -> None:
    """A reply that names its own Content-Type (any case) must not get a second one."""

    class Plain(FakeServer):
        def handle(self, request: Request) -> Reply:
            return Reply(200, b"hello", {"content-type": "text/plain"})

    with Plain() as srv, socket.create_connection((srv.host, srv.port), timeout=5) as conn:
        conn.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        raw = b""
        while chunk := conn.recv(4096):
            raw += chunk
    head = raw.split(b"\r\n\r\n", 1)[0].lower()
    assert head.count(b"content-type:") == 1
    assert b"content-type: text/plain" in head
