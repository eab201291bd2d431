"""What looks like a secret, cut from the text a page shows of a run's messages.

The messages a model and its tools exchanged are stored as written; a tool's own credential
never is (the relay adds it to the request and cuts it from the answer before it is
stored, docs/actions.md). What a person or a model typed can still hold one: a pasted key,
a password in a sentence. The console cuts the shapes a secret commonly has before it shows
a message: bearer tokens, JSON Web Tokens, the keys of well-known services and of this
one, a password in a URL, and the value after a word such as ``password`` or ``api_key``.
This is a net for the common shapes, not a proof: a secret of no known shape stays.
"""

from __future__ import annotations

import re

CUT = "[secret cut]"

# Each pattern's group 1, when it has one, is kept (the name before a value).
PATTERNS = [
    re.compile(r"(?i)(\bbearer\s+)[A-Za-z0-9._~+/=-]{8,}"),
    re.compile(r"\beyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}"),  # a JWT
    re.compile(r"\b(?:sk|rk|pk)[-_](?:live_|test_|proj-|ant-)?[A-Za-z0-9_-]{16,}"),
    re.compile(r"\b(?:ob-|whsec_|xox[abpr]-)[A-Za-z0-9_+/=-]{16,}"),  # this one's, Slack's
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}"),  # GitHub's
    re.compile(r"\bAKIA[0-9A-Z]{16}\b"),  # AWS's access key ids
    re.compile(r"(://[^/\s:@]+:)[^@\s/]+(?=@)"),  # the password of a URL
    re.compile(
        r"(?i)(\b(?:password|passwd|pwd|secret|client_secret|token|access_token|api[_-]?key)"
        r"[\"']?\s*[:=]\s*[\"']?)[^\s\"',;}]{4,}"
    ),
]


def cut_secrets(text: str) -> str:
    """``text`` with every match of ``PATTERNS`` replaced by ``CUT`` (a name before it
    kept)."""
    for pattern in PATTERNS:
        text = pattern.sub(lambda m: (m.group(1) if m.groups() else "") + CUT, text)
    return text
