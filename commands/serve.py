"""``outbox serve``: the HTTP server (OpenAI's protocols, the run API, SSE), and with
``--with-relay`` a relay beside it for a local setup.

That relay is a child process running ``python -m outbox.commands relay``, the command a production
relay runs, stopped with the server. uvicorn and the ASGI app are imported when the command
runs, not for every ``outbox`` command.
"""

from __future__ import annotations

import os
import sys

import click

from outbox import db

RELAY_STOP_S = 30.0  # seconds `serve --with-relay` gives its relay to drain before killing it


@click.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8000, show_default=True, help="Port to listen on.")
@click.option(
    "--with-relay",
    is_flag=True,
    help="Also run `outbox relay` (as a child process, stopped with the server): one "
    "command for a local setup. In production, run relays as their own processes.",
)
@click.option(
    "--affinity-header",
    "affinity_headers",
    multiple=True,
    help="With --with-relay: the relay's --affinity-header (NAME or BASE_URL=NAME), the "
    "header that carries each model request's prompt_cache_key.",
)
@click.option(
    "--model-base-url",
    help="OpenAI-compatible server the runs created here call (default: the relay's "
    "$OPENAI_BASE_URL).",
)
@click.option(
    "--action-timeout",
    "action_timeout_s",
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds a run waits in requires_action for client tool outputs before it "
    "expires (expires_at).  [default: 600]",
)
@click.option(
    "--db-connections",
    default=10,
    show_default=True,
    help="Database connections of a server process, its LISTEN connection included "
    "(requests wait for one of the others).",
)
@click.option(
    "--queue-timeout",
    "queue_timeout_s",
    type=click.FloatRange(min=0, min_open=True),
    default=30.0,
    show_default=True,
    help="Seconds a request may wait for a free database connection before it is refused "
    "with 503 and Retry-After, nothing of it done (its client sends it again). A request "
    "whose run was created always gets its answer. Keep it below your clients' own "
    "timeout.",
)
@click.option(
    "--workers",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Server processes (uvicorn's workers): each holds its own --db-connections. Up to "
    "the cores the server has to itself (docs/serve.md).",
)
@click.option(
    "--no-listen",
    is_flag=True,
    help="Requests waiting on a run poll it instead of being woken by LISTEN (behind a "
    "pooler in transaction mode, where LISTEN does not work).",
)
@click.option(
    "--metrics-port",
    type=int,
    help="Serve Prometheus metrics of the requests (outbox_serve_request_seconds) on this "
    "port; with --workers 1 only.",
)
@click.option(
    "--metrics-host",
    default="127.0.0.1",
    show_default=True,
    help="Address the metrics are served on (0.0.0.0: every interface).",
)
@click.option(
    "--no-console",
    is_flag=True,
    help="Do not serve the web console at /console (docs/console.md).",
)
@click.option(
    "--console-read-only",
    is_flag=True,
    help="Serve a console where nobody approves, denies or changes anything, whatever "
    "their role: people read (docs/console.md).",
)
@click.option(
    "--oidc-issuer",
    metavar="URL",
    help="Console: people may also sign in through this OpenID Connect provider (its "
    "issuer, exactly as its discovery document names it; https). Who they are (tenant, "
    "role) is the console user an operator gave their subject: `outbox console users add "
    "NAME --tenant T --role R --oidc-subject SUB` (docs/console.md).",
)
@click.option("--oidc-client-id", metavar="ID", help="The console's client id at the provider.")
@click.option(
    "--oidc-client-secret-env",
    metavar="VAR",
    help="The environment variable that holds the client secret (never the secret itself: "
    "it would show in process listings). Without it, a public client (PKCE only).",
)
@click.option(
    "--oidc-name",
    metavar="NAME",
    help="The provider's name on the sign-in page: 'Sign in with NAME'.  [default: the issuer]",
)
@click.option(
    "--oidc-redirect-url",
    metavar="URL",
    help="Where the provider sends people back, as registered there (behind a proxy). "
    "[default: the URL the browser used + /console/sign-in/oidc/callback]",
)
@click.option(
    "--no-password-sign-in",
    is_flag=True,
    help="Console: sign in through the --oidc-issuer provider only; no password form.",
)
@click.option(
    "--trace-url-template",
    metavar="URL",
    help="Console: a run's timeline links to its trace there, e.g. "
    "'https://jaeger.example/trace/{trace_id}' ({span_id} too, for each turn's and call's "
    "span). Only these hex ids are substituted.",
)
@click.option("--log-level", default="info", show_default=True)
def serve_command(
    host: str,
    port: int,
    with_relay: bool,
    affinity_headers: tuple[str, ...],
    model_base_url: str | None,
    action_timeout_s: float | None,
    db_connections: int,
    queue_timeout_s: float,
    workers: int,
    no_listen: bool,
    metrics_port: int | None,
    metrics_host: str,
    no_console: bool,
    console_read_only: bool,
    oidc_issuer: str | None,
    oidc_client_id: str | None,
    oidc_client_secret_env: str | None,
    oidc_name: str | None,
    oidc_redirect_url: str | None,
    no_password_sign_in: bool,
    trace_url_template: str | None,
    log_level: str,
) -> None:
    """Serve OpenAI's Assistants protocol and the run event stream over HTTP.

    \b
    Point the openai SDK at it: OpenAI(base_url="http://HOST:PORT/v1", api_key=KEY),
    with a key from `outbox keys create --tenant T`. Every request acts for the key's
    tenant under row-level security. GET /v1/runs/RUN/events streams a run's journal as
    Server-Sent Events (resumable with Last-Event-ID). See docs/serve.md.

    A run a request starts continues the request's traceparent header; with
    OTEL_EXPORTER_OTLP_ENDPOINT set, each request is a span exported over OTLP/HTTP
    (docs/operations.md, "Traces").

    The web console at /console (docs/console.md): people sign in with a console password
    (`outbox console users add`), or through an OpenID Connect provider with --oidc-issuer.
    """
    import signal
    import subprocess

    import uvicorn

    from outbox import logs
    from outbox.schemas import url_problem
    from outbox.server import app as server_app
    from outbox.server.console import trace_links

    if model_base_url is not None and (problem := url_problem(model_base_url)):
        raise click.BadParameter(problem, param_hint="--model-base-url")
    try:
        server_app.handler_connections(db_connections, listen=not no_listen)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--db-connections") from None
    if metrics_port is not None and workers > 1:
        raise click.BadParameter(
            "metrics are served by one process: run one server process per --metrics-port "
            "(several `outbox serve --workers 1` behind a load balancer)",
            param_hint="--metrics-port",
        )
    try:
        oidc = server_app.oidc_settings(
            oidc_issuer, oidc_client_id, oidc_client_secret_env, oidc_name, oidc_redirect_url
        )
        if no_password_sign_in and oidc is None:
            raise ValueError("--no-password-sign-in needs --oidc-issuer: nobody could sign in")
    except ValueError as err:
        raise click.UsageError(str(err)) from None
    if trace_url_template is not None and (
        problem := trace_links.template_problem(trace_url_template)
    ):
        raise click.BadParameter(problem, param_hint="--trace-url-template")
    url = db.database_url()
    with db.connect(url) as conn:
        db.check_schema_current(conn)
    relay = None
    if with_relay:
        env = {**os.environ, "OUTBOX_DATABASE_URL": url}
        affinity = [arg for name in affinity_headers for arg in ("--affinity-header", name)]
        relay = subprocess.Popen(
            [sys.executable, "-m", "outbox.commands", "relay", *affinity], env=env
        )
    # uvicorn shuts down gracefully on SIGTERM, then raises the signal again with the
    # handler it found: this one turns that into a clean exit that stops the relay below
    # (the default action would kill this process and leave the relay running).
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(0))
    try:
        if workers == 1:
            app = server_app.create_app(
                url,
                model_base_url=model_base_url,
                action_timeout_s=action_timeout_s,
                max_connections=db_connections,
                listen=not no_listen,
                queue_timeout_s=queue_timeout_s,
                console=not no_console,
                console_read_only=console_read_only,
                oidc=oidc,
                password_sign_in=not no_password_sign_in,
                trace_url_template=trace_url_template,
            )
            logs.setup(log_level, "server")
            if metrics_port is not None:
                from prometheus_client import start_http_server

                from outbox.server.observed import REGISTRY

                start_http_server(metrics_port, addr=metrics_host, registry=REGISTRY)
            uvicorn.run(app, host=host, port=port, log_level=log_level.lower(), access_log=False)
        else:
            # Each worker process builds the app itself, from the environment.
            os.environ.update(
                {
                    "OUTBOX_DATABASE_URL": url,
                    server_app.ENV_MODEL_BASE_URL: model_base_url or "",
                    server_app.ENV_ACTION_TIMEOUT_S: str(action_timeout_s or ""),
                    server_app.ENV_DB_CONNECTIONS: str(db_connections),
                    server_app.ENV_LOG_LEVEL: log_level,
                    server_app.ENV_NO_LISTEN: "1" if no_listen else "",
                    server_app.ENV_QUEUE_TIMEOUT_S: str(queue_timeout_s),
                    server_app.ENV_NO_CONSOLE: "1" if no_console else "",
                    server_app.ENV_CONSOLE_READ_ONLY: "1" if console_read_only else "",
                    server_app.ENV_OIDC_ISSUER: oidc_issuer or "",
                    server_app.ENV_OIDC_CLIENT_ID: oidc_client_id or "",
                    server_app.ENV_OIDC_CLIENT_SECRET_ENV: oidc_client_secret_env or "",
                    server_app.ENV_OIDC_NAME: oidc_name or "",
                    server_app.ENV_OIDC_REDIRECT_URL: oidc_redirect_url or "",
                    server_app.ENV_NO_PASSWORD_SIGN_IN: "1" if no_password_sign_in else "",
                    server_app.ENV_TRACE_URL_TEMPLATE: trace_url_template or "",
                }
            )
            uvicorn.run(
                "outbox.server.app:from_environment",
                factory=True,
                workers=workers,
                host=host,
                port=port,
                log_level=log_level.lower(),
                access_log=False,
            )
    finally:
        if relay is not None:
            relay.terminate()
            try:
                relay.wait(RELAY_STOP_S)
            except subprocess.TimeoutExpired:
                relay.kill()
                relay.wait()
