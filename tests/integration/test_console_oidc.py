"""The console's sign-in through an OpenID Connect provider, and its links to traces, over
real HTTP (docs/console.md).

``outbox serve``'s app on uvicorn (tests/serve_harness.py) against a real PostgreSQL, and
the fake provider of ``outbox.testing.oidc`` (a real HTTP server: discovery, authorize,
token, JWKS with its own RSA key). A browser is played by an httpx2 client that keeps the
console's cookies and follows the redirects by hand, so each step can be spoilt.
"""

from __future__ import annotations

import html
from collections.abc import Iterator

import httpx2
import psycopg
import pytest

from outbox import accounts, trace_context
from outbox.server.app import create_app
from outbox.server.console.oidc import FLOW_COOKIE, Settings
from outbox.statements import journal
from outbox.testing.oidc import CLIENT_ID, CLIENT_SECRET, FakeOIDCProvider
from tests.console_harness import PASSWORD, add_user, csrf_of, sign_in, waiting_call
from tests.helpers import free_port, look, new_run
from tests.serve_harness import serve

TRACES = "https://jaeger.example/trace/{trace_id}?uiFind={span_id}"


@pytest.fixture
def provider() -> Iterator[FakeOIDCProvider]:
    with FakeOIDCProvider() as fake:
        yield fake


def settings_of(provider: FakeOIDCProvider) -> Settings:
    return Settings(provider.issuer, CLIENT_ID, CLIENT_SECRET, "Fake IdP")


@pytest.fixture
def console(db_url: str, provider: FakeOIDCProvider) -> Iterator[str]:
    with serve(db_url, oidc=settings_of(provider)) as base:
        yield base.removesuffix("/v1") + "/console"


def add_person(db_url: str, name: str, tenant: str, role: str, subject: str) -> None:
    """A console user who signs in through the provider only (no password)."""
    with psycopg.connect(db_url) as conn:
        accounts.add_user(
            conn, name, tenant_id=tenant, role=role, password=None, oidc_subject=subject
        )


def to_provider(client: httpx2.Client) -> str:
    """Start a sign-in in ``client``'s browser: the provider's answer to the authorization
    request, the URL it sends the browser back to (the console's callback, with a code)."""
    start = client.get("/sign-in/oidc")
    assert start.status_code == 303, start.text
    assert client.cookies.get(FLOW_COOKIE)
    at_provider = httpx2.get(start.headers["location"])
    assert at_provider.status_code == 302, at_provider.text
    return at_provider.headers["location"]


def oidc_sign_in(
    console: str, provider: FakeOIDCProvider, subject: str, **spoilt: object
) -> tuple[httpx2.Client, httpx2.Response]:
    """A browser that went through the provider as ``subject`` (its ID token spoilt as
    ``spoilt`` says), and the console's answer to its return."""
    client = httpx2.Client(base_url=console, timeout=30)
    provider.sign_in_as(subject, **spoilt)
    answer = client.get(to_provider(client))
    return client, answer


def sessions(db_url: str) -> list[tuple[str, str]]:
    return look(db_url, "SELECT user_name, tenant_id FROM outbox.console_sessions ORDER BY 1")


def test_a_person_signs_in_through_the_provider_into_their_tenant_and_role(
    db_url, console, provider
):
    add_person(db_url, "rita", "acme", "reviewer", "sub-rita")
    page = httpx2.get(console + "/sign-in").text
    assert "Sign in with Fake IdP" in page and 'name="password"' in page

    client, answer = oidc_sign_in(console, provider, "sub-rita")
    assert answer.status_code == 303 and answer.headers["location"] == "/console/approvals"
    assert client.cookies.get("outbox_console") and not client.cookies.get(FLOW_COOKIE)
    inbox = client.get("/approvals")
    assert inbox.status_code == 200
    assert "rita · reviewer · tenant acme" in html.unescape(inbox.text)
    assert sessions(db_url) == [("rita", "acme")]
    assert provider.token_requests == 1  # the code exchanged once, with the client's secret
    # A person without a password cannot sign in with one (the same answer as a wrong one).
    assert sign_in(console, "rita", PASSWORD)[1] == 401


