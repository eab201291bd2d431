"""``WebhookReceiver``: an HTTP server that receives webhook deliveries, for tests.

It keeps every delivery it got (headers and body, in order), checks each signature with
the endpoint's secret when it is given one (``outbox.webhooks.verify``), and can refuse the
first deliveries (``fail_first``: answered 500) to exercise the relay's retries. A real
local server, like the other fakes of ``outbox.testing``.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

from outbox import webhooks
from outbox.testing.server import FakeServer, Reply, Request, json_reply


@dataclass(frozen=True)
class Delivery:
    webhook_id: str
    headers: dict[str, str]
    body: dict[str, Any]
    verified: bool | None  # None: no secret to check with


class WebhookReceiver(FakeServer):
    def __init__(self, *, fail_first: int = 0, secret: str | None = None) -> None:
        super().__init__()
        self.fail_first = fail_first
        self.secret = secret
        self.deliveries: list[Delivery] = []  # answered 2xx
        self.refused: list[Delivery] = []  # answered 500 (fail_first)
        self.arrived = threading.Condition(self.lock)

    def handle(self, request: Request) -> Reply:
        verified = None
        if self.secret is not None:
            try:
                webhooks.verify(self.secret, request.headers, request.body)
                verified = True
            except ValueError:
                verified = False
        delivery = Delivery(
            request.headers.get("webhook-id", ""),
            dict(request.headers),
            json.loads(request.body or b"{}"),
            verified,
        )
        with self.lock:
            if self.fail_first > 0:
                self.fail_first -= 1
                self.refused.append(delivery)
                self.arrived.notify_all()
                return json_reply(500, {"error": "refused on purpose (fail_first)"})
            self.deliveries.append(delivery)
            self.arrived.notify_all()
        return json_reply(200, {"ok": True})

    def received(self) -> list[Delivery]:
        with self.lock:
            return list(self.deliveries)
