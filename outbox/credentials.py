"""The credential broker: the secrets tool calls carry, per tenant, never the model's.

A tool names the credential it needs (``tools register --credential-ref NAME``). Each
tenant (``'*'``: every tenant's default) keeps, in ``outbox.credentials``, how the relay
finds that secret at call time, never the secret itself:

* ``env``: an environment variable of the relay;
* ``file``: a line ``NAME=value`` of a file the relay reads (a mounted secret, a .env);
* ``db``: the value encrypted (Fernet: AES-128-CBC and HMAC-SHA256) with a key only the
  relay and the operator who sets it hold (``$OUTBOX_CREDENTIALS_KEY``); the database keeps
  the ciphertext.

At call time the relay resolves the credential of the call's tenant (else ``'*'``), mints
the header it names (``Authorization: Bearer …`` by default) into that tool's request only,
hands an in-process tool only its own credential, and cuts the value out of whatever the
tool answers before anything stores, logs or replays it, plain and as tools re-encode it
(``forms``: base64 at each byte alignment, base64url, URL- and JSON-escaped), always
through ``redact`` or ``redact_value``, the one rule for it. Setting a credential again
rotates it (its version goes up; calls from then on carry the new value); a revoked one
makes the calls that need it end with an error result the model sees, never with the old
value. Changes are journaled with the actor, never the value.

A ``credential_ref`` no tenant has a row for resolves as it always did: ``$OUTBOX_SECRET_<REF>``
or a line ``REF=value`` of ``$OUTBOX_SECRETS_FILE``.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import re
import urllib.parse
from dataclasses import dataclass
from typing import Any

import psycopg
from cryptography.fernet import Fernet, InvalidToken

from outbox import calls
from outbox.errors import InvalidInput, NotFound
from outbox.sql import queries
from outbox.statements import fetch_all, fetch_one, journal

Q = queries("credentials.sql")
Row = dict[str, Any]
KEY_ENV = "OUTBOX_CREDENTIALS_KEY"
ALL_TENANTS = "*"
NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
REDACTED = "[redacted credential]"
MIN_BASE64_CHARS = 8  # a base64 form of a secret shorter than this is not cut: see ``forms``


class CredentialUnavailable(LookupError):
    """The secret cannot be had now (a variable, a file or the key is missing): the call
    waits and is tried again, uncharged."""


class CredentialRevoked(LookupError):
    """The credential was revoked: calls that need it end with an error result."""


@dataclass(frozen=True)
class Secret:
    """A resolved credential: the header to send and the value to cut from answers."""

    name: str
    value: str
    header: str = "Authorization"
    scheme: str = "Bearer"

    def headers(self) -> dict[str, str]:
        return {self.header: f"{self.scheme} {self.value}" if self.scheme else self.value}


# -- redacting: the one rule for what a tool's answer may not carry ------------------------


@functools.lru_cache(maxsize=256)
def forms(secret: str) -> tuple[str, ...]:
    """The texts of ``secret`` to cut from whatever a tool answers, longest first.

    The secret as it was sent, and as tools re-encode it (as GitHub Actions' runner masks
    secrets):

    * base64 and base64url, at each of the three byte alignments: a secret inside a longer
      encoded value (``Basic base64(user:secret)``) starts at byte 0, 1 or 2 of a 3-byte
      group, and each start encodes it to other characters. For each, the secret is
      encoded behind that many filler bytes and only the characters computed from its
      bytes alone are kept: the character where it meets a neighbour also carries the
      neighbour's bits, so it cannot be known and is left. The whole encoding (padded and
      not) is cut too, so that a secret encoded on its own leaves nothing;
    * URL-encoded (``quote`` with and without ``/`` kept, ``quote_plus``), with upper- and
      lower-case hex digits;
    * JSON-escaped (ASCII-only and not, with ``/`` escaped or not), once and twice: JSON
      text inside a JSON string, such as an error body that quotes an upstream's answer.

    The plain secret and its escaped spellings are cut at any length. A base64 form
    shorter than ``MIN_BASE64_CHARS`` is not: a few base64 characters turn up by chance in
    any encoded text, and cutting them would redact unrelated content. Every base64 form of
    a secret of 7 bytes or more is long enough; of a shorter one, some are not cut.
    Cached: a tenant's secret is resolved for each of its calls."""
    if not secret:
        return ()
    encoded = [f for f in _base64_forms(secret.encode()) if len(f) >= MIN_BASE64_CHARS]
    found = {secret, *_url_forms(secret), *_json_forms(secret), *encoded}
    return tuple(sorted(found, key=lambda f: (-len(f), f)))