@pytest.mark.parametrize(
    ("spoilt", "said"),
    [
        ({"nonce": "another-sign-ins-nonce"}, "does not carry this sign-in's nonce"),
        ({"other_key": True}, "does not verify against its published keys"),
        ({"audience": "another-client"}, "issued to another client"),
        ({"expires_in": -600}, "has expired"),
        ({"issuer": "https://evil.example"}, "issued by another issuer"),
    ],
    ids=["wrong nonce", "another key", "wrong audience", "expired", "wrong issuer"],
)
def test_a_spoilt_id_token_is_refused_with_no_session(db_url, console, provider, spoilt, said):
    add_person(db_url, "rita", "acme", "reviewer", "sub-rita")
    client, answer = oidc_sign_in(console, provider, "sub-rita", **spoilt)
    assert answer.status_code == 401
    assert said in html.unescape(answer.text), answer.text
    assert "Sign in with Fake IdP" in answer.text  # the way to try again
    assert client.cookies.get("outbox_console") is None
    assert client.get("/approvals").status_code == 303  # to the sign-in
    assert sessions(db_url) == []


def test_a_wrong_state_is_refused_with_no_session(db_url, console, provider):
    add_person(db_url, "rita", "acme", "reviewer", "sub-rita")
    client = httpx2.Client(base_url=console, timeout=30)
    provider.sign_in_as("sub-rita")
    back = to_provider(client)
    state = httpx2.URL(back).params["state"]
    answer = client.get(back.replace(state, "forged-state"))
    assert answer.status_code == 400
    assert "state does not match" in html.unescape(answer.text)
    assert provider.token_requests == 0  # the code was never exchanged
    assert sessions(db_url) == [] and client.cookies.get("outbox_console") is None


def test_a_replayed_code_is_refused_with_no_second_session(db_url, console, provider):
    add_person(db_url, "rita", "acme", "reviewer", "sub-rita")
    client = httpx2.Client(base_url=console, timeout=30)
    provider.sign_in_as("sub-rita")
    back = to_provider(client)
    flow = client.cookies[FLOW_COOKIE]
    assert client.get(back).status_code == 303
    assert len(sessions(db_url)) == 1

    # The same browser again: its flow cookie is spent.
    again = client.get(back)
    assert again.status_code == 400 and "not started in this browser" in again.text
    # Someone who copied the flow cookie and the link: the provider takes a code once.
    thief = httpx2.Client(base_url=console, timeout=30, cookies={FLOW_COOKIE: flow})
    stolen = thief.get(back)
    assert stolen.status_code == 401
    assert "refused this sign-in's code" in html.unescape(stolen.text)
    assert thief.cookies.get("outbox_console") is None
    assert len(sessions(db_url)) == 1


def test_a_sign_in_the_provider_refused_is_said_so(db_url, console, provider):
    client = httpx2.Client(base_url=console, timeout=30)
    answer = client.get(to_provider(client))  # nobody scripted: the person cancelled
    assert answer.status_code == 401
    assert "Fake IdP did not sign you in: access_denied" in html.unescape(answer.text)
    assert provider.token_requests == 0 and sessions(db_url) == []


def test_an_unknown_subject_is_refused_with_what_the_operator_must_run(db_url, console, provider):
    client, answer = oidc_sign_in(console, provider, "sub-nobody")
    assert answer.status_code == 403
    text = html.unescape(answer.text)
    assert "no console user of this server has that subject" in text
    assert "outbox console users add YOUR_NAME --tenant TENANT --role reviewer" in text
    assert "--oidc-subject sub-nobody" in text
    assert sessions(db_url) == [] and client.cookies.get("outbox_console") is None


def test_a_reviewer_signed_in_through_the_provider_decides_only_their_tenants_approvals(
    db_url, console, provider
):
    add_person(db_url, "rita", "acme", "reviewer", "sub-rita")
    add_person(db_url, "gus", "globex", "reviewer", "sub-gus")
    run, approval = waiting_call(db_url, {"amount": 42, "to": "bob"})
    theirs, _ = oidc_sign_in(console, provider, "sub-gus")
    other_inbox = theirs.get("/approvals").text
    assert "approval-" not in other_inbox and str(run.id) not in other_inbox
    assert theirs.get(f"/runs/{run.id}").status_code == 404
    refused = theirs.post(
        f"/approvals/{approval}/decide",
        data={"csrf_token": csrf_of(other_inbox), "decision": "approve"},
    )
    assert refused.status_code == 404

    mine, _ = oidc_sign_in(console, provider, "sub-rita")
    inbox = mine.get("/approvals").text
    assert f'id="approval-{approval}"' in inbox
    done = mine.post(
        f"/approvals/{approval}/decide",
        data={"csrf_token": csrf_of(inbox), "decision": "approve", "reason": "fine"},
    )
    assert done.status_code == 303
    assert look(db_url, "SELECT actor FROM outbox.journal WHERE event = 'approval.approved'") == [
        ("rita",)
    ]


