"""Released migrations never change: what each one applies is pinned here by its hash.

``test_history`` proves each revision gives one schema going up and coming down, but an
edit of a released migration in place (its frozen SQL, or SQL written in its module) passes
it: up and down both read the edited text, while every database already past that revision
keeps the old schema. So the text each migration applies is pinned: the ``.sql`` files
beside the migrations, and the string constants of the modules (docstrings and comments
excluded: they may be corrected). A new migration adds its lines here when it is written;
a fix to a released one is a new migration. And a migration reads no living file: it
imports nothing of this project but the helpers of ``outbox.migrate``.
"""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path

from tests.relay_harness import REPO

VERSIONS = REPO / "alembic" / "versions"

# file: the first 16 hex digits of sha256 of what it applies (applied_text)
PINNED = {
    "0001_initial.py": "e01a6be58989139c",
    "0002_roles_rls_views.py": "775c09486d4697a7",
    "0002_views.sql": "711d5fd7a5335c62",
    "0003_client_outputs.py": "5750fcf0dffc8b72",
    "0003_functions.sql": "09b3c47436cd2709",
    "0004_tenant_budgets.py": "3377976d0b3598d1",
    "0005_hot_path.py": "e492ab80e974b210",
    "0006_lease_holder_check.py": "b17993165a9542dc",
    "0007_tenant_bound_references.py": "9f0c0ece96ac9481",
    "0008_run_timeline_in_tenant.py": "5b697fd351607c57",
    "0009_outputs_deadline_at_submission.py": "83d54a75f6d9c228",
    "0009_outputs_deadline_at_submission.sql": "7d8674ae9364e907",
    "0010_sql_api.py": "05cfeea2dd4410af",
    "0010_sql_api.sql": "9f22b87981b84779",
    "0012_charged_attempts.py": "863dcef5749bdc92",
    "0013_claim_limits_and_fairness.py": "728c4e6d9ae0fbbf",
    "0013_claim_limits_and_fairness.sql": "9b9393db6e254db2",
    "0014_parked_runs_and_journal_guard.py": "b4cf93d2d87c0c13",
    "0014_parked_runs_and_journal_guard.sql": "3c152d74dc9c3a52",
    "0015_outputs_need_a_tenant_scope.py": "665cc17094089d44",
    "0015_outputs_need_a_tenant_scope.sql": "836698f4161f67ab",
    "0016_action_layer.py": "cf05977f4cbde0d2",
    "0016_action_layer.sql": "06a74e20ab8d3d3e",
    "0017_run_pins_and_money_budgets.py": "735c146d4084f330",
    "0017_run_pins_and_money_budgets.sql": "3a8885a0e0004cf2",
    "0018_tenant_login_roles.py": "aafdce24015a6b4b",
    "0018_tenant_login_roles.sql": "5384023b2dd1a979",
    "0019_credentials.py": "0298ea14cc763318",
    "0019_credentials.sql": "b782c929519a9aae",
    "0020_api_keys.py": "dd35e5fb00d1da66",
    "0020_api_keys.sql": "c8e0c1166acb1f2a",
    "0021_record_tool_results.py": "5eb418262b5db660",
    "0021_record_tool_results.sql": "ae50a361e56a0ab7",
    "0022_serve_gaps.py": "211e1b47c6f3cc18",
    "0022_serve_gaps.sql": "59b1f73ffb6b372b",
    "0023_run_notify.py": "0b6987515ecaf59f",
    "0023_run_notify.sql": "2284c6f6663fe391",
    "0024_webhooks.py": "274607e22aeee4b7",
    "0024_webhooks.sql": "c883172c87a1b628",
    "0025_responses.py": "835c83d8dd88d3fc",
    "0025_responses.sql": "040b4a804eb023d9",
    "0026_deletes.py": "699fe415ddc798ad",
    "0026_deletes.sql": "89469ecd7d4369c4",
    "0027_record_model_turn.py": "f9a8a412bfa5d929",
    "0027_record_model_turn.sql": "a55e2d3b4ef8d18e",
    "0028_record_model_turns.py": "3f55869ecaf1dd79",
    "0028_record_model_turns.sql": "8d62bb44defba410",
    "0029_settle_before_repeat.py": "3a897c4bfd7661f7",
    "0029_settle_before_repeat.sql": "67f20d3011b75c3b",
    "0030_run_defaults_and_one_rule_each.py": "e4b1c1e9710055ee",
    "0030_run_defaults_and_one_rule_each.sql": "26ebec2834d21449",
    "0031_model_options.py": "a03f862abf4d7b51",
    "0031_model_options.sql": "df8e1c348023e05e",
    "0032_mcp_servers.py": "dd0974bf0c81aaac",
    "0032_mcp_servers.sql": "a8495a7e96a3b6fb",
    "0033_run_trace_context.py": "2945a0b2ab29e156",
    "0033_run_trace_context.sql": "53ac0de5ef2061f0",
    "0034_retention.py": "4c6c6235f9b4fa98",
    "0034_retention.sql": "a41afceac2db008b",
    "0035_model_reasoning.py": "6d00e48370e5e108",
    "0035_model_reasoning.sql": "6f6756073a1a0d00",
    "0036_journal_partitions.py": "42a7eb3c067b8e15",
    "0036_journal_partitions.sql": "f55d90c50378ff76",
    "0037_cancelled_run_spans.py": "df2a73ae4be7d373",
    "0037_cancelled_run_spans.sql": "3e808f3b6d6d2bff",
    "0038_call_deadlines.py": "57ebe57927db9302",
    "0038_call_deadlines.sql": "8d0924e10536dd8a",
    "0040_payloads.py": "62723547c7509699",
    "0040_payloads.sql": "f2d3163b044b2a5d",
    "0040_payloads_down.sql": "43e4730b082734e3",
    "0041_relay_least_privilege.py": "020c76fe494e52bd",
    "0041_relay_least_privilege.sql": "24e78257d692edb8",
    "0042_spans_from_the_database.py": "28824ed26ba51a08",
    "0042_spans_from_the_database.sql": "1b1bd5a25d750505",
    "0043_tenant_asked_once.py": "0de0d075472f029b",
    "0043_tenant_asked_once.sql": "8d3b369479568a3c",
    "0044_tenant_lookup_as_owner.py": "3102de143f68d3da",
    "0044_tenant_lookup_as_owner.sql": "2afb284b9e572543",
    "0045_journal_ddl_in_turn.py": "fca9a7805bb1a93e",
    "0045_journal_ddl_in_turn.sql": "bb9887d480a5325a",
    "0045_journal_ddl_in_turn_down.sql": "c2b38ee6e46119f7",
    "0046_turns_find_runs_by_id.py": "13bfbf6fdd018b55",
    "0046_turns_find_runs_by_id.sql": "e86d9f120c7a462a",
    "0046_turns_find_runs_by_id_down.sql": "56a64d248a091635",
    "0047_key_checks_find_runs_by_id.py": "6c0fde9e31d10de0",
    "0047_key_checks_find_runs_by_id.sql": "db89b3f7d2acd8dd",
    "0047_key_checks_find_runs_by_id_down.sql": "cbeccbd3f80e107d",
    "0048_declared_in_flight.py": "c13c17529ebe2f04",
    "0048_declared_in_flight.sql": "dc833359b3a0bfc3",
    "0048_declared_in_flight_down.sql": "e97dd542ea16d064",
    "0049_model_options_reach_the_model.py": "0da75395a5cff0d0",
    "0049_model_options_reach_the_model.sql": "fecc5b4afe714d5f",
    "0050_run_over_drop_once.py": "aedada317ae25a61",
    "0050_run_over_drop_once.sql": "7bfce531148fa742",
    "0051_function_comments.py": "073024b67c8820fb",
    "0051_function_comments.sql": "fa746c274f057687",
    "0051_function_comments_down.sql": "d2bdfac3622743b1",
    "0052_model_fallback.py": "8e975e291a7fd2bf",
    "0052_model_fallback.sql": "7f89d606798fbed0",
    "0052_model_fallback_down.sql": "9dee253e37e51f11",
    "0053_context_compaction.py": "2e938a87f7586b94",
    "0053_context_compaction.sql": "e8365d4467ebda2e",
    "0053_context_compaction_down.sql": "6698606ab87db2ac",
    "0054_console_accounts.py": "96a1eafa62a0f43d",
    "0054_console_accounts.sql": "37a10d93b73236f1",
    "0054_console_accounts_down.sql": "f2413759f89de1cb",
    "0055_result_caps_and_cache_keys.py": "acd0dfd79ebbfa11",
    "0055_result_caps_and_cache_keys.sql": "015d9a6267ff3099",
    "0055_result_caps_and_cache_keys_down.sql": "01594121cb40c721",
    "0056_journal_notify.py": "bbc0836d2c50c3aa",
    "0056_journal_notify.sql": "f5d084786ca5e777",
    "0056_journal_notify_down.sql": "92329652aafdc052",
    "0057_tenant_keys.py": "a4a405997b656e64",
    "0057_tenant_keys.sql": "f5fd913d74d13e8f",
    "0057_tenant_keys_down.sql": "ee174ef8705dce4a",
    "0058_results_read_batches_once.py": "e1c43b4ad103819a",
    "0058_results_read_batches_once.sql": "efa7e460c3ac7ce6",
    "0058_results_read_batches_once_down.sql": "b7181158a010a7bc",
    "0059_console_oidc.py": "6f1934e0ce581dfb",
    "0059_console_oidc.sql": "0402de096d4e6eef",
    "0059_console_oidc_down.sql": "a05c55efc0581ea0",
    "0060_results_one_reference.py": "7e3638933cd707ae",
    "0060_results_one_reference.sql": "49fc10b0dc853b80",
    "0060_results_one_reference_down.sql": "566cdb36f6c55dd0",
}


