"""The ``outbox`` command from a checkout: ``python -m cli ...``.

The command itself is ``outbox.commands.main``, where the groups are assembled; the console
script and the relay children of ``outbox serve --with-relay`` name that module
(``python -m outbox.commands relay``), so an installed wheel needs no top-level ``cli``.
"""

from outbox.commands.main import main

if __name__ == "__main__":
    main()