def test_a_console_without_password_sign_in_shows_and_takes_no_password(db_url, provider):
    add_user(db_url, "rita", "acme", "reviewer")  # a password account
    with serve(db_url, oidc=settings_of(provider), password_sign_in=False) as base:
        console = base.removesuffix("/v1") + "/console"
        client = httpx2.Client(base_url=console, timeout=30)
        page = client.get("/sign-in").text
        assert "Sign in with Fake IdP" in page and 'name="password"' not in page
        # A form posted by hand, with the sign-in's own token: refused all the same.
        token = client.cookies["outbox_console_sign_in"]
        posted = client.post(
            "/sign-in", data={"name": "rita", "password": PASSWORD, "csrf_token": token}
        )
        assert posted.status_code == 403 and "provider only" in posted.text
        assert client.cookies.get("outbox_console") is None
    with pytest.raises(ValueError, match="nobody can sign in"):
        create_app(db_url, password_sign_in=False)


def test_a_provider_that_does_not_answer_is_said_so(db_url):
    silent = Settings(f"http://127.0.0.1:{free_port()}", CLIENT_ID, CLIENT_SECRET, "Gone IdP")
    with serve(db_url, oidc=silent) as base:
        answer = httpx2.get(base.removesuffix("/v1") + "/console/sign-in/oidc")
    assert answer.status_code == 502 and "Gone IdP did not answer" in answer.text


def test_users_add_with_an_oidc_subject_asks_no_password(db_url, monkeypatch):
    from click.testing import CliRunner

    import cli

    monkeypatch.setenv("OUTBOX_DATABASE_URL", db_url)
    runner = CliRunner()
    add = ["console", "users", "add", "--tenant", "acme", "--role", "reviewer"]
    done = runner.invoke(cli.main, [*add, "rita", "--oidc-subject", "00u1abc"])
    assert done.exit_code == 0, done.output
    assert "signs in as 00u1abc at the provider" in done.output
    again = runner.invoke(cli.main, [*add, "sam", "--oidc-subject", "00u1abc"])
    assert again.exit_code != 0 and "another console user has the OpenID" in again.output
    spaced = runner.invoke(cli.main, [*add, "tom", "--oidc-subject", "has space"])
    assert spaced.exit_code != 0 and "is not valid" in spaced.output
    listed = runner.invoke(cli.main, ["console", "users", "list", "--json"])
    assert '"oidc_subject": "00u1abc"' in listed.output
    assert look(db_url, "SELECT password_hash FROM outbox.console_users") == [(None,)]
    (event,) = look(db_url, "SELECT detail FROM outbox.journal WHERE event = 'console.user_added'")
    assert event[0] == {"name": "rita", "role": "reviewer", "password": False,
                        "oidc_subject": "00u1abc"}  # fmt: skip


# -- links to traces ----------------------------------------------------------------------


def test_a_timeline_links_to_its_runs_trace_and_each_attempts_span(db_url):

    add_user(db_url, "rita", "acme", "reviewer")
    caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    with psycopg.connect(db_url) as conn:
        continued = new_run(conn, tenant="acme", traceparent=caller)
        own = new_run(conn, tenant="acme")
        journal(
            conn,
            "tool_call.result",
            "acme",
            run_id=continued.id,
            detail={"span": {"id": "a1b2c3d4e5f60718", "n": 1}},
        )
        journal(conn, "test.noted", "acme", run_id=continued.id, detail={"span": {"id": "<b>"}})
    with serve(db_url, trace_url_template=TRACES) as base:
        client, _ = sign_in(base.removesuffix("/v1") + "/console", "rita")
        page = client.get(f"/runs/{continued.id}").text
        fragment = client.get(f"/runs/{continued.id}/timeline").text
        own_page = client.get(f"/runs/{own.id}").text
    agent = f"{trace_context.agent_span_id(continued.id):016x}"
    run_link = f"https://jaeger.example/trace/4bf92f3577b34da6a3ce929d0e0e4736?uiFind={agent}"
    span_link = (
        "https://jaeger.example/trace/4bf92f3577b34da6a3ce929d0e0e4736?uiFind=a1b2c3d4e5f60718"
    )
    for text in (page, fragment):
        assert f'href="{html.escape(run_link)}" rel="noopener noreferrer"' in text
        assert f'href="{html.escape(span_link)}"' in text
        assert text.count('class="span"') == 1  # not the event whose span id is not hex
    own_trace = f"{trace_context.own_trace_id(own.id):032x}"
    assert f"https://jaeger.example/trace/{own_trace}?" in own_page

    with serve(db_url) as base:  # no template: no link
        client, _ = sign_in(base.removesuffix("/v1") + "/console", "rita")
        assert 'class="trace"' not in client.get(f"/runs/{continued.id}").text
    with pytest.raises(ValueError, match="has no"):
        create_app(db_url, trace_url_template="https://jaeger.example/trace/")
