"""One rule, one copy, kept by reading the source: no second copy of a status set or a
dedup-key format, and no path that stores tool results but ``record_tool_results_v1``;
and "the run is over", the drop of a leased row whose run is over, the tenant-scope guard,
the orphaning of a result and a lane's load, each written once as a SQL function the others
call.

The sets and formats live in ``outbox/constants.py`` and, for SQL, as the functions
``run_active_v1``, ``run_ended_v1``, ``deliver_key_v1``, ``tool_call_key_v1`` and
``model_turn_key_v1`` of ``sql/runs.sql``. Frozen migration SQL is history and
exempt. A copy is a literal collection of strings (Python) or an ``IN (...)`` list (SQL)
that holds a whole set: a subset (``('queued', 'in_progress')``, what ``stuck_runs`` waits
on) names another meaning and is allowed.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from outbox.constants import ACTIVE, ENDED
from outbox.sql import FUNCTION_FILES, parse
from tests.relay_harness import REPO

ROOMS = ("outbox", "relay", "server", "commands", "demo", "bench")
EXEMPT = {REPO / "outbox" / "constants.py"}  # the Python definitions
SETS = {"ACTIVE": set(ACTIVE), "ENDED": set(ENDED)}
KEY_PREFIXES = ("deliver:", "tool_call:", "model_turn:")


def sources(suffix: str) -> Iterator[Path]:
    yield from ([REPO / "cli.py"] if suffix == ".py" else [])
    for room in ROOMS:
        for path in sorted((REPO / room).rglob(f"*{suffix}")):
            if "migrations" not in path.parts and path not in EXEMPT:
                yield path


def python_copies(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            words = {e.value for e in node.elts if isinstance(e, ast.Constant)}
            for name, members in SETS.items():
                if members <= words:
                    yield f"{path.relative_to(REPO)}:{node.lineno}: a copy of {name}"
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value.startswith(KEY_PREFIXES)
        ):
            yield f"{path.relative_to(REPO)}:{node.lineno}: a dedup-key format"
        if isinstance(node, ast.JoinedStr) and node.values:
            first = node.values[0]
            if isinstance(first, ast.Constant) and str(first.value).startswith(KEY_PREFIXES):
                yield f"{path.relative_to(REPO)}:{node.lineno}: a dedup-key format"


SQL_IN = re.compile(r"\bIN\s*\(([^()]*)\)", re.IGNORECASE)
SQL_WORD = re.compile(r"'([a-z_]+)'")
SQL_KEY = re.compile(r"'(deliver|tool_call|model_turn):'")


def sql_copies(where: str, text: str) -> Iterator[str]:
    for match in SQL_IN.finditer(text):
        words = set(SQL_WORD.findall(match.group(1)))
        line = text.count("\n", 0, match.start()) + 1
        for name, members in SETS.items():
            if members <= words:
                yield f"{where}:{line}: a copy of {name}"
    for match in SQL_KEY.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        yield f"{where}:{line}: a dedup-key format"


def test_status_sets_and_dedup_keys_are_defined_once():
    copies = [c for path in sources(".py") for c in python_copies(path)]
    copies += [
        c
        for path in sources(".sql")
        for c in sql_copies(str(path.relative_to(REPO)), path.read_text())
    ]
    assert copies == [], "use outbox.constants or the SQL functions:\n" + "\n".join(copies)


def function_bodies() -> dict[str, str]:
    """``{"file: name": definition}`` of every function the files of ``sql/`` create (the
    SQL definitions, checked below)."""
    bodies = {}
    for file in FUNCTION_FILES:
        text = (REPO / "sql" / file).read_text()
        starts = list(re.finditer(r"CREATE OR REPLACE FUNCTION \{s\}\.(\w+)", text))
        ends = [m.start() for m in starts[1:]] + [len(text)]
        for m, end in zip(starts, ends, strict=True):
            bodies[f"{file}: {m.group(1)}"] = text[m.start() : end]
    return bodies


def test_the_sql_functions_hold_the_sets_and_formats_once():
    holders = {"runs.sql: run_active_v1", "runs.sql: run_ended_v1"} | {
        f"runs.sql: {kind}_key_v1" for kind in ("deliver", "tool_call", "model_turn")
    }
    copies = [
        copy
        for where, body in function_bodies().items()
        if where not in holders
        for copy in sql_copies(where, body)
    ]
    assert copies == [], "call run_active_v1 / run_ended_v1 / *_key_v1:\n" + "\n".join(copies)


def test_only_record_tool_results_v1_stores_tool_results():
    store = re.compile(r"INSERT\s+INTO\s+(\{s\}\.|outbox\.)?tool_results\b", re.IGNORECASE)
    found = [
        str(path.relative_to(REPO))
        for suffix in (".py", ".sql")
        for path in sources(suffix)
        if store.search(path.read_text())
    ]
    found += [where for where, body in function_bodies().items() if store.search(body)]
    assert found == ["results.sql: record_tool_results_v1"]


# Rules a review found written in two to four places, each now one SQL
# function that every statement calls.


def sql_blocks() -> Iterator[tuple[str, str]]:
    """``(where, text)`` of every function of ``sql/`` and every named query (or, for a
    file without names, the file) of the other SQL sources."""
    yield from function_bodies().items()
    for path in sources(".sql"):
        text = path.read_text()
        named = parse(text) or {"": text}
        for name, body in named.items():
            yield f"{path.relative_to(REPO)}: {name}".rstrip(": "), body


def holders(pattern: re.Pattern[str]) -> list[str]:
    return [where for where, text in sql_blocks() if pattern.search(text)]


def test_a_run_is_over_by_one_rule():
    """Ended, or in requires_action past its deadline: run_over_v1, which the claim,
    retry_later, quarantine, rescue_expired and submit_tool_outputs_v1 call."""
    ended = re.compile(r"run_ended_v1\(")
    late = re.compile(r"action_deadline\s*<\s*now\(\)", re.IGNORECASE)
    both = [w for w, text in sql_blocks() if ended.search(text) and late.search(text)]
    assert both == ["runs.sql: run_over_v1"]


def test_the_tenant_scope_guard_is_written_once():
    refusal = re.compile(r"scoped to tenant %|this transaction is scoped to, and it has none")
    assert holders(refusal) == ["tenancy.sql: require_tenant_scope_v1"]


def test_only_keep_orphaned_results_v1_orphans_results():
    store = re.compile(r"INSERT\s+INTO\s+(\{s\}\.|outbox\.)?orphaned_results\b", re.IGNORECASE)
    python = [str(p.relative_to(REPO)) for p in sources(".py") if store.search(p.read_text())]
    assert python + holders(store) == ["results.sql: keep_orphaned_results_v1"]


def test_a_lanes_load_is_counted_once():
    count = re.compile(r"status\s*=\s*'leased'\s+AND\s+\w+\.(tenant_id|tool_name)\s*=\s*\w+\.name")
    assert holders(count) == ["claims.sql: lane_loads_v1"]


def test_a_leased_row_of_a_run_that_is_over_is_dropped_by_one_function():
    """retry_later and quarantine put a row back or park it, and both drop it instead when
    its run is over through drop_if_run_over_v1; the claim (a row not leased yet, its call
    locked SKIP LOCKED) and rescue_expired (an expired lease, a previous owner) drop rows
    of their own kind."""
    drop = re.compile(r"'reason',\s*'run_over',\s*'instead_of'")
    assert holders(drop) == [
        "claims.sql: drop_if_run_over_v1",
        "relay/queries/relay.sql: claim",
    ]
