"""Signed webhooks through the outbox: a run's events reach its tenant's endpoint once per
event (retried after a 500, under one webhook-id, signature verified), never another
tenant's; a repeated status enqueues nothing; a receiver that keeps failing ends
quarantined and is requeued; a removed endpoint's deliveries are dropped; a relay killed
with -9 mid-delivery is followed by the same delivery again, same webhook-id."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

import cli
from outbox import credentials, ops, tenancy, webhooks, writer
from outbox.errors import InvalidInput
from outbox.schemas import StartRun
from outbox.testing.relay import relay_process
from outbox.testing.scripted_model import ScriptedModel
from outbox.testing.server import Reply
from outbox.testing.webhooks import WebhookReceiver
from tests.relay_harness import TENANT, relay_thread, scalar, wait_until

ALL_KINDS = ("model_turn", "tool_call", "deliver_batch", "webhook")


@pytest.fixture(autouse=True)
def relay_key(monkeypatch: pytest.MonkeyPatch) -> str:
    key = credentials.new_key()
    monkeypatch.setenv(credentials.KEY_ENV, key)
    return key


@pytest.fixture
def model() -> Iterator[ScriptedModel]:
    with ScriptedModel(default=[{"text": "hello"}]) as server:
        yield server


def endpoint(db_url: str, tenant: str, url: str, events: list[str]) -> tuple[dict[str, Any], str]:
    with psycopg.connect(db_url) as conn:
        row, secret = webhooks.add_endpoint(conn, tenant, url, events, actor="test")
        conn.commit()
    return row, secret


def start(db_url: str, model: ScriptedModel, tenant: str = TENANT) -> writer.RunRef:
    with psycopg.connect(db_url) as conn:
        thread = writer.create_thread(conn, tenant).id
        run = writer.start_run(
            conn,
            StartRun(
                tenant_id=tenant,
                thread_id=thread,
                model="scripted-1",
                message="hi",
                base_url=model.url + "/v1",
            ),
        )
        conn.commit()
    return run


def webhook_rows(db_url: str) -> int:
    return int(scalar(db_url, "SELECT count(*) FROM outbox.outbox WHERE kind = 'webhook'"))


def test_sign_and_verify():
    secret = webhooks.new_secret()
    body = b'{"type":"run.completed"}'
    now = int(time.time())
    headers = {
        "webhook-id": "whd_1",
        "webhook-timestamp": str(now),
        "webhook-signature": webhooks.sign(secret, "whd_1", now, body),
    }
    assert webhooks.verify(secret, headers, body) == "whd_1"
    with pytest.raises(ValueError, match="no webhook-signature matches"):
        webhooks.verify(secret, headers, body + b" ")
    with pytest.raises(ValueError, match="no webhook-signature matches"):
        webhooks.verify(webhooks.new_secret(), headers, body)
    with pytest.raises(ValueError, match="not within"):
        webhooks.verify(secret, headers, body, now=now + 3600)
    with pytest.raises(ValueError, match="no webhook-id"):
        webhooks.verify(secret, {}, body)


def test_a_completed_run_is_delivered_once_after_a_500_signed_under_one_id(db_url, model):
    with WebhookReceiver(fail_first=1) as receiver:
        row, secret = endpoint(db_url, TENANT, receiver.url + "/hooks", ["run.completed"])
        receiver.secret = secret
        other, _ = endpoint(db_url, "globex", receiver.url + "/other", [])
        run = start(db_url, model)
        with relay_thread(db_url, kinds=ALL_KINDS):
            wait_until(lambda: receiver.received(), what="the webhook delivered")
            wait_until(lambda: webhook_rows(db_url) == 0, what="the webhook row finished")
        (refused,) = receiver.refused
        (delivered,) = receiver.received()
        assert delivered.webhook_id == refused.webhook_id and delivered.verified
        assert delivered.body["type"] == "run.completed"
        data = delivered.body["data"]
        assert (data["id"], data["status"], data["tenant_id"]) == (str(run.id), "completed", TENANT)
        assert data["previous_status"] == "queued"  # one model turn, no tools
    with psycopg.connect(db_url) as conn:
        (done,) = conn.execute(
            "SELECT endpoint_id, delivered_at IS NOT NULL, status_code, attempts"
            " FROM outbox.webhook_deliveries"
        ).fetchall()
        events = [
            r[0]
            for r in conn.execute(
                "SELECT event FROM outbox.journal WHERE event LIKE 'webhook.%' ORDER BY id"
            )
        ]
    assert done == (row["id"], True, 200, 2)
    assert events == ["webhook.added", "webhook.added", "webhook.retry_scheduled",
                      "webhook.delivered"]  # fmt: skip
    assert other["id"] != row["id"]  # globex's endpoint got nothing of acme's run


def test_one_delivery_per_status_change_a_repeated_status_enqueues_nothing(db_url, model):
    endpoint(db_url, TENANT, "http://127.0.0.1:9/hooks", ["run.requires_action"])
    run = start(db_url, model)
    with psycopg.connect(db_url) as conn:
        conn.execute("SET ROLE outbox_writer")  # a backend's role: no rights on webhook tables
        tenancy.scope(conn, TENANT)
        for status in ("requires_action", "requires_action", "in_progress", "requires_action"):
            conn.execute("UPDATE outbox.runs SET status = %s WHERE id = %s", [status, run.id])
        conn.commit()
        conn.execute("RESET ROLE")
        keys = [
            r[0]
            for r in conn.execute("SELECT event_key FROM outbox.webhook_deliveries ORDER BY id")
        ]
    assert keys == [f"{run.id}:run.requires_action:1", f"{run.id}:run.requires_action:2"]
    assert webhook_rows(db_url) == 2


def test_a_receiver_that_keeps_failing_is_quarantined_then_requeued(db_url, model):
    with WebhookReceiver(fail_first=1000) as receiver:
        endpoint(db_url, TENANT, receiver.url, ["run.queued"])
        start(db_url, model)
        with relay_thread(db_url, kinds=("webhook",)):
            wait_until(
                lambda: (
                    scalar(db_url, "SELECT status FROM outbox.outbox WHERE kind = 'webhook'")
                    == "quarantined"
                ),
                what="the webhook quarantined after its attempts",
            )
            assert len(receiver.refused) == 8 and receiver.received() == []
            receiver.fail_first = 0
            with psycopg.connect(db_url) as conn:
                outbox_id = scalar(db_url, "SELECT id FROM outbox.outbox WHERE kind = 'webhook'")
                ops.requeue(conn, f"outbox:{outbox_id}", actor="ops")
                conn.commit()
            wait_until(lambda: receiver.received(), what="the requeued webhook delivered")
        ids = {d.webhook_id for d in receiver.refused + receiver.received()}
        assert len(ids) == 1


def test_a_removed_endpoints_deliveries_are_dropped(db_url, model):
    with WebhookReceiver() as receiver:
        row, _ = endpoint(db_url, TENANT, receiver.url, ["run.queued"])
        start(db_url, model)
        with psycopg.connect(db_url) as conn:
            webhooks.remove_endpoint(conn, row["id"], actor="ops")
            conn.commit()
        start(db_url, model)  # after removal: not even enqueued
        assert webhook_rows(db_url) == 1
        with relay_thread(db_url, kinds=("webhook",)):
            wait_until(lambda: webhook_rows(db_url) == 0, what="the webhook row dropped")
        assert receiver.received() == []
    assert (
        scalar(db_url, "SELECT count(*) FROM outbox.journal WHERE event = 'webhook.dropped'") == 1
    )


def test_a_relay_killed_mid_delivery_delivers_again_under_the_same_id(db_url, model, relay_key):
    class SlowFirst(WebhookReceiver):
        def handle(self, request: Any) -> Reply:
            reply = super().handle(request)
            if len(self.deliveries) == 1:
                reply.delay_s = 60.0  # the relay is killed while it waits for this answer
            return reply

    with SlowFirst() as receiver:
        endpoint(db_url, TENANT, receiver.url, ["run.queued"])
        start(db_url, model)
        args = ("--kind", "webhook", "--lease", "2", "--retry-base", "0.05")
        env = {credentials.KEY_ENV: relay_key}
        with relay_process(db_url, *args, env=env) as first:
            wait_until(lambda: receiver.received(), what="the first delivery to arrive")
            os.kill(first.pid, signal.SIGKILL)
            first.wait()
        # The relay that takes over runs in a thread: only the killed one must be a process.
        with relay_thread(db_url, kinds=("webhook",)):
            wait_until(lambda: len(receiver.received()) == 2, what="the delivery sent again")
            wait_until(lambda: webhook_rows(db_url) == 0, what="the webhook row finished")
        first_id, second_id = (d.webhook_id for d in receiver.received())
        assert first_id == second_id


def test_bad_endpoints_are_refused_and_the_cli_shows_a_secret_once(db_url, monkeypatch):
    with psycopg.connect(db_url) as conn:
        with pytest.raises(InvalidInput, match="not an http"):
            webhooks.add_endpoint(conn, TENANT, "ftp://x", [])
        with pytest.raises(InvalidInput, match="unknown events"):
            webhooks.add_endpoint(conn, TENANT, "http://x.test", ["run.exploded"])
    monkeypatch.setenv("OUTBOX_DATABASE_URL", db_url)
    runner = CliRunner()
    added = runner.invoke(
        cli.main, ["webhooks", "add", "--tenant", TENANT, "--url", "http://x.test/h"]
    )
    assert added.exit_code == 0, added.output
    secret = added.stdout.strip()
    assert secret.startswith("whsec_")
    listed = runner.invoke(cli.main, ["webhooks", "list", "--json"])
    assert secret not in listed.output and "http://x.test/h" in listed.output
    monkeypatch.delenv(credentials.KEY_ENV)
    refused = runner.invoke(
        cli.main, ["webhooks", "add", "--tenant", TENANT, "--url", "http://x.test/2"]
    )
    assert refused.exit_code == 2 and "OUTBOX_CREDENTIALS_KEY" in refused.output
    assert scalar(db_url, "SELECT count(*) FROM outbox.webhook_endpoints") == 1
