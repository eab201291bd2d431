"""The web console over real HTTP: sign-in and its lockout, sessions, CSRF, tenancy, the
security headers, the inbox and a run's timeline (docs/console.md).

``outbox serve``'s app on uvicorn (tests/serve_harness.py) against a real PostgreSQL; the
browser's view of the same rules is tests/acceptance/test_console_browser.py.
"""

from __future__ import annotations

import html
import re
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import httpx2
import psycopg
import pytest

from outbox import ops, writer
from outbox.schemas import StartRun
from outbox.server.console.auth import CSP
from outbox.statements import journal
from tests.console_harness import (
    PASSWORD,
    add_user,
    csrf_of,
    quarantined_call,
    sign_in,
    unknown_call,
    waiting_call,
)
from tests.helpers import add_tool, in_thread, look, turn
from tests.relay_harness import seed, wait_until
from tests.serve_harness import serve

OPEN = 50  # inboxes open at once


@pytest.fixture
def console(db_url: str) -> Iterator[str]:
    with serve(db_url) as base:
        yield base.removesuffix("/v1") + "/console"


def test_sign_in_refuses_a_wrong_password_and_locks_after_five_failures(db_url, console):
    add_user(db_url, "rita", "acme", "reviewer")
    for _ in range(4):
        assert sign_in(console, "rita", "wrong password!")[1] == 401
    assert sign_in(console, "nobody", "wrong password!")[1] == 401  # unknown: the same answer
    assert sign_in(console, "rita", "wrong password!")[1] == 429  # the fifth locks
    client, status = sign_in(console, "rita", PASSWORD)  # the right one, too late
    assert status == 429
    assert client.get("/approvals").status_code == 303  # no session: to the sign-in
    (locked,) = look(db_url, "SELECT locked_until > now() + interval '14 minutes' "
                     "FROM outbox.console_users WHERE name = 'rita'")  # fmt: skip
    assert locked == (True,)
    assert look(db_url, "SELECT count(*) FROM outbox.console_sessions") == [(0,)]


def test_a_session_opens_the_inbox_and_sign_out_ends_it(db_url, console):
    add_user(db_url, "rita", "acme", "reviewer")
    anonymous = httpx2.Client(base_url=console)
    assert anonymous.get("/approvals").status_code == 303  # to the sign-in
    client, status = sign_in(console, "rita")
    assert status == 303
    page = client.get("/approvals")
    assert page.status_code == 200 and "No call is waiting" in page.text
    (token_hash,) = look(db_url, "SELECT token_hash FROM outbox.console_sessions")[0]
    assert token_hash not in page.text and client.cookies["outbox_console"] != token_hash
    client.post("/sign-out", data={"csrf_token": csrf_of(page.text)})
    assert client.get("/approvals").status_code == 303
    assert look(db_url, "SELECT count(*) FROM outbox.console_sessions") == [(0,)]


def test_every_console_answer_carries_the_security_headers(db_url, console):
    add_user(db_url, "rita", "acme", "reviewer")
    client, _ = sign_in(console, "rita")
    for path in ("/sign-in", "/approvals", "/approvals/list", "/static/console.js", "/nothing"):
        answer = client.get(path)
        assert answer.headers["content-security-policy"] == CSP, path
        assert answer.headers["x-content-type-options"] == "nosniff", path
    cookie = client.cookies.jar._cookies  # type: ignore[attr-defined]
    (session,) = [c for d in cookie.values() for p in d.values() for c in p.values()
                  if c.name == "outbox_console"]  # fmt: skip
    assert session.path == "/console" and session.has_nonstandard_attr("HttpOnly")


def test_no_console_serves_none(db_url):
    with serve(db_url, console=False) as base:
        assert httpx2.get(base.removesuffix("/v1") + "/console/sign-in").status_code == 404


