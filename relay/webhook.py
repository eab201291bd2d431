"""Webhook deliveries: POST a run event to a tenant's endpoint, signed (``outbox.webhooks``).

A delivery is a row of kind ``webhook``; the claim returns its endpoint as it is now (URL,
encrypted secret, removed or not). Each attempt is signed afresh (``webhook-timestamp`` is
the attempt's time) under the delivery's stable ``webhook-id``, so a receiver recognises a
repeat. Any 2xx is delivered. Everything else is retried with the relay's backoff, up to the
row's attempts (8), then quarantined for an operator (``outbox requeue``): a 429 or 503
with ``Retry-After`` waits as asked; a connection that never opened is not charged. A
removed endpoint's deliveries are dropped (journaled), not sent.
"""

from __future__ import annotations

import dataclasses
import json
import time

import httpx2

from outbox import credentials, webhooks
from outbox.relay.outcomes import Claimed, Outcome, retry, retry_after_s
from outbox.relay.poster import Poster

TIMEOUT_S = 15.0  # seconds a receiver has to answer
USER_AGENT = "agent-outbox-webhooks"
PREVIEW_CHARS = 200  # of a refusal's body kept in the row's last error


def message_id(row: Claimed) -> str:
    """The delivery's ``webhook-id``: the same for every attempt."""
    assert row.payload is not None
    return f"whd_{row.payload['delivery_id']}"


class WebhookExecutor:
    def __init__(self, http: Poster) -> None:
        self.http = http

    async def run(self, row: Claimed) -> Outcome:
        started = time.monotonic()
        outcome = await self._run(row)
        return dataclasses.replace(outcome, duration_s=time.monotonic() - started)

    async def _run(self, row: Claimed) -> Outcome:
        assert row.payload is not None
        endpoint = row.credential
        if endpoint is None or endpoint.get("removed_at"):
            return Outcome(row, "webhook", "error", error="endpoint removed: not sent")
        try:
            secret = credentials.decrypt(endpoint["ciphertext"], "webhook signing secret")
        except credentials.CredentialUnavailable as err:
            return retry(row, str(err), unsent=True)
        body = json.dumps(row.payload["body"], separators=(",", ":")).encode()
        msg_id, stamp = message_id(row), int(time.time())
        headers = {
            "content-type": "application/json",
            "user-agent": USER_AGENT,
            "webhook-id": msg_id,
            "webhook-timestamp": str(stamp),
            "webhook-signature": webhooks.sign(secret, msg_id, stamp, body),
        }
        url = endpoint["url"]
        try:
            response = await self.http.post(url, content=body, headers=headers, timeout=TIMEOUT_S)
        except (httpx2.ConnectError, httpx2.ConnectTimeout) as err:
            return retry(row, f"could not reach {url}: {err!r}", unsent=True)
        except httpx2.HTTPError as err:
            return retry(row, f"no answer from {url}: {err!r}")
        if 200 <= response.status_code < 300:
            return Outcome(row, "webhook", "ok", output={"status_code": response.status_code})
        return retry(
            row,
            f"HTTP {response.status_code} from {url}: {response.text[:PREVIEW_CHARS]}",
            retry_after_s(response.headers.get("retry-after")),
        )