def applied_text(path: Path) -> str:
    """The SQL file, or the string constants of a migration module but its docstrings."""
    text = path.read_text()
    if path.suffix == ".sql":
        return text
    tree = ast.parse(text, str(path))
    docstrings = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }
    return "\n".join(
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        if id(node) not in docstrings
    )


def digest(path: Path) -> str:
    return hashlib.sha256(applied_text(path).encode()).hexdigest()[:16]


def test_released_migrations_apply_what_they_applied_when_written():
    files = sorted(p for p in VERSIONS.iterdir() if p.name[:4].isdigit())
    changed = [p.name for p in files if p.name in PINNED and digest(p) != PINNED[p.name]]
    assert changed == [], (
        f"released migrations edited in place: {changed}; revert them and write a new "
        "migration (alembic/versions) that makes the change"
    )
    gone = sorted(set(PINNED) - {p.name for p in files})
    assert gone == [], f"released migrations removed: {gone}"
    new = [f'    "{p.name}": "{digest(p)}",' for p in files if p.name not in PINNED]
    assert new == [], "pin the new migration's files in PINNED:\n" + "\n".join(new)


def test_migrations_read_no_living_file():
    """A migration that imported outbox.sql, outbox.orm or a query file would apply
    whatever that file says today."""
    readers = []
    for path in sorted(VERSIONS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            readers += [
                f"{path.name}: {name}"
                for name in names
                if name.split(".")[0] in {"outbox", "relay", "server", "demo"}
                and name != "outbox.migrate"
            ]
    assert readers == []
