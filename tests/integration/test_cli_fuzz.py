"""Every command, fed malformed ids, JSON and URLs, refuses with an ``error:`` line and exit
status 2 and changes nothing in the database.

The database holds a thread, a tool, a run waiting for a client call and a quarantined
call, so a command that acted on what it was given would show in the fingerprint of every
table. The values are malformed by construction (generated outside the shapes the command
takes), never judged by the code under test.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cli
from outbox import registry, writer
from tests.helpers import TENANT, add_tool, look, new_run, turn

EXAMPLES = 25  # per command
TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    max_size=40,
).filter(lambda t: not t.startswith("-"))  # an option, not a malformed value


def not_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return True
    return False


MALFORMED_UUID = TEXT.filter(not_uuid)
MALFORMED_RUN = TEXT.filter(lambda t: not re.fullmatch(r"[0-9a-f-]{1,36}", t.strip().lower()))
MALFORMED_CALL = TEXT.filter(
    lambda t: not re.fullmatch(r"(?:call:|tc:|outbox:|ob:)?\d+", t.strip())
)
MALFORMED_TENANT = TEXT.filter(lambda t: not re.fullmatch(r"[A-Za-z0-9_.:@-]{1,128}", t))
MALFORMED_NAME = TEXT.filter(lambda t: not re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", t))
# Malformed by construction: no scheme at all, a scheme other than http(s), no host, or
# a host with a space; never a judgement call such as an unusual host name.
MALFORMED_URL = st.one_of(
    TEXT.filter(lambda t: "://" not in t),
    st.sampled_from(["ftp://example.com/", "file:///", "mailto:", "ws://example.com/"]).flatmap(
        lambda scheme: TEXT.map(lambda t: scheme + t)
    ),
    st.sampled_from(["http:///", "https:///", "http:// ", "http://a b/"]).flatmap(
        lambda start: TEXT.map(lambda t: start + t)
    ),
    st.sampled_from(["https://:80/x", "http://host:port/x", "http//missing-colon.com"]),
)


def not_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return True
    return False


MALFORMED_JSON = TEXT.filter(not_json)
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=10)
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
NOT_A_LIST = JSON_VALUES.filter(lambda v: not isinstance(v, list))
# Conversations that are not OpenAI chat messages: a list holding a non-object, an object
# whose role is not one of the four, a tool message answering no call id, or an assistant
# message whose tool_calls is not a list of calls with an id and a function name.
BAD_CALL = st.one_of(
    SCALARS,
    st.dictionaries(st.sampled_from(["id", "type"]), SCALARS, max_size=2),
    st.fixed_dictionaries({"id": st.just("c1"), "function": st.one_of(SCALARS, st.just({}))}),
)
BAD_MESSAGE = st.one_of(
    SCALARS,
    st.lists(SCALARS, max_size=2),
    st.dictionaries(st.sampled_from(["role", "content"]), SCALARS, max_size=2).filter(
        lambda m: m.get("role") not in ("system", "user", "assistant", "tool")
    ),
    st.fixed_dictionaries({"role": st.just("tool"), "tool_call_id": st.sampled_from([None, ""])}),
    st.fixed_dictionaries(
        {
            "role": st.just("assistant"),
            "tool_calls": st.one_of(
                SCALARS.filter(lambda v: v not in (None, False, 0, "", 0.0)),
                st.lists(BAD_CALL, min_size=1, max_size=2),
            ),
        }
    ),
)
BAD_CONVERSATION = st.lists(BAD_MESSAGE, min_size=1, max_size=3)
# Outputs that cannot be this run's: a list of non-objects, objects without a string
# tool_call_id, or ids that are no call of the run (its one call is c1).
BAD_OUTPUT = st.one_of(
    SCALARS,
    st.fixed_dictionaries({"tool_call_id": st.one_of(st.none(), st.integers())}),
    st.fixed_dictionaries(
        {"tool_call_id": st.text(max_size=12).filter(lambda t: t != "c1"), "output": SCALARS}
    ),
)
BAD_OUTPUTS = st.one_of(st.just([]), st.lists(BAD_OUTPUT, min_size=1, max_size=3))


def as_json(value: Any) -> str:
    return json.dumps(value)


@pytest.fixture
def world(db_url: str) -> dict[str, Any]:
    """What the malformed input must not touch: a thread, tools, a waiting run, a parked call."""
    with psycopg.connect(db_url) as conn:
        add_tool(conn)
        registry.register(conn, registry.ToolSpec(name="approve", executor="client"))
        waiting = new_run(conn, tools=["approve", "lookup_order"])
        writer.record_model_turn(
            conn,
            turn(waiting, 1, ("c1", "approve", {}), ("c2", "lookup_order", {"order_id": "1"})),
        )
        conn.execute("UPDATE outbox.outbox SET status = 'quarantined' WHERE kind = 'tool_call'")
        conn.commit()
    return {"run": str(waiting.id), "thread": str(waiting.thread_id)}


def fingerprint(db_url: str) -> dict[str, str]:
    """Every table of the schema, row by row, as one hash each (read on the test's kept
    connection: it is taken after every example)."""
    tables = look(db_url, "SELECT tablename FROM pg_tables WHERE schemaname = 'outbox' ORDER BY 1")
    return {
        t: look(
            db_url,
            f"SELECT md5(coalesce(string_agg(x::text, '|' ORDER BY x::text), '')) "
            f'FROM outbox."{t}" x',
        )[0][0]
        for (t,) in tables
    }


Command = Callable[[dict[str, Any], Any, Path], list[str]]


def file_with(tmp: Path, text: str) -> str:
    path = tmp / f"input-{uuid.uuid4().hex}.json"
    path.write_text(text)
    return str(path)


CREATE = ["runs", "create", "--message", "hi", "--model", "m"]
COMMANDS: dict[str, tuple[Any, Command]] = {
    # malformed ids
    "runs show": (MALFORMED_RUN, lambda w, v, _: ["runs", "show", v]),
    "runs show --json": (MALFORMED_RUN, lambda w, v, _: ["runs", "show", v, "--json"]),
    "runs cancel": (MALFORMED_RUN, lambda w, v, _: ["runs", "cancel", v]),
    "runs submit-outputs RUN": (
        MALFORMED_RUN,
        lambda w, v, tmp: ["runs", "submit-outputs", v, file_with(tmp, '[{"tool_call_id": "c1"}]')],
    ),
    "journal tail --run": (MALFORMED_RUN, lambda w, v, _: ["journal", "tail", "--run", v]),
    "requeue": (MALFORMED_CALL, lambda w, v, _: ["requeue", v]),
    "quarantine": (MALFORMED_CALL, lambda w, v, _: ["quarantine", v, "--reason", "fuzz"]),
    "release": (MALFORMED_CALL, lambda w, v, _: ["release", v]),
    "reconcile": (MALFORMED_CALL, lambda w, v, _: ["reconcile", v, "--not-happened"]),
    "threads show": (MALFORMED_UUID, lambda w, v, _: ["threads", "show", v, "--tenant", TENANT]),
    "threads show --tenant": (
        MALFORMED_TENANT,
        lambda w, v, _: ["threads", "show", w["thread"], "--tenant", v],
    ),
    "runs create --thread": (
        MALFORMED_UUID,
        lambda w, v, _: [*CREATE, "--tenant", TENANT, "--thread", v],
    ),
    "runs create --tenant": (
        MALFORMED_TENANT,
        lambda w, v, _: [*CREATE, "--tenant", v, "--thread", w["thread"]],
    ),
    "threads create --tenant": (
        MALFORMED_TENANT,
        lambda w, v, _: ["threads", "create", "--tenant", v],
    ),
    "tenants budget": (
        MALFORMED_TENANT,
        lambda w, v, _: ["tenants", "budget", v, "--max-tokens", "9"],
    ),
    "tools register NAME": (
        MALFORMED_NAME,
        lambda w, v, _: ["tools", "register", v, "--endpoint", "http://127.0.0.1:9/t"],
    ),
    # malformed JSON (text that does not parse, or JSON of the wrong shape)
    "tools register --schema": (
        st.one_of(MALFORMED_JSON, st.sampled_from(['{"type": 12}', '{"required": "x"}'])),
        lambda w, v, _: [
            "tools",
            "register",
            "t",
            "--endpoint",
            "http://127.0.0.1:9/t",
            "--schema",
            v,
        ],
    ),
    "reconcile --result": (
        MALFORMED_JSON,
        lambda w, v, _: ["reconcile", "1", "--happened", "--result", v],
    ),
    "runs submit-outputs FILE": (
        st.one_of(MALFORMED_JSON, NOT_A_LIST.map(as_json), BAD_OUTPUTS.map(as_json)),
        lambda w, v, tmp: ["runs", "submit-outputs", w["run"], file_with(tmp, v)],
    ),
    "threads import": (
        st.one_of(MALFORMED_JSON, NOT_A_LIST.map(as_json), BAD_CONVERSATION.map(as_json)),
        lambda w, v, tmp: ["threads", "import", file_with(tmp, v), "--tenant", TENANT],
    ),
    # malformed URLs
    "tools register --endpoint": (
        MALFORMED_URL,
        lambda w, v, _: ["tools", "register", "t", "--endpoint", v],
    ),
    "tools register --lookup-endpoint": (
        MALFORMED_URL,
        lambda w, v, _: [
            "tools",
            "register",
            "t",
            "--endpoint",
            "http://127.0.0.1:9/t",
            "--idempotency",
            "lookup",
            "--lookup-endpoint",
            v,
        ],
    ),
    "runs create --base-url": (
        MALFORMED_URL,
        lambda w, v, _: [*CREATE, "--tenant", TENANT, "--thread", w["thread"], "--base-url", v],
    ),
}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_malformed_input_is_refused_and_changes_nothing(name, db_url, world, tmp_path, monkeypatch):
    monkeypatch.setenv("OUTBOX_DATABASE_URL", db_url)
    runner = CliRunner()
    strategy, command = COMMANDS[name]
    before = fingerprint(db_url)

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much],
    )
    @given(value=strategy)
    def refused(value: Any) -> None:
        args = command(world, value, tmp_path)
        result = runner.invoke(cli.main, args)
        assert isinstance(result.exception, SystemExit | None), (args, result.exception)
        assert result.exit_code == 2, (args, result.output)
        lines = result.stderr.splitlines()
        assert lines and lines[0].startswith("error: "), (args, result.output)
        assert fingerprint(db_url) == before, args

    refused()
