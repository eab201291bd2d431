"""The head revision read from the revision files (what a relay and ``outbox serve`` check
as they start, without importing Alembic) is Alembic's, and the files' links are Alembic's
history; a history with a second head is left to Alembic, which refuses it. No database."""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import pytest

from outbox import revisions


def test_the_head_read_from_the_files_is_alembics() -> None:
    assert revisions.head_revision() == revisions.alembic_head() == revisions.revisions()[-1]


def test_the_links_read_from_the_files_are_alembics_history() -> None:
    declared = revisions.declared_revisions()
    ordered = revisions.revisions()
    assert sorted(declared) == sorted(ordered)
    for older, newer in itertools.pairwise(ordered):
        assert declared[newer] == (older,)
    assert declared[ordered[0]] == ()


def test_a_second_head_is_left_to_alembic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    history = tmp_path / "alembic"
    shutil.copytree(revisions.history_folder(), history)
    (history / "versions" / "9999_branch.py").write_text(
        'revision = "9999"\ndown_revision = "0001"\n'
        "def upgrade() -> None: ...\ndef downgrade() -> None: ...\n"
    )
    monkeypatch.setattr(revisions, "history_folder", lambda: history)
    assert "9999" in revisions.declared_revisions()
    with pytest.raises(Exception, match="head"):
        revisions.head_revision()
