"""The demo: the duplicate-ticket incident replayed through the outbox and a naive loop.

``outbox demo`` (``make demo``) runs ``demo.run``; ``demo.incident`` is the scenario and
its audited services, ``demo.naive`` the coordinator that shows the incident. It lives
apart from the library (``outbox/``) and the relay (``relay/``), which never import it
(import-linter contract), and it is not in the wheel: it runs from a checkout. It uses the
library only as a backend would, plus the supported test doubles of ``outbox.testing``.
"""