def test_a_reviewer_sees_and_decides_only_their_tenants_approvals(db_url, console):
    add_user(db_url, "rita", "acme", "reviewer")
    add_user(db_url, "gus", "globex", "reviewer")
    add_user(db_url, "vic", "acme", "viewer")
    run, approval = waiting_call(db_url, {"amount": 42, "to": "<b>bob</b>"})
    mine, _ = sign_in(console, "rita")
    theirs, _ = sign_in(console, "gus")
    viewer, _ = sign_in(console, "vic")

    inbox = mine.get("/approvals").text
    assert f'id="approval-{approval}"' in inbox and "&lt;b&gt;bob&lt;/b&gt;" in inbox
    other_inbox = theirs.get("/approvals").text
    assert "approval-" not in other_inbox and str(run.id) not in other_inbox
    assert theirs.get(f"/runs/{run.id}").status_code == 404
    assert theirs.get(f"/runs/{run.id}/timeline").status_code == 404
    assert theirs.get(f"/runs/{run.id}/events").status_code == 404
    assert httpx2.get(console + "/approvals/events").status_code == 401

    # Another tenant's reviewer, with a valid token of their own session: not found.
    refused = theirs.post(
        f"/approvals/{approval}/decide",
        data={"csrf_token": csrf_of(other_inbox), "decision": "approve"},
    )
    assert refused.status_code == 404
    # A viewer decides nothing; a form without its session's token is refused.
    seen = viewer.get("/approvals").text
    assert "Approve</button>" not in seen
    viewed = viewer.post(
        f"/approvals/{approval}/decide", data={"csrf_token": csrf_of(seen), "decision": "approve"}
    )
    assert viewed.status_code == 403
    tokenless = mine.post(f"/approvals/{approval}/decide", data={"decision": "approve"})
    assert tokenless.status_code == 403
    forged = mine.post(
        f"/approvals/{approval}/decide", data={"csrf_token": "x" * 43, "decision": "approve"}
    )
    assert forged.status_code == 403
    assert look(db_url, "SELECT status FROM outbox.approvals") == [("pending",)]

    decided = mine.post(
        f"/approvals/{approval}/decide",
        data={"csrf_token": csrf_of(inbox), "decision": "approve", "reason": "looks right"},
    )
    assert decided.status_code == 303
    assert look(db_url, "SELECT status, decided_by, reason FROM outbox.approvals") == [
        ("approved", "rita", "looks right")
    ]
    assert look(
        db_url, "SELECT tenant_id, actor FROM outbox.journal WHERE event = 'approval.approved'"
    ) == [("acme", "rita")]
    assert "No call is waiting" in mine.get("/approvals/list").text
    again = mine.post(
        f"/approvals/{approval}/decide",
        data={"csrf_token": csrf_of(inbox), "decision": "deny"},
    )
    assert again.status_code == 409 and "already decided" in again.text


def test_an_approval_shows_the_turns_that_led_to_it_as_text_with_secrets_cut(db_url, console):
    """The inbox shows the last messages of the call's thread, up to the model's turn that
    asked for it: markup as text, what looks like a secret cut, nothing of another run."""
    add_user(db_url, "rita", "acme", "reviewer")
    _other, _ = waiting_call(db_url, {"amount": 1})  # another run's messages are not shown
    with psycopg.connect(db_url) as conn:
        thread = writer.create_thread(conn, "acme").id
        run = writer.start_run(
            conn,
            StartRun(
                tenant_id="acme",
                thread_id=thread,
                model="scripted",
                message="Refund order 42 <script>alert(1)</script>, my password: hunter2hunter2",
                tools=["send_money"],
            ),
        )
        said = "Refunding it <img src=x onerror=alert(1)> with key sk-proj-abcdefghijklmnop1234"
        writer.record_model_turn(
            conn, turn(run, 1, ("call_1", "send_money", {"amount": 42}), text=said)
        )
        (approval,) = conn.execute(
            "SELECT id FROM outbox.approvals WHERE run_id = %s", [run.id]
        ).fetchone()
    client, _ = sign_in(console, "rita")
    page = client.get("/approvals").text
    card = page[page.index(f'id="approval-{approval}"') :]
    card = card[: card.index("</article>")]
    assert re.findall(r'data-role="(\w+)"', card) == ["user", "assistant"]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in card and "<script>alert" not in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in card and "<img" not in page
    assert "hunter2hunter2" not in page and "sk-proj-abcdefghijklmnop1234" not in page
    assert card.count("[secret cut]") == 2
    assert client.get("/approvals/list").text.count('class="turn"') == 4  # both runs' two


def test_a_digest_other_than_the_one_shown_decides_nothing(db_url, console):
    add_user(db_url, "rita", "acme", "reviewer")
    _run, approval = waiting_call(db_url, {"amount": 42})
    client, _ = sign_in(console, "rita")
    token = csrf_of(client.get("/approvals").text)
    refused = client.post(
        f"/approvals/{approval}/decide",
        data={"csrf_token": token, "decision": "approve", "digest": "sha256:" + "0" * 64},
    )
    assert refused.status_code == 409
    assert look(db_url, "SELECT status FROM outbox.approvals") == [("pending",)]


