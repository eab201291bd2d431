"""Console accounts of ``outbox serve``: who may sign in, with which role, in which tenant.

A person has a name, a tenant (``*``: an operator of every tenant, a platform operator) and a
role: ``reviewer`` (sees and decides their tenant's approvals), ``operator`` (acts on
their tenant's runs) or ``viewer`` (changes nothing). Only the argon2id hash of a password
is stored (argon2-cffi, its default parameters), and only the SHA-256 of a session's cookie
token, so a database dump opens no session and reveals no password.

A person may also sign in through the OpenID Connect provider ``outbox serve`` is configured
with: an operator gives the account the person's subject there (``oidc_subject``), and the
server opens its session once it has verified an ID token with that subject
(``oidc_sign_in``). Such an account needs no password. The provider names a subject, never
a tenant or a role: those are the account's.

Signing in happens before any tenant is known, so the server reads accounts and sessions
through SECURITY DEFINER functions (``console_account_v1`` and its siblings) that
``outbox_api`` may call, as it reads API keys; the count of failed sign-ins and the lockout
live in the database, so every server process counts the same failures. Like the writer,
these functions run on the caller's connection and never commit.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from typing import Any

import psycopg
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from outbox.calls import check_tenant
from outbox.errors import InvalidInput, NotFound
from outbox.sql import queries
from outbox.statements import Row, fetch_all, fetch_one, journal

Q = queries("accounts.sql")
ROLES = ("reviewer", "operator", "viewer")
EVERY_TENANT = "*"
SESSION_S = 8 * 3600  # how long a session lasts after its sign-in
MIN_PASSWORD = 12  # characters a password needs at least
SUBJECT = re.compile(r"[\x21-\x7e]{1,255}")  # an OpenID Connect sub claim, as stored
_HASHER = PasswordHasher()
# Checked when a name is unknown, so that an unknown name costs a sign-in as long as a
# wrong password and does not tell itself apart by its answer's time.
_DUMMY_HASH = _HASHER.hash(secrets.token_urlsafe(16))


@dataclass(frozen=True)
class Person:
    """Who holds a session: their name, tenant, role and the session's CSRF token."""

    name: str
    tenant_id: str
    role: str
    csrf_token: str
    read_only: bool = False  # a console served read-only: nobody changes anything

    @property
    def every_tenant(self) -> bool:
        return self.tenant_id == EVERY_TENANT

    @property
    def may_decide(self) -> bool:
        """Reviewers and operators decide approvals; viewers change nothing."""
        return self.role in ("reviewer", "operator") and not self.read_only

    @property
    def may_operate(self) -> bool:
        """Operators act on calls, tools and tenants."""
        return self.role == "operator" and not self.read_only


def digest(token: str) -> str:
    """The SHA-256 (hex) a session token is stored and looked up by."""
    return hashlib.sha256(token.encode()).hexdigest()


def add_user(
    conn: psycopg.Connection[Any],
    name: str,
    *,
    tenant_id: str,
    role: str,
    password: str | None,
    oidc_subject: str | None = None,
    actor: str = "",
) -> Row:
    """A new console account; journaled as ``console.user_added``. ``*`` as the tenant is
    for operators only (a platform operator). It signs in with ``password``, through the
    OpenID Connect provider as ``oidc_subject`` (the ``sub`` of its ID tokens), or both."""
    if role not in ROLES:
        raise InvalidInput(f"role {role!r} is not one of {', '.join(ROLES)}")
    if tenant_id == EVERY_TENANT:
        if role != "operator":
            raise InvalidInput(
                "only an operator may act for every tenant ('*')",
                hint="give --role operator, or name one tenant",
            )
    else:
        check_tenant(tenant_id)
    if password is None and oidc_subject is None:
        raise InvalidInput(
            f"console user {name} needs a password or an OpenID Connect subject to sign in",
            hint="give a password, or --oidc-subject SUB (the sub claim of their ID tokens)",
        )
    if password is not None and len(password) < MIN_PASSWORD:
        raise InvalidInput(f"a console password needs at least {MIN_PASSWORD} characters")
    if oidc_subject is not None and not SUBJECT.fullmatch(oidc_subject):
        raise InvalidInput(
            f"OpenID Connect subject {oidc_subject!r} is not valid",
            hint="give the sub claim exactly as the provider sends it: 1-255 printable "
            "ASCII characters, no space",
        )
    try:
        row = fetch_one(
            conn,
            Q.insert_user,
            {
                "name": name,
                "tenant_id": tenant_id,
                "role": role,
                "password_hash": None if password is None else _HASHER.hash(password),
                "oidc_subject": oidc_subject,
            },
        )
    except psycopg.errors.UniqueViolation as err:
        if err.diag.constraint_name == "console_users_oidc_subject":
            raise InvalidInput(
                f"another console user has the OpenID Connect subject {oidc_subject}",
                hint="`outbox console users list` shows who; one subject is one person",
            ) from None
        raise InvalidInput(f"console user {name} exists already") from None
    except psycopg.errors.CheckViolation:
        raise InvalidInput(
            f"console user name {name!r} is not valid", hint="use 1-128 letters, digits or _.@-"
        ) from None
    assert row is not None
    detail = {"name": name, "role": role, "password": password is not None}
    if oidc_subject is not None:
        detail["oidc_subject"] = oidc_subject
    journal(conn, "console.user_added", tenant_id, actor=actor, detail=detail)
    return row