def _base64_forms(raw: bytes) -> list[str]:
    whole = base64.b64encode(raw).decode()
    encoded = [whole, whole.rstrip("=")]
    for shift in range(3):
        shifted = base64.b64encode(bytes(shift) + raw).decode()
        # Character i holds bits 6i to 6i+5: the secret's own run starts at the first
        # character past the filler's 8*shift bits and ends with its last full character.
        first = -(-8 * shift // 6)
        end = 8 * (shift + len(raw)) // 6
        encoded.append(shifted[first:end])
    urlsafe = str.maketrans("+/", "-_")
    return encoded + [e.translate(urlsafe) for e in encoded]


def _url_forms(secret: str) -> list[str]:
    quoted = [
        urllib.parse.quote(secret, safe=""),
        urllib.parse.quote(secret),
        urllib.parse.quote_plus(secret),
    ]
    return quoted + [re.sub(r"%[0-9A-F]{2}", lambda m: m[0].lower(), q) for q in quoted]


def _json_forms(secret: str) -> list[str]:
    once = {json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1]}
    once |= {f.replace("/", "\\/") for f in once}
    twice = {json.dumps(f)[1:-1] for f in once}
    return [*once, *twice]


def redact(text: str, secret: str) -> str:
    """``text`` with every form of ``secret`` (``forms``) replaced by ``REDACTED``.

    Cut from the whole text before anything shortens it: a text cut inside a form keeps
    a start of it that no later redaction recognises."""
    return _cut(text, forms(secret))


def redact_value(value: Any, secret: str) -> Any:
    """``value`` (a tool's answer: JSON-like, or tuples an in-process tool returns) with
    every form of ``secret`` cut from its strings, keys included; tuples become lists, as
    JSON stores them.

    The strings are redacted one by one, never the value's JSON text: a form replaced
    there could span a quote or an escape and break the JSON, and it would be searched
    for in its escaped spelling, not the one the tool wrote."""
    found = forms(secret)
    return _cut_value(value, found) if found else value


def _cut(text: str, found: tuple[str, ...]) -> str:
    # Most strings of an answer (keys, ids, numbers as text) are shorter than any form.
    if not found or len(text) < len(found[-1]):
        return text
    for form in found:
        if form in text:
            text = text.replace(form, REDACTED)
    return text


def _cut_value(value: Any, found: tuple[str, ...]) -> Any:
    if isinstance(value, str):
        return _cut(value, found)
    if isinstance(value, list | tuple):
        return [_cut_value(v, found) for v in value]
    if isinstance(value, dict):
        return {
            _cut(k, found) if isinstance(k, str) else k: _cut_value(v, found)
            for k, v in value.items()
        }
    return value


# -- resolving, in the relay ------------------------------------------------------------


def resolve(ref: str, stored: Row | None) -> Secret:
    """The secret ``ref`` names for a call: ``stored`` is the tenant's (or the default's)
    row as the claim returned it (``relay/queries/relay.sql``), None when there is none."""
    if stored is None:
        return Secret(ref, _legacy(ref))
    if stored.get("revoked_at"):
        raise CredentialRevoked(
            f"credential {ref!r} of tenant {stored['tenant_id']} was revoked at "
            f"{stored['revoked_at']}; the call was not executed"
        )
    source = stored["source"]
    if source == "env":
        value = os.environ.get(stored["reference"])
        if value is None:
            raise CredentialUnavailable(
                f"credential {ref!r}: the relay has no ${stored['reference']}"
            )
    elif source == "file":
        value = _from_file(stored["reference"], ref)
    else:
        value = decrypt(stored["ciphertext"], ref)
    return Secret(ref, value, stored["header"], stored["scheme"])


def _legacy(ref: str) -> str:
    env_name = "OUTBOX_SECRET_" + ref.upper().replace("-", "_").replace(".", "_")
    if env_name in os.environ:
        return os.environ[env_name]
    path = os.environ.get("OUTBOX_SECRETS_FILE")
    if path and os.path.exists(path):
        return _from_file(path, ref)
    raise CredentialUnavailable(
        f"credential {ref!r} is not set: `outbox credentials set {ref} ...`, or define "
        f"${env_name} or a line '{ref}=...' in $OUTBOX_SECRETS_FILE for the relay"
    )


