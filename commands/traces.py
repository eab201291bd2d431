"""``outbox traces``: the trace exporter, which builds runs' spans from what the database
recorded and exports them over OTLP (``outbox.trace_export``), and how far behind it is."""

from __future__ import annotations

import signal
import threading

import click

from outbox.commands.common import (
    EXIT_CONFIG,
    OutboxGroup,
    connection,
    echo_json,
    emit,
    json_option,
    refuse,
)


@click.group("traces", cls=OutboxGroup)
def traces_group() -> None:
    """Traces: export ended runs' spans, built from the database. Over OTLP, as
    OpenTelemetry's variables say (docs/operations.md, "Traces")."""


@traces_group.command("export")
@click.option("--once", is_flag=True, help="Export what is due now, then exit.")
@click.option(
    "--batch",
    default=200,
    show_default=True,
    type=click.IntRange(min=1),
    help="Runs per export (each one transaction, one OTLP request).",
)
@click.option(
    "--interval",
    "interval_s",
    default=1.0,
    show_default=True,
    type=click.FloatRange(min=0.01),
    help="Seconds between passes when nothing more is due.",
)
@click.option("--parent-pid", type=int, hidden=True)  # `outbox relay` starts it: stop with it
@click.option("--log-level", default="INFO", show_default=True)
def export_cmd(
    once: bool, batch: int, interval_s: float, parent_pid: int | None, log_level: str
) -> None:
    """Build the spans of runs that ended and export them, as OpenTelemetry's variables
    say (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_TRACES_EXPORTER, OTEL_SERVICE_NAME,
    OTEL_TRACES_SAMPLER...).

    Each run's invoke_agent span and every attempt's chat and execute_tool span are built
    from its rows and journal once the run has ended, with the ids its tools and models
    were sent. Any number of exporters may run: each run is taken by one. Export is at
    least once (a crash between export and commit exports the same spans again, same ids).
    `outbox relay` starts one beside itself when the variables ask for traces. SIGTERM or
    Ctrl-C stops it after the batch in hand. See docs/operations.md, "Traces".
    """
    from outbox import logs, trace_context, trace_export

    logs.setup(log_level)
    if not trace_context.wanted():
        refuse(
            "OpenTelemetry's variables ask for no traces",
            "set OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_TRACES_EXPORTER=console)",
            EXIT_CONFIG,
        )
    try:
        exporters = trace_context.span_exporters()
    except ValueError as err:
        refuse(str(err), "", EXIT_CONFIG)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda _signum, _frame: stop.set())
    trace_export.run(
        exporters=exporters,
        interval_s=interval_s,
        limit=batch,
        stop=stop,
        once=once,
        parent_pid=parent_pid,
    )


@traces_group.command("status")
@json_option
def status_cmd(as_json: bool) -> None:
    """How many ended runs wait for their spans (due), and how long the oldest has waited
    (lag_s, seconds): the trace exporter's lag."""
    from outbox import trace_export

    with connection() as conn:
        lag = trace_export.lag(conn)
    if as_json:
        echo_json(lag)
    else:
        emit([lag], False, ["due", "lag_s"])
