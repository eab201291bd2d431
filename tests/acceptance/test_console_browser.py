"""The web console in a real browser: Debian's chromium driven by Playwright.

A reviewer signs in, sees a call that waits for approval appear without a reload (made
after the page loaded), approves it, and follows the run to its end on its timeline while
the relay runs it; a call whose arguments hold markup renders inert; a wrong password is
refused; a person signs in through the fake OpenID Connect provider with one click. The
rules behind these (tenancy, CSRF, lockout, headers, the provider's checks) are also tested
over plain HTTP in tests/integration/test_console.py and test_console_oidc.py, where no
browser is needed.

No browser is downloaded: the system's chromium is used; without one these tests skip
with the command that installs it. ``DOCS_SHOTS=1`` also writes the screenshots of
docs/console.md.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from outbox import writer
from outbox.schemas import StartRun
from outbox.testing.scripted_model import ScriptedModel
from outbox.testing.tools import FakeToolService
from tests.console_harness import PASSWORD, add_user, quarantined_call, waiting_call
from tests.helpers import look
from tests.relay_harness import REPO, register_tool, relay_thread
from tests.serve_harness import ALL_KINDS, serve

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
TIMEOUT_MS = 60_000  # generous: a loaded 2-core machine
PAY = {"name": "send_email", "arguments": {"to": "bob@example.com", "subject": "refund 42"}}
SHOTS = REPO / "docs" / "console"

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium found: install it with `apt-get install -y chromium`"
)


@pytest.fixture
def browser() -> Iterator[Any]:
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=TIMEOUT_MS)  # every expect below waits as long as the pages
    with sync_playwright() as driver:
        launched = driver.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def model() -> Iterator[ScriptedModel]:
    with ScriptedModel(default=[{"text": "hello"}]) as server:
        server.add_script("pay", [{"tool_calls": [PAY]}, {"text": "paid"}])
        yield server


@pytest.fixture
def console(db_url: str, model: ScriptedModel) -> Iterator[str]:
    with serve(db_url, model_base_url=model.url + "/v1") as base:
        yield base.removesuffix("/v1") + "/console"


def signed_in_page(browser: Any, console: str, name: str) -> Any:
    from playwright.sync_api import expect

    page = browser.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(console + "/approvals")
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    page.get_by_label("Name").fill(name)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Waiting approvals")).to_be_visible()
    return page


def shoot(page: Any, name: str) -> None:
    if os.environ.get("DOCS_SHOTS") == "1":
        SHOTS.mkdir(exist_ok=True)
        page.screenshot(path=str(SHOTS / name), full_page=True)


def start_paying_run(db_url: str, model: ScriptedModel) -> writer.RunRef:
    with psycopg.connect(db_url) as conn:
        thread = writer.create_thread(conn, "acme").id
        return writer.start_run(
            conn,
            StartRun(
                tenant_id="acme",
                thread_id=thread,
                model="scripted-1",
                message="script:pay bob",
                tools=["send_email"],
                base_url=model.url + "/v1",
            ),
        )


def test_a_reviewer_sees_a_call_arrive_live_approves_it_and_the_run_completes(
    db_url: str, console: str, browser: Any, model: ScriptedModel
) -> None:
    from playwright.sync_api import expect

    add_user(db_url, "rita", "acme", "reviewer")
    add_user(db_url, "gus", "globex", "reviewer")
    with FakeToolService() as service, psycopg.connect(db_url) as conn:
        register_tool(conn, service, "send_email", "key", risk_tier="high")
        conn.commit()
        page = signed_in_page(browser, console, "rita")
        other = signed_in_page(browser, console, "gus")
        expect(page.get_by_text("No call is waiting for a decision.")).to_be_visible()

        with relay_thread(db_url, kinds=ALL_KINDS):
            run = start_paying_run(db_url, model)  # after the page loaded: arrives live
            card = page.locator("article.approval")
            expect(card).to_have_count(1)
            approval = card.get_attribute("data-approval")
            # The other tenant's reviewer posts the form with their own session's token.
            token = other.locator('input[name="csrf_token"]').first.get_attribute("value")
            refused = other.request.post(
                f"{console}/approvals/{approval}/decide",
                form={"csrf_token": token or "", "decision": "approve"},
            )
            assert refused.status == 404
            # The reviewer's own session, without the form's token.
            tokenless = page.request.post(
                f"{console}/approvals/{approval}/decide", form={"decision": "approve"}
            )
            assert tokenless.status == 403
            expect(card.locator("pre.arguments")).to_contain_text('"subject": "refund 42"')
            expect(card).to_contain_text(str(run.id))
            # The turns that led to the call, as text: the user's message first.
            expect(card.locator('li.turn[data-role="user"]')).to_contain_text("pay bob")
            shoot(page, "inbox.png")

            # The run's timeline, open before the decision, follows it without a reload.
            timeline = browser.new_page()
            timeline.set_default_timeout(TIMEOUT_MS)
            timeline.context.add_cookies(page.context.cookies())  # rita's session
            timeline.goto(f"{console}/runs/{run.id}")
            expect(timeline.locator('tr[data-event="approval.requested"]')).to_have_count(1)
            expect(timeline.locator('tr[data-event="approval.approved"]')).to_have_count(0)
            timeline.evaluate("window.notReloaded = true")

            card.get_by_label("Reason").fill("invoice checked")
            card.get_by_role("button", name="Approve").click()
            expect(page.get_by_text("No call is waiting for a decision.")).to_be_visible()

            expect(timeline.locator(".status")).to_have_text("completed")
            expect(timeline.locator('tr[data-event="approval.approved"]')).to_contain_text("rita")
            expect(timeline.locator('tr[data-event="run.completed"]')).to_have_count(1)
            assert timeline.evaluate("window.notReloaded") is True
            shoot(timeline, "timeline.png")
            assert len(service.tool("send_email").effects) == 1
            timeline.goto(f"{console}/operations")
            expect(timeline.get_by_role("heading", name="Stuck runs")).to_be_visible()
            expect(timeline.locator('tr[data-tool="send_email"]')).to_have_count(1)

        # The other tenant's reviewer saw nothing of it, live or on a reload.
        other.reload()
        expect(other.get_by_text("No call is waiting for a decision.")).to_be_visible()
        assert str(run.id) not in other.content()
    assert look(db_url, "SELECT actor FROM outbox.journal WHERE event = 'approval.approved'") == [
        ("rita",)
    ]


def test_markup_in_arguments_renders_inert_and_a_wrong_password_is_refused(
    db_url: str, console: str, browser: Any
) -> None:
    from playwright.sync_api import expect

    add_user(db_url, "rita", "acme", "reviewer")
    hostile = '<img src=x onerror="document.title=\'pwned\'"><a href="javascript:alert(1)">x</a>'
    waiting_call(db_url, {"note": hostile})
    page = signed_in_page(browser, console, "rita")
    expect(page.locator("pre.arguments")).to_contain_text("<img src=x onerror=")
    assert page.locator("article.approval img").count() == 0
    assert page.locator("article.approval a[href^='javascript:']").count() == 0
    assert page.title() != "pwned"
    answer = page.request.get(console + "/approvals")
    assert "script-src 'self'" in answer.headers["content-security-policy"]

    stranger = browser.new_page()
    stranger.set_default_timeout(TIMEOUT_MS)
    stranger.goto(console + "/sign-in")
    stranger.get_by_label("Name").fill("rita")
    stranger.get_by_label("Password").fill("not the password")
    stranger.get_by_role("button", name="Sign in").click()
    expect(stranger.get_by_role("alert")).to_have_text("Wrong name or password.")


def test_an_operator_acts_on_a_selection_and_sets_a_budget_without_javascript(
    db_url: str, console: str, browser: Any
) -> None:
    """The checkboxes stand outside the bulk form (each row has forms of its own) and join
    it by their ``form`` attribute: the browser posts them with it, no script needed."""
    from playwright.sync_api import expect

    add_user(db_url, "otto", "acme", "operator")
    refs = [quarantined_call(db_url) for _ in range(3)]
    context = browser.new_context(java_script_enabled=False)
    page = signed_in_page(context, console, "otto")
    page.goto(console + "/parked")
    for ref in refs[:2]:
        page.get_by_label(f"Select call {ref}").check()
    page.get_by_label("Action").select_option("requeue")
    page.get_by_role("button", name="Act on the selected calls…").click()
    expect(page.locator("main strong")).to_have_text("2")
    page.get_by_role("button", name="Requeue 2 calls").click()
    expect(page.get_by_role("status")).to_have_text("Requeued 2 calls.")

    page.goto(console + "/operations")
    budget = page.locator('tr[data-tenant="acme"] td.budget')
    budget.get_by_label("Token budget").fill("5000")
    budget.get_by_role("button", name="Set budget").click()
    expect(page.locator('tr[data-tenant="acme"] td.budget')).to_contain_text("0 of 5000 tokens")
    shoot(page, "operations.png")
    context.close()
    assert look(db_url, "SELECT id, status FROM outbox.tool_calls ORDER BY id") == [
        (refs[0], "pending"),
        (refs[1], "pending"),
        (refs[2], "quarantined"),
    ]
    assert look(db_url, "SELECT actor FROM outbox.journal WHERE event = 'tenant.budget_set'") == [
        ("otto",)
    ]


def test_no_chromium_skips_with_the_install_command() -> None:
    """The skip message names the one command that installs the browser."""
    assert "apt-get install -y chromium" in pytestmark.kwargs["reason"]


def test_a_person_signs_in_through_the_provider_with_one_click(db_url: str, browser: Any) -> None:
    """The provider's button leads through the fake provider and back into the inbox: the
    console's headers (its CSP's form-action among them) let the redirects through."""
    from playwright.sync_api import expect

    from outbox import accounts
    from outbox.server.console.oidc import Settings
    from outbox.testing.oidc import CLIENT_ID, CLIENT_SECRET, FakeOIDCProvider

    with psycopg.connect(db_url) as conn:
        accounts.add_user(
            conn, "rita", tenant_id="acme", role="reviewer", password=None, oidc_subject="sub-r"
        )
    with FakeOIDCProvider() as provider:
        settings = Settings(provider.issuer, CLIENT_ID, CLIENT_SECRET, "Fake IdP")
        with serve(db_url, oidc=settings) as base:
            provider.sign_in_as("sub-r")
            page = browser.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            page.goto(base.removesuffix("/v1") + "/console/approvals")
            page.get_by_role("link", name="Sign in with Fake IdP").click()
            expect(page.get_by_role("heading", name="Waiting approvals")).to_be_visible()
            expect(page.locator(".who")).to_contain_text("rita · reviewer")
