"""The web console of ``outbox serve`` at ``/console``: an approvals inbox and run timelines
for reviewers and operators, behind a sign-in that is on by default.

Server-rendered HTML (Jinja2 templates, autoescaped: everything a model or tool wrote is
text, never markup) with one small script that only makes pages live; every page works
without it. Every answer carries a Content-Security-Policy that allows no inline script
and no other origin. The console reads and acts through the library (``outbox.approvals``,
``outbox.accounts``) on the server's own pool, under the signed-in person's tenant, and
wakes on the server's one ``LISTEN`` connection (``server.wakeups``): open consoles add no
connection and no polling query while it is connected. docs/console.md.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"