def list_users(conn: psycopg.Connection[Any], tenant_id: str | None = None) -> list[Row]:
    return fetch_all(conn, Q.list_users, {"tenant_id": tenant_id})


def remove_user(conn: psycopg.Connection[Any], name: str, *, actor: str = "") -> Row:
    """Remove an account and end its sessions; journaled as ``console.user_removed``."""
    row = fetch_one(conn, Q.delete_user, {"name": name})
    if row is None:
        raise NotFound(f"console user {name} does not exist", hint="`outbox console users list`")
    journal(conn, "console.user_removed", row["tenant_id"], actor=actor, detail={"name": name})
    return row


def unlock_user(conn: psycopg.Connection[Any], name: str, *, actor: str = "") -> Row:
    """Lift ``name``'s lockout after failed sign-ins (and forget the failures counted so
    far); journaled as ``console.user_unlocked`` with the lock it had."""
    row = fetch_one(conn, Q.unlock_user, {"name": name})
    if row is None:
        raise NotFound(f"console user {name} does not exist", hint="`outbox console users list`")
    was = row["was_locked_until"]
    detail = {"name": name, "was_locked_until": None if was is None else was.isoformat()}
    journal(conn, "console.user_unlocked", row["tenant_id"], actor=actor, detail=detail)
    return row


@dataclass(frozen=True)
class SignIn:
    """A sign-in's outcome: the session token for the cookie (None when refused) and
    whether the account is locked."""

    token: str | None
    locked: bool = False


def sign_in(conn: psycopg.Connection[Any], name: str, password: str) -> SignIn:
    """Check ``password`` for ``name``: a session when it is right and the account is not
    locked; a failure counted otherwise (``console_signed_in_v1`` locks the account after
    five in a row). An unknown name is refused as a wrong password is."""
    account = fetch_one(conn, Q.account, {"name": name})
    if account is None:
        _verify(_DUMMY_HASH, password)
        return SignIn(None)
    if account["locked"]:
        return SignIn(None, locked=True)
    # An account without a password (it signs in through the provider) takes none: the
    # same check and answer as a wrong one.
    stored = account["password_hash"]
    right = _verify(stored or _DUMMY_HASH, password) and stored is not None
    token = secrets.token_urlsafe(32) if right else None
    row = fetch_one(
        conn,
        Q.signed_in,
        {
            "name": name,
            "token_hash": digest(token) if token else None,
            "csrf_token": secrets.token_urlsafe(32),
            "ttl_s": SESSION_S,
        },
    )
    opened = bool(row and row["opened"])
    if opened:
        return SignIn(token)
    locked = fetch_one(conn, Q.account, {"name": name})
    return SignIn(None, locked=bool(locked and locked["locked"]))


def oidc_sign_in(conn: psycopg.Connection[Any], subject: str) -> tuple[Row, str] | None:
    """A session for the person whose subject at the OpenID Connect provider is
    ``subject`` (the caller verified the ID token that names it): their name and tenant,
    and the session token for the cookie; None (no session) when no person has it."""
    token = secrets.token_urlsafe(32)
    row = fetch_one(
        conn,
        Q.oidc_signed_in,
        {
            "subject": subject,
            "token_hash": digest(token),
            "csrf_token": secrets.token_urlsafe(32),
            "ttl_s": SESSION_S,
        },
    )
    return None if row is None else (row, token)


def _verify(password_hash: str, password: str) -> bool:
    try:
        return _HASHER.verify(password_hash, password)
    except (VerificationError, InvalidHashError):
        return False


def session(conn: psycopg.Connection[Any], token: str) -> Person | None:
    """The person a session token belongs to; None when unknown or expired."""
    row = fetch_one(conn, Q.session, {"token_hash": digest(token)})
    if row is None:
        return None
    return Person(row["name"], row["tenant_id"], row["role"], row["csrf_token"])


def sign_out(conn: psycopg.Connection[Any], token: str) -> None:
    conn.execute(Q.signed_out, {"token_hash": digest(token)})
