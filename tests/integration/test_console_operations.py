"""The console's operations over real HTTP: budgets and limits set from the operations page,
a selection of parked calls acted on in bulk (beside a relay working the same calls), and
tenants paused and tools switched in bulk (docs/console.md, "Operations", "Parked calls").

``outbox serve``'s app on uvicorn (tests/serve_harness.py) against a real PostgreSQL; the
other console tests are tests/integration/test_console.py.
"""

from __future__ import annotations

import html
import re
import threading
from collections.abc import Iterator
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

import httpx2
import psycopg
import pytest

from outbox import ops
from outbox.server.console import bulk
from outbox.testing.tools import FakeToolService
from tests.console_harness import add_user, csrf_of, quarantined_call, sign_in, unknown_call
from tests.helpers import add_tool, look
from tests.relay_harness import register_tool, relay_thread, seed, wait_until
from tests.serve_harness import serve

FORM = {"content-type": "application/x-www-form-urlencoded"}


@pytest.fixture
def console(db_url: str) -> Iterator[str]:
    with serve(db_url) as base:
        yield base.removesuffix("/v1") + "/console"


def people(db_url: str, *accounts: tuple[str, str, str]) -> None:
    for name, tenant, role in accounts:
        add_user(db_url, name, tenant, role)


def post(client: httpx2.Client, path: str, fields: list[tuple[str, str]]) -> httpx2.Response:
    """A form post with repeated fields (checkboxes of one name)."""
    return client.post(path, content=urlencode(fields), headers=FORM)


def journal(db_url: str, like: str) -> list[tuple[Any, ...]]:
    return look(
        db_url,
        "SELECT event, tenant_id, actor, detail FROM outbox.journal WHERE event LIKE %s "
        "ORDER BY id",
        [like],
    )


def test_budgets_and_limits_are_set_from_the_page_by_operators_of_their_scope(db_url, console):
    """A tenant's operator sets its budget and its limit, a platform operator a tool's
    limits, each through the command line's functions and journaled with the person; a
    reviewer, a viewer, another tenant's operator, a form without its token and values
    that are not valid change nothing, and the refusal names the field."""
    people(
        db_url,
        ("olga", "*", "operator"),
        ("otto", "acme", "operator"),
        ("gus", "globex", "operator"),
        ("rita", "acme", "reviewer"),
        ("vic", "acme", "viewer"),
    )
    with psycopg.connect(db_url) as conn:
        add_tool(conn, "lookup_order")
    otto, _ = sign_in(console, "otto")
    page = otto.get("/operations").text
    assert 'action="/console/operations/budget"' in page
    assert 'action="/console/operations/tool-limit"' not in page  # a platform's setting
    token = csrf_of(page)

    def act(client: httpx2.Client, action: str, token: str, **fields: str) -> httpx2.Response:
        return client.post(f"/operations/{action}", data={"csrf_token": token, **fields})

    done = act(otto, "budget", token, tenant="acme", max_tokens="1000", max_cost="2.50")
    assert done.status_code == 303
    assert act(otto, "tenant-limit", token, tenant="acme", max_concurrency="4").status_code == 303
    refused = act(otto, "tool-limit", token, tool="lookup_order", max_concurrency="3")
    assert refused.status_code == 403 and "platform operator" in refused.text
    olga, _ = sign_in(console, "olga")
    olgas = csrf_of(olga.get("/operations").text)
    limited = act(olga, "tool-limit", olgas, tool="lookup_order", max_concurrency="3", rate="1.5")
    assert limited.status_code == 303
    shown = olga.get("/operations").text
    assert 'data-tenant="acme"' in shown and "1000 tokens" in shown
    assert "3 at once, 1.5 a second" in shown and "4 at once" in shown

    rita, _ = sign_in(console, "rita")
    vic, _ = sign_in(console, "vic")
    gus, _ = sign_in(console, "gus")
    for client in (rita, vic, gus):
        theirs = csrf_of(client.get("/operations").text)
        assert act(client, "budget", theirs, tenant="acme", max_tokens="1").status_code == 403
        assert (
            act(client, "tenant-limit", theirs, tenant="acme", max_concurrency="1").status_code
            == 403
        )
    assert act(otto, "budget", token, tenant="globex", max_tokens="1").status_code == 403
    assert act(otto, "budget", "x" * 43, tenant="acme", max_tokens="1").status_code == 403
    assert (
        otto.post("/operations/budget", data={"tenant": "acme", "max_tokens": "1"}).status_code
        == 403
    )

    acme = {"tenant": "acme"}
    bad = [
        (otto, token, "budget", {**acme, "max_tokens": "-5"}, "token budget must be positive"),
        (otto, token, "budget", {**acme, "max_tokens": "lots"}, "must be a whole number"),
        (otto, token, "budget", {**acme, "max_cost": "-1"}, "money must be a finite number at"),
        (otto, token, "budget", {**acme, "max_cost": "0"}, "money must be positive"),
        (otto, token, "budget", acme, "a budget needs a limit"),
        (otto, token, "tenant-limit", {**acme, "max_concurrency": "0"}, "At once: '0' must be"),
        (otto, token, "tenant-limit", {**acme, "max_concurrency": "2.5"}, "neither a whole"),
        (olga, olgas, "tool-limit", {"tool": "nope", "rate": "1"}, "'nope' is not registered"),
        (olga, olgas, "tool-limit", {"tool": "lookup_order", "rate": "fast"}, "A second: 'fast'"),
        (olga, olgas, "budget", {"tenant": "*", "max_tokens": "5"}, "Name the tenant"),
    ]
    before = look(db_url, "SELECT count(*) FROM outbox.journal")
    for client, key, action, fields, words in bad:
        answer = act(client, action, key, **fields)
        assert answer.status_code == 400 and words in html.unescape(answer.text), (fields, words)
    assert look(db_url, "SELECT count(*) FROM outbox.journal") == before
    assert look(db_url, "SELECT tenant_id, max_tokens, max_cost FROM outbox.tenant_budgets") == [
        ("acme", 1000, Decimal("2.50"))
    ]
    assert look(
        db_url, "SELECT scope, name, max_concurrency, rate FROM outbox.lanes ORDER BY scope"
    ) == [("tenant", "acme", 4, None), ("tool", "lookup_order", 3, 1.5)]

    # A platform operator names a tenant the page does not list yet and sets its budget;
    # blank limits remove a tool's limits.
    assert 'data-tenant="initech"' in olga.get("/operations?tenant=initech").text
    assert act(olga, "budget", olgas, tenant="initech", max_tokens="50").status_code == 303
    assert act(olga, "tool-limit", olgas, tool="lookup_order").status_code == 303
    assert look(db_url, "SELECT count(*) FROM outbox.lanes WHERE scope = 'tool'") == [(0,)]
    assert [row[:3] for row in journal(db_url, "tenant.budget_set")] == [
        ("tenant.budget_set", "acme", "otto"),
        ("tenant.budget_set", "initech", "olga"),
    ]
    assert [row[:3] for row in journal(db_url, "lane.%")] == [
        ("lane.limited", "acme", "otto"),
        ("lane.limited", "*", "olga"),
        ("lane.unlimited", "*", "olga"),
    ]


