"""The Alembic migration history of the outbox schema, shipped inside the package.

``env.py`` and ``versions/`` are package data: ``outbox db upgrade`` finds them through
``importlib.resources`` (``outbox.revisions``), so a wheel installed without a checkout
migrates. Each migration carries the SQL it applies, frozen: inline, or in a ``.sql`` file
beside it (``versions/0002_views.sql``), never the living files of ``outbox/sql/``, so a
revision produces the same schema forever (``tests/migration/test_history.py`` checks it).
What each released migration applies is pinned by its hash in
``tests/migration/test_frozen.py``: a new migration adds its lines there, and a change to a
released one is a new migration, never an edit.
"""
