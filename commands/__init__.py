"""The ``outbox`` command's groups, one module each; ``cli.py`` assembles them.

``commands.common`` holds what they share (the connection, ``--json`` and ``--actor``,
tables and JSON output, and the ``error:``/``hint:`` refusals with exit status 2). A command
module imports the library at the top when every command of its group needs it, and inside
the command when only that command does and it is slow to import (the server, the relay's
workers, the demo): ``outbox --help`` stays quick.
"""