def test_a_budget_set_on_the_command_line_is_journaled_with_its_actor(db_url, monkeypatch):
    from click.testing import CliRunner

    import cli

    monkeypatch.setenv("OUTBOX_DATABASE_URL", db_url)
    args = ["tenants", "budget", "acme", "--max-tokens", "500", "--actor", "carla"]
    done = CliRunner().invoke(cli.main, args)
    assert done.exit_code == 0, done.output
    assert [row[:3] for row in journal(db_url, "tenant.budget_set")] == [
        ("tenant.budget_set", "acme", "carla")
    ]


def test_a_selection_of_parked_calls_is_acted_on_once_each_beside_a_relay(
    db_url, console, monkeypatch
):
    """Two operators confirm a requeue and a release of the same 30 selected calls at once,
    in chunks of 4, while a relay claims and runs each call as it becomes ready: every
    selected call is moved once (one journal row, with its person) and runs once; the
    calls not selected, and another tenant's call selected by hand, stay parked."""
    monkeypatch.setattr(bulk, "CHUNK", 4)
    people(db_url, ("otto", "acme", "operator"), ("oona", "acme", "operator"))
    with FakeToolService() as service:
        with psycopg.connect(db_url) as conn:
            register_tool(conn, service, "noop", "key")
        refs = seed(db_url, ["noop"], 6, 10, lambda n: {"n": n})
        with psycopg.connect(db_url) as conn:
            for ref in refs:
                ops.quarantine(conn, f"call:{ref}", reason="incident", actor="ops")
        theirs = quarantined_call(db_url, tenant="globex")
        chosen, left = refs[::2], refs[1::2]
        otto, _ = sign_in(console, "otto")
        oona, _ = sign_in(console, "oona")
        page = otto.get("/parked").text
        assert f'name="call" value="{chosen[0]}" form="bulk-calls"' in page
        forms = {}
        for client, action in ((otto, "requeue"), (oona, "release")):
            fields = [
                ("csrf_token", csrf_of(client.get("/parked").text)),
                ("action", action),
                ("scope", "selection"),
                *[("call", str(ref)) for ref in [*chosen, theirs]],
            ]
            asked = post(client, "/parked/bulk", fields)
            assert "<strong>30</strong> quarantined calls" in asked.text  # not globex's
            forms[action] = (client, [*fields, ("confirm", "30")])

        answers: dict[str, str] = {}
        start = threading.Barrier(2)

        def confirm(action: str) -> None:
            client, fields = forms[action]
            start.wait(timeout=30)
            answers[action] = post(client, "/parked/bulk", fields).text

        with relay_thread(db_url):
            threads = [threading.Thread(target=confirm, args=(a,)) for a in forms]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=120)
            wait_until(
                lambda: (
                    look(
                        db_url,
                        "SELECT count(*) FROM outbox.tool_calls WHERE status = 'succeeded'",
                    )
                    == [(30,)]
                ),
                what="the 30 selected calls run",
            )
        assert len(service.tool("noop").effects) == 30 and service.duplicate_effects() == 0
    moved = look(
        db_url,
        "SELECT tool_call_ref, count(*), min(actor) FROM outbox.journal "
        "WHERE event IN ('operator.requeue', 'operator.release') GROUP BY 1 ORDER BY 1",
    )
    assert [(ref, n) for ref, n, _ in moved] == [(ref, 1) for ref in chosen]
    by = {actor for _, _, actor in moved}
    assert by <= {"otto", "oona"}
    counted = {
        action: sum(int(n) for n in re.findall(r"(?:Requeued|Released) (\d+) calls", text))
        for action, text in answers.items()
    }
    assert sum(counted.values()) == 30, answers  # a page that did not act asked again
    assert look(
        db_url,
        "SELECT id FROM outbox.tool_calls WHERE status = 'quarantined' ORDER BY id",
    ) == [(ref,) for ref in [*left, theirs]]