def test_a_platform_operator_sees_every_tenant(db_url, console):
    add_user(db_url, "olga", "*", "operator")
    waiting_call(db_url, {"amount": 1}, tenant="acme")
    run, approval = waiting_call(db_url, {"amount": 2}, tenant="globex")
    client, _ = sign_in(console, "olga")
    inbox = client.get("/approvals").text
    assert inbox.count('class="approval"') == 2
    timeline = client.get(f"/runs/{run.id}")
    assert timeline.status_code == 200 and "approval.requested" in timeline.text
    decided = client.post(
        f"/approvals/{approval}/decide", data={"csrf_token": csrf_of(inbox), "decision": "deny"}
    )
    assert decided.status_code == 303
    assert look(
        db_url, "SELECT tenant_id, actor FROM outbox.journal WHERE event = 'approval.denied'"
    ) == [("globex", "olga")]


def test_a_runs_timeline_lists_its_journal_in_order(db_url, console):
    add_user(db_url, "rita", "acme", "reviewer")
    run, _approval = waiting_call(db_url, {"note": "<script>alert(1)</script>"})
    client, _ = sign_in(console, "rita")
    page = client.get(f"/runs/{run.id}")
    assert page.status_code == 200
    events = [e for (e,) in look(
        db_url, "SELECT event FROM outbox.journal WHERE run_id = %s ORDER BY id", [run.id]
    )]  # fmt: skip
    positions = [page.text.index(f'data-event="{e}"') for e in events]
    assert positions == sorted(positions) and "approval.requested" in events
    assert "<script>alert" not in page.text
    assert client.get(f"/runs/{run.id}/timeline").text.count('class="event"') == len(events)
    assert client.get("/runs/not-a-uuid").status_code == 404


