"""The ASGI application: ``create_app(database_url)`` gives what ``outbox serve`` runs.

Starlette for routing, uvicorn to serve it, sse-starlette for the event stream. The store
(a connection pool) opens with the app's lifespan and closes with it. Unknown paths and
methods are answered in OpenAI's error shape too, so a client sees one kind of error.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

import psycopg
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse

from outbox import config as outbox_config
from outbox import logs, trace_context
from outbox.errors import OutboxError
from outbox.schemas import url_problem
from outbox.server import errors, thread_pool
from outbox.server.access import AccessLog
from outbox.server.actions import Settings
from outbox.server.console import oidc as console_oidc
from outbox.server.console import routes as console_routes
from outbox.server.console import trace_links
from outbox.server.db_pool import DB_CONNECTIONS, IDLE_IN_TRANSACTION_S, Store
from outbox.server.observed import Observed
from outbox.server.routes import ROUTES, Config
from outbox.server.wakeups import Wakeups

# The largest request body accepted: room for a message at the library's payload cap,
# JSON escaping and the other fields (bytes).
MAX_BODY_BYTES = 4 * outbox_config.MAX_PAYLOAD_BYTES


async def http_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    message = {404: "Unknown request URL.", 405: "Method not allowed for this URL."}.get(
        exc.status_code, str(exc.detail)
    )
    err = errors.APIError(exc.status_code, message)
    return JSONResponse(err.body(), status_code=exc.status_code)


def create_app(
    database_url: str,
    *,
    model_base_url: str | None = None,
    action_timeout_s: float | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    max_connections: int = DB_CONNECTIONS,
    listen: bool = True,
    queue_timeout_s: float = thread_pool.QUEUE_TIMEOUT_S,
    idle_in_transaction_s: float = IDLE_IN_TRANSACTION_S,
    console: bool = True,
    console_read_only: bool = False,
    oidc: console_oidc.Settings | None = None,
    password_sign_in: bool = True,
    trace_url_template: str | None = None,
) -> Starlette:
    """The app on ``database_url``; runs it creates call the model at ``model_base_url``
    (default: the relay's ``OPENAI_BASE_URL``) and wait ``action_timeout_s`` for client
    tool outputs (default: the library's, 10 minutes). ``listen=False``: requests waiting
    on a run poll it instead of waking on its notification (``LISTEN`` does not work
    through a pooler in transaction mode; server.wakeups). ``max_connections``: every
    connection the app holds, its ``LISTEN`` connection included (``handler_connections``).
    ``queue_timeout_s``: how long a request may wait for one before it is refused with a
    503, nothing of it done (server.thread_pool). ``idle_in_transaction_s``: how long a request's
    transaction may wait on the server before the database ends it (server.db_pool).
    ``console``: serve the web console at ``/console`` (server.console);
    ``console_read_only``: one where nobody changes anything, whatever their role;
    ``oidc``: its people may sign in through that OpenID Connect provider
    (server.console.oidc); ``password_sign_in=False``: through it only;
    ``trace_url_template``: a run's timeline links to its trace there
    (server.console.trace_links). ``ValueError`` when these do not fit together."""
    if not password_sign_in and oidc is None:
        raise ValueError(
            "without password sign-in, the console needs an OpenID Connect provider "
            "(--oidc-issuer and --oidc-client-id), or nobody can sign in"
        )
    if trace_url_template is not None and (
        problem := trace_links.template_problem(trace_url_template)
    ):
        raise ValueError(problem)
    handlers = handler_connections(max_connections, listen)
    store = Store(
        database_url, max_connections=handlers, idle_in_transaction_s=idle_in_transaction_s
    )
    thread_pool.size(handlers)
    thread_pool.queue_timeout(queue_timeout_s)
    wakeups = Wakeups(database_url, listen=listen)

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        # Spans are recorded when OpenTelemetry's variables ask for them (outbox.trace_context).
        traced = trace_context.setup("outbox-serve")
        store.open()
        await wakeups.start()
        try:
            yield
        finally:
            await wakeups.stop()
            store.close()
            if traced:
                trace_context.shutdown()

    app = Starlette(
        routes=[*ROUTES, console_routes.MOUNT] if console else ROUTES,
        lifespan=lifespan,
        middleware=[
            Middleware(AccessLog),
            Middleware(Observed),
            *([console_routes.MIDDLEWARE] if console else []),
        ],
        exception_handlers={
            errors.APIError: errors.api_error,
            thread_pool.ServerBusy: errors.server_busy,
            thread_pool.ClientGone: errors.client_gone,
            OutboxError: errors.library_error,
            psycopg.OperationalError: errors.database_error,
            psycopg.errors.IdleInTransactionSessionTimeout: errors.database_error,
            ValidationError: errors.validation_error,
            HTTPException: http_error,
            # Any other error: server.access answers it (a 500), logged once.
        },
    )
    settings = Settings(model_base_url, action_timeout_s)
    app.state.config = Config(store, settings, max_body_bytes, wakeups)
    app.state.console_read_only = console_read_only
    app.state.console_oidc = console_oidc.Provider(oidc) if oidc is not None else None
    app.state.console_passwords = password_sign_in
    app.state.console_trace_url = trace_url_template
    return app


def handler_connections(max_connections: int, listen: bool) -> int:
    """The connections (and threads) of the requests' calls when the app holds at most
    ``max_connections``: all but the one ``LISTEN`` connection (server.wakeups), as the
    relay's ``--db-connections`` counts its listener. ``ValueError`` when none is left."""
    handlers = max_connections - int(listen)
    if handlers < 1:
        needs = "2 (one for requests, one to LISTEN), or 1 with --no-listen" if listen else "1"
        raise ValueError(f"{max_connections} are too few: a server process needs {needs}")
    return handlers


# ``outbox serve --workers N`` runs the app in N processes (uvicorn's), each built by
# ``from_environment`` from what the command put in the environment.
ENV_MODEL_BASE_URL = "OUTBOX_SERVE_MODEL_BASE_URL"
ENV_ACTION_TIMEOUT_S = "OUTBOX_SERVE_ACTION_TIMEOUT_S"
ENV_DB_CONNECTIONS = "OUTBOX_SERVE_DB_CONNECTIONS"
ENV_LOG_LEVEL = "OUTBOX_SERVE_LOG_LEVEL"
ENV_NO_LISTEN = "OUTBOX_SERVE_NO_LISTEN"  # "1": poll waited-on runs (server.wakeups)
ENV_QUEUE_TIMEOUT_S = "OUTBOX_SERVE_QUEUE_TIMEOUT_S"
ENV_NO_CONSOLE = "OUTBOX_SERVE_NO_CONSOLE"  # "1": no web console at /console
ENV_CONSOLE_READ_ONLY = "OUTBOX_SERVE_CONSOLE_READ_ONLY"  # "1": a console that changes nothing
LOOPBACK = ("localhost", "127.0.0.1", "::1")  # where an http:// issuer is accepted
ENV_OIDC_ISSUER = "OUTBOX_SERVE_OIDC_ISSUER"
ENV_OIDC_CLIENT_ID = "OUTBOX_SERVE_OIDC_CLIENT_ID"
# The name of the variable that holds the client secret (never the secret: that stays in
# the variable the operator set, which the workers inherit).
ENV_OIDC_CLIENT_SECRET_ENV = "OUTBOX_SERVE_OIDC_CLIENT_SECRET_ENV"
ENV_OIDC_NAME = "OUTBOX_SERVE_OIDC_NAME"
ENV_OIDC_REDIRECT_URL = "OUTBOX_SERVE_OIDC_REDIRECT_URL"
ENV_NO_PASSWORD_SIGN_IN = "OUTBOX_SERVE_NO_PASSWORD_SIGN_IN"  # "1": the provider only
ENV_TRACE_URL_TEMPLATE = "OUTBOX_SERVE_TRACE_URL_TEMPLATE"


def oidc_settings(
    issuer: str | None,
    client_id: str | None,
    client_secret_env: str | None,
    name: str | None = None,
    redirect_url: str | None = None,
) -> console_oidc.Settings | None:
    """The console's provider of ``outbox serve --oidc-*`` (None: without --oidc-issuer);
    the client secret read from the variable ``client_secret_env`` names. ``ValueError``
    saying what is missing or wrong."""
    if issuer is None:
        if client_id or client_secret_env or name or redirect_url:
            raise ValueError("the --oidc-* options need --oidc-issuer")
        return None
    if problem := url_problem(issuer):
        raise ValueError(f"--oidc-issuer: {problem}")
    if urlsplit(issuer).scheme != "https" and urlsplit(issuer).hostname not in LOOPBACK:
        raise ValueError(
            f"--oidc-issuer: {issuer} is not https: a provider's keys and tokens are read "
            "over https (plain http only on this machine: localhost, 127.0.0.1, ::1)"
        )
    if not client_id:
        raise ValueError("--oidc-issuer needs --oidc-client-id (the console's client at it)")
    if redirect_url is not None and (problem := url_problem(redirect_url)):
        raise ValueError(f"--oidc-redirect-url: {problem}")
    secret = None
    if client_secret_env:
        secret = os.environ.get(client_secret_env)
        if not secret:
            raise ValueError(
                f"--oidc-client-secret-env: the variable {client_secret_env} is empty or not "
                f"set; export {client_secret_env}=<the client secret> before outbox serve"
            )
    return console_oidc.Settings(issuer, client_id, secret, name or "", redirect_url)


def from_environment() -> Starlette:
    """The app of one worker process of ``outbox serve --workers N``."""
    timeout = os.environ.get(ENV_ACTION_TIMEOUT_S)
    logs.setup(os.environ.get(ENV_LOG_LEVEL, "INFO"), "server")
    return create_app(
        os.environ["OUTBOX_DATABASE_URL"],
        model_base_url=os.environ.get(ENV_MODEL_BASE_URL) or None,
        action_timeout_s=float(timeout) if timeout else None,
        max_connections=int(os.environ.get(ENV_DB_CONNECTIONS, DB_CONNECTIONS)),
        listen=os.environ.get(ENV_NO_LISTEN) != "1",
        queue_timeout_s=float(os.environ.get(ENV_QUEUE_TIMEOUT_S, thread_pool.QUEUE_TIMEOUT_S)),
        console=os.environ.get(ENV_NO_CONSOLE) != "1",
        console_read_only=os.environ.get(ENV_CONSOLE_READ_ONLY) == "1",
        oidc=oidc_settings(
            os.environ.get(ENV_OIDC_ISSUER) or None,
            os.environ.get(ENV_OIDC_CLIENT_ID) or None,
            os.environ.get(ENV_OIDC_CLIENT_SECRET_ENV) or None,
            os.environ.get(ENV_OIDC_NAME) or None,
            os.environ.get(ENV_OIDC_REDIRECT_URL) or None,
        ),
        password_sign_in=os.environ.get(ENV_NO_PASSWORD_SIGN_IN) != "1",
        trace_url_template=os.environ.get(ENV_TRACE_URL_TEMPLATE) or None,
    )