def test_parked_calls_by_filter_or_selection_release_and_reconcile_by_role(db_url, console):
    """Release everything a filter matches, reconcile a selection on the person's word
    (the answer recorded, JSON only), run a call of unknown outcome again: counted and
    done in the person's tenant only; a viewer, a reviewer and a form without its token
    are refused."""
    people(
        db_url,
        ("otto", "acme", "operator"),
        ("gus", "globex", "operator"),
        ("rita", "acme", "reviewer"),
        ("vic", "acme", "viewer"),
    )
    parked = [quarantined_call(db_url), quarantined_call(db_url)]
    happened, again = unknown_call(db_url), unknown_call(db_url)
    theirs = quarantined_call(db_url, tenant="globex")
    otto, _ = sign_in(console, "otto")
    token = csrf_of(otto.get("/parked").text)
    only = otto.get("/parked?status=outcome_unknown").text
    assert f'data-call="{happened}"' in only and f'data-call="{parked[0]}"' not in only
    assert otto.get("/parked?status=succeeded").status_code == 400

    for name in ("rita", "vic"):
        client, _ = sign_in(console, name)
        fields = [("csrf_token", csrf_of(client.get("/parked").text))]
        refused = post(
            client, "/parked/bulk", [*fields, ("action", "release"), ("scope", "filter")]
        )
        assert refused.status_code == 403
    no_token = post(otto, "/parked/bulk", [("action", "release"), ("scope", "filter")])
    assert no_token.status_code == 403
    gus, _ = sign_in(console, "gus")
    gus_fields = [("csrf_token", csrf_of(gus.get("/parked").text)), ("action", "release")]
    by_hand = [*gus_fields, ("scope", "selection"), ("call", str(parked[0])), ("confirm", "0")]
    assert "nothing to do" in post(gus, "/parked/bulk", by_hand).text
    mine = post(gus, "/parked/bulk", [*gus_fields, ("scope", "filter"), ("confirm", "1")])
    assert "Released 1 calls." in mine.text  # their own call only

    release = [("csrf_token", token), ("action", "release"), ("scope", "filter")]
    none = post(otto, "/parked/bulk", [*release, ("tool", "no_such_tool")])
    assert "No quarantined calls match this filter" in none.text
    asked = post(otto, "/parked/bulk", [*release, ("status", "quarantined")])
    assert "<strong>2</strong> quarantined calls" in asked.text
    done = post(otto, "/parked/bulk", [*release, ("status", "quarantined"), ("confirm", "2")])
    assert "Released 2 calls." in done.text

    settle = [("csrf_token", token), ("action", "happened"), ("scope", "selection")]
    picked = [("call", str(happened)), ("call", str(parked[0]))]  # a released one too
    not_json = post(otto, "/parked/bulk", [*settle, *picked, ("result", "refunded")])
    assert not_json.status_code == 400 and "as JSON" in html.unescape(not_json.text)
    answer = ("result", '{"refund_id": "r-7"}')
    asked = post(otto, "/parked/bulk", [*settle, *picked, answer])
    assert "<strong>1</strong> calls whose outcome is unknown" in asked.text
    done = post(otto, "/parked/bulk", [*settle, *picked, answer, ("confirm", "1")])
    assert "Recorded 1 calls as done." in done.text
    rerun = [("csrf_token", token), ("action", "not-happened"), ("scope", "filter")]
    done = post(otto, "/parked/bulk", [*rerun, ("confirm", "1")])
    assert "Queued 1 calls again." in done.text

    assert look(db_url, "SELECT id, status FROM outbox.tool_calls ORDER BY id") == [
        (parked[0], "pending"),
        (parked[1], "pending"),
        (happened, "succeeded"),
        (again, "pending"),
        (theirs, "pending"),
    ]
    assert look(db_url, "SELECT output, source FROM outbox.tool_results") == [
        ({"refund_id": "r-7"}, "operator")
    ]
    assert look(
        db_url,
        "SELECT event, tool_call_ref, tenant_id, actor FROM outbox.journal "
        "WHERE event LIKE 'operator.%%' AND actor <> 'ops' ORDER BY id",
    ) == [
        ("operator.release", theirs, "globex", "gus"),
        ("operator.release", parked[0], "acme", "otto"),
        ("operator.release", parked[1], "acme", "otto"),
        ("operator.reconcile", happened, "acme", "otto"),
        ("operator.reconcile", again, "acme", "otto"),
    ]


