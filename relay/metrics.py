"""Prometheus metrics of one relay process (served with ``--metrics-port``).

The histograms and counters by tool, model and tenant are observed when outcomes are
written (``relay.completer``), only in a process that serves its metrics: their label
look-ups are the one cost of a metric per outcome. The gauges of work waiting for a person
(approvals, parked runs) are read from the database with the queue depth, so every
process serving metrics says the same of them: aggregate them with ``max``, not ``sum``.
"""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
# A tool call or model request: milliseconds to minutes (a model's default timeout is 120 s).
EFFECT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
# A run, from its start to its end: seconds to an hour (client tools may wait 10 minutes).
RUN_BUCKETS_S = (0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)


# The most tenants one relay process labels its metrics with; the rest share the label
# OTHER_TENANTS, so a deployment with many tenants cannot grow a scraper's series without
# bound (docs/operations.md, "Metrics and alerts": series per tenant).
MAX_TENANT_LABELS = 200
OTHER_TENANTS = "_other"


class Metrics:
    def __init__(self, max_tenants: int | None = None) -> None:
        self.max_tenants = MAX_TENANT_LABELS if max_tenants is None else max_tenants
        self._tenants: set[str] = set()
        self._tenants_lock = threading.Lock()
        self.registry = CollectorRegistry()
        r = self.registry
        self.claimed = Counter("outbox_relay_claimed", "Rows claimed", ["kind"], registry=r)
        self.succeeded = Counter(
            "outbox_relay_succeeded", "Rows completed with a result", ["kind"], registry=r
        )
        self.failed = Counter(
            "outbox_relay_failed", "Tool calls completed with an error result", registry=r
        )
        self.retried = Counter("outbox_relay_retried", "Attempts scheduled again", registry=r)
        self.quarantined = Counter(
            "outbox_relay_quarantined", "Rows parked for an operator", ["reason"], registry=r
        )
        self.fenced = Counter(
            "outbox_relay_fenced_writes", "Completion writes refused: lease lost", registry=r
        )
        self.rescued = Counter("outbox_relay_rescued", "Expired leases taken back", registry=r)
        self.circuit_changes = Counter(
            "outbox_relay_model_circuit_changes",
            "Model base URL circuits this relay's completions opened or closed, by new state",
            ["state"],
            registry=r,
        )
        self.outcomes_held = Gauge(
            "outbox_relay_outcomes_held",
            "Outcomes waiting to be written because another transaction holds their run",
            registry=r,
        )
        self.sweeps_deferred = Counter(
            "outbox_relay_sweeps_deferred",
            "Maintenance sweeps that gave up on a lock another transaction holds, by sweep",
            ["sweep"],
            registry=r,
        )
        self.retained = Counter(
            "outbox_relay_retained",
            "Conversations (threads) moved out of the hot tables by retention",
            ["mode"],
            registry=r,
        )
        self.claim_to_start = Histogram(
            "outbox_relay_claim_to_start_seconds",
            "From claim to the start of the effect, by tenant",
            ["tenant"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.queue_lag = Histogram(
            "outbox_relay_queue_lag_seconds",
            "From a row being due to its claim",
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.depth = Gauge(
            "outbox_queue_depth", "Outbox rows by status and kind", ["status", "kind"], registry=r
        )
        self.oldest_ready = Gauge(
            "outbox_queue_oldest_ready_seconds", "Age of the oldest due ready row", registry=r
        )
        self.concurrency = Gauge(
            "outbox_relay_concurrency",
            "Model turns and HTTP tool calls this process may hold in flight (--concurrency)",
            registry=r,
        )
        self.in_flight = Gauge(
            "outbox_relay_in_flight",
            "Model turns and HTTP tool calls in flight in this process",
            registry=r,
        )
        self.saturated = Gauge(
            "outbox_relay_saturated",
            "1 while every --concurrency place is busy and due rows wait for one: raise "
            "--concurrency or run more relay processes",
            registry=r,
        )
        self.saturated_seconds = Counter(
            "outbox_relay_saturated_seconds",
            "Time spent with every --concurrency place busy while due rows waited",
            registry=r,
        )
        self.db_unavailable = Gauge(
            "outbox_relay_db_unavailable",
            "1 while a link of this process cannot reach the database",
            ["link"],
            registry=r,
        )

        self.tool_call_seconds = Histogram(
            "outbox_relay_tool_call_seconds",
            "Tool call attempts, from their start to their outcome, by tool, tenant and "
            "outcome (result_ok, result_error, retry, unknown, defer, lost)",
            ["tool", "tenant", "outcome"],
            buckets=EFFECT_BUCKETS_S,
            registry=r,
        )
        self.model_turn_seconds = Histogram(
            "outbox_relay_model_turn_seconds",
            "Model requests, from their start to their outcome, by model, tenant and outcome "
            "(turn, retry, fail_run, defer)",
            ["model", "tenant", "outcome"],
            buckets=EFFECT_BUCKETS_S,
            registry=r,
        )
        self.run_seconds = Histogram(
            "outbox_relay_run_seconds",
            "Runs this process ended, from their start to their end, by tenant and status",
            ["tenant", "status"],
            buckets=RUN_BUCKETS_S,
            registry=r,
        )
        self.tokens = Counter(
            "outbox_relay_tokens",
            "Tokens of the model turns recorded, by model, tenant and type (input, output, "
            "cached_input: the part of input the provider read from its prompt cache)",
            ["model", "tenant", "type"],
            registry=r,
        )
        self.errors = Counter(
            "outbox_relay_errors",
            "Attempts that failed, by kind, tenant and outcome (result_error, retry, unknown, "
            "fail_run, lost)",
            ["kind", "tenant", "outcome"],
            registry=r,
        )
        self.approvals_waiting = Gauge(
            "outbox_approvals_waiting",
            "Tool calls waiting for a reviewer's decision, by tenant",
            ["tenant"],
            registry=r,
        )
        self.approvals_oldest = Gauge(
            "outbox_approvals_oldest_waiting_seconds",
            "How long the oldest tool call waiting for a decision has waited",
            registry=r,
        )
        self.runs_parked = Gauge(
            "outbox_runs_parked",
            "Runs with a row parked for an operator (quarantined, or outcome unknown), by tenant",
            ["tenant"],
            registry=r,
        )
        self.spans_due = Gauge(
            "outbox_traces_due_runs",
            "Ended runs whose spans the trace exporter has not exported yet (tracing on)",
            registry=r,
        )
        self.spans_lag = Gauge(
            "outbox_traces_lag_seconds",
            "How long the oldest ended run has waited for its spans to be exported (tracing on)",
            registry=r,
        )

    def tenant(self, tenant_id: str) -> str:
        """The ``tenant`` label of ``tenant_id``: itself for the first ``max_tenants``
        tenants this process labels, ``OTHER_TENANTS`` for any after them."""
        if tenant_id in self._tenants:
            return tenant_id
        with self._tenants_lock:
            if len(self._tenants) < self.max_tenants:
                self._tenants.add(tenant_id)
                return tenant_id
        return OTHER_TENANTS

    def outage(self, link: str, waiting: bool) -> None:
        """A link lost the database (``waiting``) or reached it again."""
        self.db_unavailable.labels(link).set(1 if waiting else 0)

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        start_http_server(port, addr=host, registry=self.registry)
