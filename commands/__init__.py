"""The ``outbox`` command's groups, one module each; ``main`` assembles them.

``common`` holds what they share (the connection, ``--json`` and ``--actor``,
tables and JSON output, and the ``error:``/``hint:`` refusals with exit status 2). An
``outbox`` invocation imports ``main``, ``common`` and the module of the command it runs
(``main.COMMANDS``), and what is slow to import and serves few of a group's commands
(Alembic through ``outbox.migrate``, uvicorn and the server, the relay's workers, the demo)
is imported inside those commands.
"""
