"""Where the embedded server keeps its data."""

from __future__ import annotations

from pathlib import Path

import pytest

from outbox import db


def test_an_empty_outbox_home_is_the_default_not_the_current_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`OUTBOX_HOME= outbox db start` once put a whole data folder in a checkout."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OUTBOX_HOME", "")
    assert db.home() == tmp_path / ".outbox"
    monkeypatch.setenv("OUTBOX_HOME", str(tmp_path / "elsewhere"))
    assert db.home() == tmp_path / "elsewhere"
