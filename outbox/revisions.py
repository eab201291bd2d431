"""The migration history this code ships, read without a database: its revisions and head.

The history is the checkout's ``alembic/`` folder, which the wheel installs as
``outbox/migrations`` (``history_folder``), so an installed wheel knows it without a
checkout. Reading it needs no connection, so it sits below ``outbox.db``: the check that a
database's schema is the one this code needs (``db.check_schema_current``) and the
migrations that bring it there (``outbox.migrate``) both read it here, and
neither has to import the other to know the head.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic.config import Config
from alembic.script import ScriptDirectory


def history_folder() -> Path:
    """The migration history: ``outbox/migrations`` in an installed wheel, else the
    checkout's ``alembic/`` beside ``outbox/``.

    Found by path because it is not an importable package: ``alembic/`` has no
    ``__init__.py``, which would shadow the alembic library for code run from the checkout.
    """
    package = Path(__file__).parent
    installed = package / "migrations"
    return installed if installed.is_dir() else package.parent / "alembic"


@contextmanager
def alembic_config(url: str = "", schema: str = "outbox") -> Iterator[Config]:
    """An Alembic configuration of our history, migrating ``schema`` at ``url`` (neither is
    read by what only walks the history)."""
    config = Config()
    config.set_main_option("script_location", str(history_folder()))
    config.attributes["url"] = url
    config.attributes["schema"] = schema
    yield config


def revisions() -> list[str]:
    """Every revision id, oldest first."""
    with alembic_config() as config:
        script = ScriptDirectory.from_config(config)
        return [s.revision for s in reversed(list(script.walk_revisions()))]


def head_revision() -> str:
    with alembic_config() as config:
        head = ScriptDirectory.from_config(config).get_current_head()
    assert head is not None
    return head