def _from_file(path: str, ref: str) -> str:
    try:
        with open(path) as handle:
            for line in handle:
                name, _, value = line.strip().partition("=")
                if name == ref:
                    return value
    except OSError as err:
        raise CredentialUnavailable(f"credential {ref!r}: cannot read {path}: {err}") from err
    raise CredentialUnavailable(f"credential {ref!r}: no line '{ref}=...' in {path}")


def _fernet() -> Fernet:
    key = os.environ.get(KEY_ENV)
    if not key:
        raise CredentialUnavailable(
            f"${KEY_ENV} is not set: the key that encrypts stored credentials "
            "(`outbox credentials new-key` makes one)"
        )
    try:
        return Fernet(key.encode())
    except ValueError as err:
        raise CredentialUnavailable(f"${KEY_ENV} is not a valid key: {err}") from err


def encrypt(value: str) -> str:
    return _fernet().encrypt(value.encode()).decode()


def decrypt(ciphertext: str, ref: str) -> str:
    try:
        return _fernet().decrypt(ciphertext.encode()).decode()
    except InvalidToken as err:
        raise CredentialUnavailable(
            f"credential {ref!r} does not decrypt with ${KEY_ENV}: was it set with another key?"
        ) from err


def new_key() -> str:
    return Fernet.generate_key().decode()


# -- managing, from the CLI -------------------------------------------------------------


def set_credential(
    conn: psycopg.Connection[Any],
    name: str,
    *,
    tenant_id: str = ALL_TENANTS,
    env: str | None = None,
    file: str | None = None,
    value: str | None = None,
    header: str = "Authorization",
    scheme: str = "Bearer",
    actor: str | None = None,
) -> Row:
    """Create or rotate credential ``name`` of ``tenant_id``: exactly one of ``env`` (a
    variable name), ``file`` (a path) or ``value`` (stored encrypted). Rotating bumps its
    version and lifts a revocation; calls claimed from then on carry the new secret."""
    if not NAME.match(name):
        raise InvalidInput(f"credential name {name!r}: use 1-64 letters, digits or _.-")
    if tenant_id != ALL_TENANTS:
        calls.check_tenant(tenant_id)
    given = [k for k, v in (("--env", env), ("--file", file), ("--value-stdin", value)) if v]
    if len(given) != 1:
        raise InvalidInput(
            "give the secret's source: exactly one of --env VAR, --file PATH, --value-stdin",
            hint="--env and --file keep only a reference; --value-stdin stores it encrypted",
        )
    source = "env" if env else "file" if file else "db"
    reference = env or file
    ciphertext = None if value is None else encrypt(value)
    row = fetch_one(
        conn,
        Q.set,
        {
            "tenant_id": tenant_id,
            "name": name,
            "source": source,
            "reference": reference,
            "ciphertext": ciphertext,
            "header": header,
            "scheme": scheme,
            "actor": actor or "unknown",
        },
    )
    assert row is not None
    event = "credential.set" if row["version"] == 1 else "credential.rotated"
    detail = {"name": name, "source": source, "reference": reference, "version": row["version"]}
    journal(conn, event, tenant_id, actor=actor, detail=detail)
    return row


def revoke(
    conn: psycopg.Connection[Any],
    name: str,
    *,
    tenant_id: str = ALL_TENANTS,
    actor: str | None = None,
) -> Row:
    """Revoke credential ``name`` of ``tenant_id``: calls that need it end with an error
    result the model sees (``set`` it again to rotate)."""
    row = fetch_one(conn, Q.revoke, {"tenant_id": tenant_id, "name": name})
    if row is None:
        raise NotFound(
            f"tenant {tenant_id} has no credential {name!r}", hint="`outbox credentials list`"
        )
    detail = {"name": name, "version": row["version"]}
    journal(conn, "credential.revoked", tenant_id, actor=actor, detail=detail)
    return row


def list_credentials(conn: psycopg.Connection[Any]) -> list[Row]:
    """Every credential, without its ciphertext."""
    return fetch_all(conn, Q.list, {})