def test_tenants_are_paused_and_tools_switched_in_bulk(db_url, console):
    """A platform operator pauses and resumes the tenants selected; a tenant's operator
    switches the selected tools off for their tenant, never for every tenant nor another
    tenant; an unknown tool is refused by name; each change journaled with the person."""
    people(db_url, ("olga", "*", "operator"), ("otto", "acme", "operator"))
    with psycopg.connect(db_url) as conn:
        add_tool(conn, "lookup_order")
        add_tool(conn, "send_money")
        add_tool(conn, "search")
    olga, _ = sign_in(console, "olga")
    olgas = csrf_of(olga.get("/operations").text)
    olga.post("/operations/pause", data={"csrf_token": olgas, "tenant": "initech"})
    page = olga.get("/operations?tenant=globex").text
    assert 'name="tenant" value="globex" form="bulk-tenants"' in page
    tenants = [("tenant", "globex"), ("tenant", "initech")]
    pause = [("csrf_token", olgas), ("action", "pause"), ("reason", "incident"), *tenants]
    assert "<strong>1</strong> tenants" in post(olga, "/operations/bulk-tenants", pause).text
    done = post(olga, "/operations/bulk-tenants", [*pause, ("confirm", "1")])
    assert "Paused 1 tenants." in done.text
    resume = [("csrf_token", olgas), ("action", "resume"), *tenants, ("confirm", "2")]
    assert "Resumed 2 tenants." in post(olga, "/operations/bulk-tenants", resume).text

    otto, _ = sign_in(console, "otto")
    page = otto.get("/operations").text
    assert 'form="bulk-tenants"' not in page and 'form="bulk-tools"' in page
    token = csrf_of(page)
    theirs = [("csrf_token", token), ("action", "pause"), ("tenant", "globex")]
    assert post(otto, "/operations/bulk-tenants", theirs).status_code == 403
    tools = [("tool", "lookup_order"), ("tool", "send_money")]
    off = [("csrf_token", token), ("action", "disable"), ("reason", "misbehave"), *tools]
    everyone = post(otto, "/operations/bulk-tools", [*off, ("tenant", "*")])
    assert everyone.status_code == 403
    unknown = post(otto, "/operations/bulk-tools", [*off, ("tool", "no_such_tool")])
    assert unknown.status_code == 400 and "no_such_tool" in html.unescape(unknown.text)
    assert "<strong>2</strong> tools" in post(otto, "/operations/bulk-tools", off).text
    done = post(otto, "/operations/bulk-tools", [*off, ("confirm", "2")])
    assert "Switched 2 tools off." in done.text
    on = [("csrf_token", token), ("action", "enable"), ("tool", "send_money"), ("confirm", "1")]
    assert "Switched 1 tools on." in post(otto, "/operations/bulk-tools", on).text

    assert look(db_url, "SELECT tool_name, tenant_id, switched_by FROM outbox.tool_switches") == [
        ("lookup_order", "acme", "otto")
    ]
    assert look(db_url, "SELECT count(*) FROM outbox.tenant_pauses") == [(0,)]
    assert [row[:3] for row in journal(db_url, "tenant.%")] == [
        ("tenant.paused", "initech", "olga"),
        ("tenant.paused", "globex", "olga"),
        ("tenant.resumed", "globex", "olga"),
        ("tenant.resumed", "initech", "olga"),
    ]
    assert [row[:3] for row in journal(db_url, "tool.%")] == [
        ("tool.disabled", "acme", "otto"),
        ("tool.disabled", "acme", "otto"),
        ("tool.enabled", "acme", "otto"),
    ]