def test_users_add_from_the_command_line(db_url, monkeypatch):
    from click.testing import CliRunner

    import cli

    monkeypatch.setenv("OUTBOX_DATABASE_URL", db_url)
    runner = CliRunner()
    done = runner.invoke(
        cli.main,
        ["console", "users", "add", "rita", "--tenant", "acme", "--role", "reviewer",
         "--password-stdin"],
        input=PASSWORD + "\n",
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    short = runner.invoke(
        cli.main,
        ["console", "users", "add", "sam", "--tenant", "acme", "--role", "reviewer",
         "--password-stdin"],
        input="short\n",
    )  # fmt: skip
    assert short.exit_code != 0 and "12 characters" in short.output
    star = runner.invoke(
        cli.main,
        ["console", "users", "add", "sam", "--tenant", "*", "--role", "reviewer",
         "--password-stdin"],
        input=PASSWORD + "\n",
    )  # fmt: skip
    assert star.exit_code != 0 and "only an operator" in star.output
    with psycopg.connect(db_url) as conn:
        (stored,) = conn.execute("SELECT password_hash FROM outbox.console_users").fetchone()
    assert stored.startswith("$argon2id$") and PASSWORD not in stored


def test_fifty_open_inboxes_share_the_one_listening_connection(db_url, console):
    """Each open inbox is woken by the server's one LISTEN connection when an approval of
    its tenant is requested: no connection and no query more per inbox while it waits."""
    add_user(db_url, "rita", "acme", "reviewer")
    client, _ = sign_in(console, "rita")
    cookies = dict(client.cookies)
    ready, told = threading.Barrier(OPEN + 1), threading.Semaphore(0)
    stop = threading.Event()

    def inbox() -> None:
        with (
            httpx2.Client(base_url=console, cookies=cookies, timeout=60) as own,
            own.stream("GET", "/approvals/events") as stream,
        ):
            lines = stream.iter_lines()
            while next(lines) != "event: ready":
                pass
            ready.wait()
            while next(lines) != "event: changed":
                pass
            told.release()
            stop.wait()

    threads = [threading.Thread(target=inbox, daemon=True) for _ in range(OPEN)]
    for thread in threads:
        thread.start()
    ready.wait(timeout=60)
    listening = look(
        db_url,
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND query LIKE 'LISTEN outbox\\_%%'",
    )
    waiting_call(db_url, {"amount": 1})
    try:
        for _ in range(OPEN):
            assert told.acquire(timeout=60), "an open inbox was not told of the new approval"
    finally:
        stop.set()
    assert listening == [(1,)]


def test_the_runs_list_filters_and_pages_by_keyset(db_url, console, monkeypatch):
    from outbox.server.console import routes

    monkeypatch.setattr(routes, "RUNS_PAGE", 3)
    add_user(db_url, "rita", "acme", "reviewer")
    made = [waiting_call(db_url, {"n": n})[0].id for n in range(7)]
    theirs = waiting_call(db_url, {"n": 99}, tenant="globex")[0].id
    client, _ = sign_in(console, "rita")
    seen: list[str] = []
    path = "/runs?status=in_progress"
    while path:
        page = client.get(path)
        assert page.status_code == 200
        seen += re.findall(r'data-run="([^"]+)"', page.text)
        older = re.search(r'href="/console(/runs\?[^"]+)" rel="next"', page.text)
        path = html.unescape(older.group(1)) if older else ""
    assert seen == [str(r) for r in reversed(made)]  # newest first, each once
    assert str(theirs) not in seen
    assert "No run matches" in client.get("/runs?status=completed").text
    assert client.get("/runs?status=nonsense").status_code == 400
    assert client.get("/runs?before=yesterday").status_code == 400


def test_the_runs_list_filters_on_tool_and_metadata_and_counts_what_matches(
    db_url, console, monkeypatch
):
    """Runs that called a tool, runs whose thread's metadata holds key=value pairs, of the
    person's tenant only; the count is exact while the planner expects few runs, its
    estimate (marked so) above."""
    from outbox.server.console import routes

    add_user(db_url, "rita", "acme", "reviewer")
    sent = [waiting_call(db_url, {"n": n})[0] for n in range(3)]
    wired = [waiting_call(db_url, {"n": n}, tool="wire_money")[0] for n in range(2)]
    waiting_call(db_url, {"n": 9}, tool="wire_money", tenant="globex")
    with psycopg.connect(db_url) as conn:
        for run in (sent[0], wired[1]):
            conn.execute(
                'UPDATE outbox.threads SET metadata = \'{"customer": "c-7", "tier": "gold"}\' '
                "WHERE id = %s",
                [run.thread_id],
            )
    client, _ = sign_in(console, "rita")

    def listed(query: str) -> tuple[set[str], str, str]:
        page = client.get(f"/runs?{query}")
        assert page.status_code == 200, page.text
        found = re.search(r'data-matched="(\d+)" data-exact="(\w+)"', page.text)
        assert found, page.text
        return set(re.findall(r'data-run="([^"]+)"', page.text)), found[1], found[2]

    assert listed("tool=wire_money") == ({str(r.id) for r in wired}, "2", "yes")
    assert listed("metadata=customer%3Dc-7") == ({str(sent[0].id), str(wired[1].id)}, "2", "yes")
    both = "tool=wire_money&metadata=customer%3Dc-7,tier%3Dgold"
    assert listed(both) == ({str(wired[1].id)}, "1", "yes")
    assert listed("metadata=customer%3Dc-8")[1:] == ("0", "yes")
    assert listed("")[1:] == ("5", "yes")
    assert client.get("/runs?metadata=customer").status_code == 400
    # A count cut short by its time limit leaves the page whole, with the estimate.
    slow = "SET LOCAL statement_timeout = '1ms'; SELECT pg_sleep(0.05)"
    monkeypatch.setattr(routes, "COUNT_TIMEOUT", slow)
    runs, matched, exact = listed("tool=wire_money")
    assert len(runs) == 2 and exact == "no" and int(matched) >= 1
    monkeypatch.setattr(routes, "EXACT_COUNT", 0)
    runs, matched, exact = listed("")
    assert len(runs) == 5 and exact == "no" and int(matched) >= 1  # the planner's guess


def test_an_operator_releases_a_parked_call_of_their_tenant_only(db_url, console):
    add_user(db_url, "otto", "acme", "operator")
    add_user(db_url, "rita", "acme", "reviewer")
    add_user(db_url, "gina", "globex", "operator")
    ref = quarantined_call(db_url)
    operator, _ = sign_in(console, "otto")
    reviewer, _ = sign_in(console, "rita")
    other, _ = sign_in(console, "gina")

    listed = operator.get("/parked").text
    assert f'data-call="{ref}"' in listed and "Release</button>" in listed
    seen = reviewer.get("/parked").text
    assert f'data-call="{ref}"' in seen and "Release</button>" not in seen
    theirs = other.get("/parked").text
    assert f'data-call="{ref}"' not in theirs

    def post(client, action: str, page: str) -> int:
        data = {"csrf_token": csrf_of(page)}
        return client.post(f"/parked/{ref}/{action}", data=data).status_code

    assert post(reviewer, "release", seen) == 403  # a reviewer acts on no call
    assert post(other, "release", theirs) == 404  # another tenant's call is not seen
    assert operator.post(f"/parked/{ref}/release", data={}).status_code == 403  # no token
    assert look(db_url, "SELECT status FROM outbox.tool_calls") == [("quarantined",)]
    assert post(operator, "release", listed) == 303
    assert look(db_url, "SELECT status FROM outbox.tool_calls") == [("pending",)]
    assert look(
        db_url, "SELECT tenant_id, actor FROM outbox.journal WHERE event = 'operator.release'"
    ) == [("acme", "otto")]
    assert post(operator, "release", listed) == 409  # not quarantined any more
    assert "No call is parked" in operator.get("/parked").text


def test_a_bulk_requeue_of_a_thousand_parked_calls_acts_on_each_once(db_url, console):
    add_user(db_url, "otto", "acme", "operator")
    with psycopg.connect(db_url) as conn:
        add_tool(conn, "lookup_order")
    refs = seed(db_url, ["lookup_order"], 20, 50, lambda n: {"order_id": str(n)})
    with psycopg.connect(db_url) as conn:
        for ref in refs:
            ops.quarantine(conn, f"call:{ref}", reason="incident", actor="ops")
    theirs = quarantined_call(db_url, tenant="globex")
    operator, _ = sign_in(console, "otto")
    token = csrf_of(operator.get("/parked").text)

    every = {"csrf_token": token, "action": "requeue", "scope": "filter"}
    asked = operator.post("/parked/bulk", data=every)
    assert asked.status_code == 200 and "<strong>1000</strong> quarantined calls" in asked.text
    assert look(db_url, "SELECT count(*) FROM outbox.tool_calls WHERE status = 'pending'") == [(0,)]
    stale = operator.post("/parked/bulk", data={**every, "confirm": "999"})
    assert "<strong>1000</strong>" in stale.text  # a count that is not today's asks again
    done = operator.post("/parked/bulk", data={**every, "confirm": "1000"})
    assert done.status_code == 200 and "Requeued 1000 calls." in done.text
    assert look(
        db_url,
        "SELECT count(*), count(DISTINCT tool_call_ref) FROM outbox.journal "
        "WHERE event = 'operator.requeue' AND actor = 'otto' AND tenant_id = 'acme'",
    ) == [(1000, 1000)]
    assert look(
        db_url, "SELECT tenant_id, status, count(*) FROM outbox.tool_calls GROUP BY 1, 2 ORDER BY 1"
    ) == [("acme", "pending", 1000), ("globex", "quarantined", 1)]
    assert look(db_url, "SELECT status FROM outbox.tool_calls WHERE id = %s", [theirs]) == [
        ("quarantined",)
    ]


def test_an_expired_session_opens_nothing(db_url, console):
    add_user(db_url, "rita", "acme", "reviewer")
    client, _ = sign_in(console, "rita")
    assert client.get("/approvals").status_code == 200
    with psycopg.connect(db_url) as conn:
        conn.execute("UPDATE outbox.console_sessions SET expires_at = now()")
    assert client.get("/approvals").status_code == 303  # to the sign-in
    assert client.get("/approvals/list").status_code == 401


class Statements:
    """Every statement this process sends to PostgreSQL (the server under test runs in it),
    counted by what it reads: ``journal`` those that name the journal."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.journal = 0
        self.sessions = 0

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        execute = psycopg.Cursor.execute

        def counted(cursor: psycopg.Cursor, query: Any, *args: Any, **kwargs: Any) -> Any:
            text = query.as_string(cursor) if hasattr(query, "as_string") else str(query)
            with self.lock:
                self.journal += ".journal" in text
                self.sessions += "console_session_v1" in text
            return execute(cursor, query, *args, **kwargs)

        monkeypatch.setattr(psycopg.Cursor, "execute", counted)


def events_of(stream: httpx2.Response) -> Iterator[str]:
    """The names of the events of an open SSE answer, as they come."""
    for line in stream.iter_lines():
        if line.startswith("event: "):
            yield line.removeprefix("event: ")


def test_a_timeline_follows_its_run_on_notifications_and_reads_no_journal_while_idle(
    db_url, console, monkeypatch
):
    """An open timeline is told of each journal event of its run by the server's listener
    (``NOTIFY outbox_journal``): while the run is quiet its stream checks the session and
    reads nothing of the journal; an event written then reaches it at once."""
    from outbox.server.console import routes

    add_user(db_url, "rita", "acme", "reviewer")
    run, _approval = waiting_call(db_url, {"amount": 1})
    client, _ = sign_in(console, "rita")
    monkeypatch.setattr(routes, "SESSION_CHECK_S", 0.2)
    counter = Statements()
    with client.stream("GET", f"/runs/{run.id}/events") as stream:
        names = events_of(stream)
        assert next(names) == "ready"
        counter.install(monkeypatch)
        wait_until(lambda: counter.sessions >= 5, timeout_s=30, what="five session checks")
        assert counter.journal == 0  # a quiet run: no read of its journal
        with psycopg.connect(db_url) as conn:  # an event that changes no status
            journal(conn, "test.noted", "acme", run_id=run.id, actor="test")
        # A session check's wait ends with nothing to tell: only a notification says this.
        reader, told = in_thread(lambda: next(names))
        reader.join(timeout=30)
        assert told.get("result") == "changed", "the journal event did not wake the timeline"
    assert counter.journal == 1  # the test's own insert: the stream read none


def test_an_ended_session_ends_its_open_streams(db_url, console, monkeypatch):
    """A stream checks its session: once it expired (or was signed out), the inbox's and
    the timeline's streams say ``signed_out`` and end."""
    from outbox.server.console import routes

    add_user(db_url, "rita", "acme", "reviewer")
    run, _approval = waiting_call(db_url, {"amount": 1})
    client, _ = sign_in(console, "rita")
    monkeypatch.setattr(routes, "SESSION_CHECK_S", 0.2)
    with (
        client.stream("GET", f"/runs/{run.id}/events") as timeline,
        client.stream("GET", "/approvals/events") as inbox,
    ):
        opened = [events_of(timeline), events_of(inbox)]
        assert [next(names) for names in opened] == ["ready", "ready"]
        with psycopg.connect(db_url) as conn:
            conn.execute("UPDATE outbox.console_sessions SET expires_at = now()")
        for names in opened:
            assert list(names) == ["signed_out"]  # and the answer ends


def test_operations_show_stuck_runs_and_switch_tools_and_pause_tenants_by_role(db_url, console):
    """Stuck runs and the queue of the person's tenant only; a tool's kill switch and a
    tenant's pause through ``outbox.policy``, journaled with the person; a tenant's operator
    acts on their tenant only, a viewer on nothing, a form without its token is refused."""
    for name, tenant, role in [
        ("olga", "*", "operator"),
        ("otto", "acme", "operator"),
        ("gus", "globex", "operator"),
        ("vic", "acme", "viewer"),
    ]:
        add_user(db_url, name, tenant, role)
    ref = quarantined_call(db_url, tenant="acme")  # its run is stuck on a parked call
    (run_id,) = look(db_url, "SELECT run_id FROM outbox.tool_calls WHERE id = %s", [ref])[0]
    otto, _ = sign_in(console, "otto")
    page = otto.get("/operations").text
    assert f'data-run="{run_id}" data-reason="parked_call"' in page
    assert 'data-tool="lookup_order"' in page and 'data-tenant="acme"' in page
    gus, _ = sign_in(console, "gus")
    assert str(run_id) not in gus.get("/operations").text
    token = csrf_of(page)

    def act(client: httpx2.Client, action: str, token: str, **fields: str) -> int:
        return client.post(
            f"/operations/{action}", data={"csrf_token": token, **fields}
        ).status_code

    assert act(otto, "disable", token, tool="lookup_order", tenant="globex") == 403
    assert act(otto, "disable", token, tool="lookup_order", tenant="*") == 403
    assert act(otto, "disable", "x" * 43, tool="lookup_order", tenant="acme") == 403
    vic, _ = sign_in(console, "vic")
    seen = vic.get("/operations").text
    assert "Disable</button>" not in seen and "Pause</button>" not in seen
    assert act(vic, "pause", csrf_of(seen), tenant="acme") == 403
    assert look(db_url, "SELECT count(*) FROM outbox.tool_switches") == [(0,)]
    assert look(db_url, "SELECT count(*) FROM outbox.tenant_pauses") == [(0,)]

    assert (
        act(otto, "disable", token, tool="lookup_order", tenant="acme", reason="misbehaves") == 303
    )
    assert act(otto, "pause", token, tenant="acme", reason="incident") == 303
    assert look(db_url, "SELECT tenant_id, switched_by, reason FROM outbox.tool_switches") == [
        ("acme", "otto", "misbehaves")
    ]
    assert look(db_url, "SELECT tenant_id, paused_by FROM outbox.tenant_pauses") == [
        ("acme", "otto")
    ]
    page = otto.get("/operations").text
    assert 'data-scope="acme"' in page and 'data-tenant="acme" data-paused="yes"' in page
    assert act(otto, "disable", token, tool="no_such_tool", tenant="acme") == 400
    olga, _ = sign_in(console, "olga")
    everything = olga.get("/operations").text
    assert act(olga, "disable", csrf_of(everything), tool="lookup_order", tenant="*") == 303
    assert act(otto, "enable", token, tool="lookup_order", tenant="*") == 403  # not theirs
    assert act(otto, "enable", token, tool="lookup_order", tenant="acme") == 303
    assert act(otto, "resume", token, tenant="acme") == 303
    assert look(db_url, "SELECT tenant_id FROM outbox.tool_switches") == [("*",)]
    assert look(db_url, "SELECT count(*) FROM outbox.tenant_pauses") == [(0,)]
    assert look(
        db_url,
        "SELECT event, tenant_id, actor FROM outbox.journal WHERE event LIKE 'tool.%%' "
        "OR event LIKE 'tenant.%%' ORDER BY id",
    ) == [
        ("tool.disabled", "acme", "otto"),
        ("tenant.paused", "acme", "otto"),
        ("tool.disabled", "*", "olga"),
        ("tool.enabled", "acme", "otto"),
        ("tenant.resumed", "acme", "otto"),
    ]


def test_an_operator_reconciles_an_unknown_outcome_from_the_page(db_url, console):
    """``ops.reconcile`` on the operator's word, as ``outbox reconcile``: the output given
    is recorded (JSON, refused otherwise), journaled with the person; another tenant's
    operator cannot reach the call."""
    add_user(db_url, "otto", "acme", "operator")
    add_user(db_url, "gus", "globex", "operator")
    happened, again = unknown_call(db_url), unknown_call(db_url)
    otto, _ = sign_in(console, "otto")
    page = otto.get("/parked").text
    assert f'action="/console/parked/{happened}/reconcile"' in page
    token = csrf_of(page)
    gus, _ = sign_in(console, "gus")
    theirs = csrf_of(gus.get("/parked").text)

    def reconcile(client: httpx2.Client, token: str, ref: int, **fields: str) -> int:
        answer = client.post(f"/parked/{ref}/reconcile", data={"csrf_token": token, **fields})
        return answer.status_code

    assert reconcile(gus, theirs, happened, happened="no") == 404
    assert reconcile(otto, token, happened, happened="yes", result="refunded") == 400
    assert reconcile(otto, token, happened, happened="maybe") == 400
    assert reconcile(otto, token, happened, happened="yes", result='{"refund_id": "r-7"}') == 303
    assert reconcile(otto, token, again, happened="no") == 303
    assert look(db_url, "SELECT output, source FROM outbox.tool_results") == [
        ({"refund_id": "r-7"}, "operator")
    ]
    assert look(db_url, "SELECT id, status FROM outbox.tool_calls ORDER BY id") == [
        (happened, "succeeded"),
        (again, "pending"),
    ]
    assert look(
        db_url,
        "SELECT tool_call_ref, actor FROM outbox.journal WHERE event = 'operator.reconcile' "
        "ORDER BY id",
    ) == [(happened, "otto"), (again, "otto")]
    assert reconcile(otto, token, happened, happened="no") == 409  # settled already


def test_a_read_only_console_changes_nothing(db_url):
    """``outbox serve --console-read-only``: every person reads, nobody decides or acts,
    also by posting a form by hand."""
    add_user(db_url, "olga", "*", "operator")
    _run, approval = waiting_call(db_url, {"amount": 1})
    ref = quarantined_call(db_url)
    with serve(db_url, console_read_only=True) as base:
        olga, _ = sign_in(base.removesuffix("/v1") + "/console", "olga")
        inbox = olga.get("/approvals").text
        assert f'id="approval-{approval}"' in inbox and "read-only console" in inbox
        assert "Approve</button>" not in inbox
        assert "Release</button>" not in olga.get("/parked").text
        assert "Pause</button>" not in olga.get("/operations").text
        token = csrf_of(inbox)
        posts = [
            (f"/approvals/{approval}/decide", {"decision": "approve"}),
            (f"/parked/{ref}/release", {}),
            ("/parked/bulk", {"action": "requeue", "scope": "filter"}),
            ("/operations/budget", {"tenant": "acme", "max_tokens": "5"}),
            ("/operations/bulk-tenants", {"action": "pause", "tenant": "acme"}),
            ("/operations/pause", {"tenant": "acme"}),
        ]
        for path, fields in posts:
            answer = olga.post(path, data={"csrf_token": token, **fields})
            assert answer.status_code == 403 and "read-only" in answer.text, path
    assert look(db_url, "SELECT status FROM outbox.approvals") == [("pending",)]
    assert look(db_url, "SELECT status FROM outbox.tool_calls WHERE id = %s", [ref]) == [
        ("quarantined",)
    ]
    assert look(db_url, "SELECT count(*) FROM outbox.tenant_pauses") == [(0,)]
    assert look(db_url, "SELECT count(*) FROM outbox.tenant_budgets") == [(0,)]


def test_users_unlock_lets_a_locked_account_sign_in_again(db_url, console, monkeypatch):
    from click.testing import CliRunner

    import cli

    add_user(db_url, "rita", "acme", "reviewer")
    for _ in range(5):
        sign_in(console, "rita", "wrong password!")
    assert sign_in(console, "rita")[1] == 429
    monkeypatch.setenv("OUTBOX_DATABASE_URL", db_url)
    runner = CliRunner()
    done = runner.invoke(cli.main, ["console", "users", "unlock", "rita", "--actor", "olga"])
    assert done.exit_code == 0 and "was locked until" in done.output, done.output
    assert sign_in(console, "rita")[1] == 303
    missing = runner.invoke(cli.main, ["console", "users", "unlock", "nobody"])
    assert missing.exit_code != 0 and "does not exist" in missing.output
    assert look(
        db_url, "SELECT tenant_id, actor FROM outbox.journal WHERE event = 'console.user_unlocked'"
    ) == [("acme", "olga")]


def test_a_bulk_cancel_of_a_filter_or_a_selection_confirms_its_count_and_cancels_each_once(
    db_url, console, monkeypatch
):
    """Everything a filter matches, or the runs selected, of the person's tenant only:
    first the count to confirm, then, once the count confirmed is the server's, each active
    run cancelled once through ``lifecycle.cancel_run`` with the person, in chunks."""
    from outbox.server.console import bulk

    monkeypatch.setattr(bulk, "CHUNK", 3)
    add_user(db_url, "otto", "acme", "operator")
    add_user(db_url, "vic", "acme", "viewer")
    wired = [waiting_call(db_url, {"n": n}, tool="wire_money")[0].id for n in range(7)]
    sent = [waiting_call(db_url, {"n": n})[0].id for n in range(2)]
    theirs = waiting_call(db_url, {"n": 9}, tool="wire_money", tenant="globex")[0].id
    otto, _ = sign_in(console, "otto")
    page = otto.get("/runs?tool=wire_money").text
    assert 'name="run" value=' in page and "Cancel every active run" in page
    token = csrf_of(page)
    by_filter = {"csrf_token": token, "scope": "filter", "tool": "wire_money"}
    asked = otto.post("/runs/bulk-cancel", data=by_filter)
    assert asked.status_code == 200 and "Cancel 7 runs</button>" in asked.text
    stale = otto.post("/runs/bulk-cancel", data={**by_filter, "confirm": "6"})
    assert "Cancel 7 runs</button>" in stale.text  # a count that is not the server's: asked again
    assert look(db_url, "SELECT count(*) FROM outbox.runs WHERE status = 'cancelled'") == [(0,)]
    done = otto.post("/runs/bulk-cancel", data={**by_filter, "confirm": "7"})
    assert "Cancelled 7 runs." in done.text

    selection = [("run", str(r)) for r in [*sent, wired[0], theirs]]
    picked = [("csrf_token", token), ("scope", "selection"), *selection]
    form = {"content-type": "application/x-www-form-urlencoded"}
    asked = otto.post("/runs/bulk-cancel", content=urlencode(picked), headers=form)
    assert "Cancel 2 runs</button>" in asked.text  # one ended, one not theirs
    confirmed = urlencode([*picked, ("confirm", "2")])
    done = otto.post("/runs/bulk-cancel", content=confirmed, headers=form)
    assert "Cancelled 2 runs." in done.text
    vic, _ = sign_in(console, "vic")
    refused = vic.post(
        "/runs/bulk-cancel", data={**by_filter, "csrf_token": csrf_of(vic.get("/runs").text)}
    )
    assert refused.status_code == 403

    assert sorted(
        look(db_url, "SELECT id, cancelled_by FROM outbox.runs WHERE status = 'cancelled'")
    ) == sorted((r, "otto") for r in [*wired, *sent])
    assert look(db_url, "SELECT status FROM outbox.runs WHERE id = %s", [theirs]) != [
        ("cancelled",)
    ]
    assert look(
        db_url,
        "SELECT count(*), count(DISTINCT run_id) FROM outbox.journal WHERE event = 'run.cancelled'",
    ) == [(9, 9)]
