"""The migration history this code ships, read without a database: its revisions and head.

The history is the checkout's ``alembic/`` folder, which the wheel installs as
``outbox/migrations`` (``history_folder``), so an installed wheel knows it without a
checkout. Reading it needs no connection, so it sits below ``outbox.db``: the check that a
database's schema is the one this code needs (``db.check_schema_current``) and the
migrations that bring it there (``outbox.migrate``) both read it here, and
neither has to import the other to know the head.

The head is read from the revision files' own ``revision``/``down_revision`` assignments,
without Alembic: importing Alembic (and SQLAlchemy under it) costs a process about 0.35 s of
CPU, and every relay and ``outbox serve`` checks the head as it starts. A history that does
not have exactly one head is left to Alembic, which says what is wrong with it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from alembic.config import Config


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
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(history_folder()))
    config.attributes["url"] = url
    config.attributes["schema"] = schema
    yield config


def revisions() -> list[str]:
    """Every revision id, oldest first."""
    from alembic.script import ScriptDirectory

    with alembic_config() as config:
        script = ScriptDirectory.from_config(config)
        return [s.revision for s in reversed(list(script.walk_revisions()))]


def head_revision() -> str:
    """The newest revision: the one no other revision names as its ``down_revision``."""
    declared = declared_revisions()
    below = {down for downs in declared.values() for down in downs}
    heads = set(declared) - below
    if len(heads) == 1:
        return heads.pop()
    return alembic_head()


def alembic_head() -> str:
    """The head as Alembic finds it (raises Alembic's error for a history of several)."""
    from alembic.script import ScriptDirectory

    with alembic_config() as config:
        head = ScriptDirectory.from_config(config).get_current_head()
    assert head is not None
    return head


def declared_revisions() -> dict[str, tuple[str, ...]]:
    """Each revision file's ``revision`` and the revisions it follows (``down_revision``,
    one, several for a merge, or none), read from its module-level assignments."""
    declared: dict[str, tuple[str, ...]] = {}
    for path in sorted((history_folder() / "versions").glob("*.py")):
        values: dict[str, object] = {}
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                target, value = node.target, node.value
            else:
                continue
            if isinstance(target, ast.Name) and target.id in ("revision", "down_revision"):
                values[target.id] = ast.literal_eval(value)
        revision, down = values.get("revision"), values.get("down_revision")
        if not isinstance(revision, str):
            continue
        if isinstance(down, str):
            declared[revision] = (down,)
        elif isinstance(down, tuple | list):
            declared[revision] = tuple(str(d) for d in down)
        else:
            declared[revision] = ()
    return declared
