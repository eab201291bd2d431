"""``python -m outbox.commands``: the ``outbox`` command, as the relay's children run it."""

from outbox.commands.main import main

main()
