"""``FakeOIDCProvider``: an OpenID Connect provider for tests and the demo, a real HTTP server.

It serves what ``outbox serve --oidc-issuer`` reads from a provider: the discovery document
(``/.well-known/openid-configuration``), an authorization endpoint (``/authorize``), a token
endpoint (``/token``) and the JSON Web Key Set (``/jwks``) of an RSA key generated when it
starts. The authorization endpoint asks nobody anything: it redirects back at once with a
code for the person the test scripted (``sign_in_as``), or with ``error=access_denied`` when
nobody is scripted. The token endpoint is as strict as a real provider: the client's
secret, the code's redirect URI and its PKCE verifier (S256) are checked, and a code is
good once (a second use answers ``invalid_grant``).

Faults, to prove that the console checks what it must: an ID token with another nonce,
another audience, another issuer, already expired, or signed by a key that is not in the
JWKS (``sign_in_as(..., other_key=True)``: the same ``kid``, another key).

Design choice: the ID token is signed with PyJWT and the keys are made with
``cryptography``, as a provider's library would; nothing here is hand-made crypto.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import time
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import parse_qsl, unquote_plus, urlencode

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa

from outbox.testing.server import FakeServer, HttpError, Reply, Request, json_reply, serve_main

CLIENT_ID = "outbox-console"
CLIENT_SECRET = "fake-client-secret"  # the tests' and the demo's; a fake's, never a real one
KID = "fake-key-1"
ID_TOKEN_S = 300  # seconds an ID token lives
CODE_S = 60  # seconds a code may wait for its exchange


@dataclass(frozen=True)
class ScriptedUser:
    """Who the next authorization signs in, and how their ID token is spoilt, if at all."""

    subject: str
    email: str | None = None
    nonce: str | None = None  # None: the one the console sent
    audience: str | None = None  # None: the client id
    issuer: str | None = None  # None: the provider's own
    expires_in: int = ID_TOKEN_S  # seconds; negative: already expired
    other_key: bool = False  # signed by a key the JWKS does not hold (same kid)


@dataclass(frozen=True)
class _Grant:
    user: ScriptedUser
    client_id: str
    redirect_uri: str
    nonce: str | None
    challenge: str
    expires: float  # time.monotonic()


def s256(verifier: str) -> str:
    """The PKCE code challenge of ``verifier`` (RFC 7636, S256)."""
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


class FakeOIDCProvider(FakeServer):
    """An OpenID Connect provider at ``url`` (its issuer) for one client (``client_id``,
    ``client_secret``). ``default_subject``: whom an authorization signs in when nobody is
    scripted (the demo's); None refuses it, as a person who cancels."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        client_id: str = CLIENT_ID,
        client_secret: str = CLIENT_SECRET,
        default_subject: str | None = None,
    ) -> None:
        super().__init__(host, port)
        self.client_id, self.client_secret = client_id, client_secret
        self.default = ScriptedUser(default_subject) if default_subject else None
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.other_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self._next: list[ScriptedUser] = []
        self._grants: dict[str, _Grant] = {}
        self._used: set[str] = set()
        self.token_requests = 0

    # -- what a test scripts -------------------------------------------------------------

    def sign_in_as(self, subject: str, **spoilt: Any) -> ScriptedUser:
        """The next authorization signs in ``subject``; ``spoilt``: the fields of
        ``ScriptedUser`` that make its ID token wrong."""
        user = replace(ScriptedUser(subject), **spoilt)
        with self.lock:
            self._next.append(user)
        return user

    @property
    def issuer(self) -> str:
        return self.url

    # -- the endpoints -------------------------------------------------------------------

    def handle(self, request: Request) -> Reply:
        route = (request.method, request.path)
        if route == ("GET", "/.well-known/openid-configuration"):
            return json_reply(200, self.discovery())
        if route == ("GET", "/jwks"):
            return json_reply(200, self.jwks())
        if route == ("GET", "/authorize"):
            return self.authorize(request)
        if route == ("POST", "/token"):
            return self.token(request)
        raise HttpError(404, {"error": "not_found"})

    def discovery(self) -> dict[str, Any]:
        return {
            "issuer": self.issuer,
            "authorization_endpoint": f"{self.url}/authorize",
            "token_endpoint": f"{self.url}/token",
            "jwks_uri": f"{self.url}/jwks",
            "response_types_supported": ["code"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post"],
            "scopes_supported": ["openid", "email"],
        }

    def jwks(self) -> dict[str, Any]:
        public = jwt.algorithms.RSAAlgorithm.to_jwk(self.key.public_key(), as_dict=True)
        return {"keys": [{**public, "kid": KID, "use": "sig", "alg": "RS256"}]}

    def authorize(self, request: Request) -> Reply:
        q = request.query
        redirect_uri = q.get("redirect_uri", "")
        if q.get("client_id") != self.client_id or not redirect_uri:
            raise HttpError(400, {"error": "invalid_request", "detail": "client or redirect"})
        back: dict[str, str] = {"state": q["state"]} if "state" in q else {}
        if (
            q.get("response_type") != "code"
            or "openid" not in q.get("scope", "").split()
            or q.get("code_challenge_method") != "S256"
            or not q.get("code_challenge")
        ):
            back["error"] = "invalid_request"
            return _redirect(redirect_uri, back)
        with self.lock:
            user = self._next.pop(0) if self._next else self.default
            if user is None:
                back["error"] = "access_denied"
                return _redirect(redirect_uri, back)
            code = secrets.token_urlsafe(24)
            self._grants[code] = _Grant(
                user,
                self.client_id,
                redirect_uri,
                q.get("nonce"),
                q["code_challenge"],
                time.monotonic() + CODE_S,
            )
        return _redirect(redirect_uri, {"code": code, **back})

    def token(self, request: Request) -> Reply:
        form = dict(parse_qsl(request.body.decode()))
        client_id, secret = _client_of(request, form)
        with self.lock:
            self.token_requests += 1
            if client_id != self.client_id or not secrets.compare_digest(
                secret, self.client_secret
            ):
                raise HttpError(401, {"error": "invalid_client"})
            code = form.get("code", "")
            grant = self._grants.pop(code, None)
            if form.get("grant_type") != "authorization_code" or grant is None:
                again = code in self._used
                detail = "the code was used already" if again else "unknown code"
                raise HttpError(400, {"error": "invalid_grant", "error_description": detail})
            self._used.add(code)
        if time.monotonic() > grant.expires or form.get("redirect_uri") != grant.redirect_uri:
            raise HttpError(400, {"error": "invalid_grant", "error_description": "redirect"})
        if s256(form.get("code_verifier", "")) != grant.challenge:
            raise HttpError(400, {"error": "invalid_grant", "error_description": "PKCE"})
        return json_reply(
            200,
            {
                "access_token": secrets.token_urlsafe(24),
                "token_type": "Bearer",
                "expires_in": ID_TOKEN_S,
                "id_token": self.id_token(grant),
            },
        )

    def id_token(self, grant: _Grant) -> str:
        user, now = grant.user, int(time.time())
        claims: dict[str, Any] = {
            "iss": user.issuer or self.issuer,
            "sub": user.subject,
            "aud": user.audience or grant.client_id,
            "iat": now,
            "exp": now + user.expires_in,
            "nonce": user.nonce or grant.nonce,
        }
        if user.email is not None:
            claims["email"], claims["email_verified"] = user.email, True
        key = self.other_key if user.other_key else self.key
        return jwt.encode(claims, key, algorithm="RS256", headers={"kid": KID})


def _redirect(uri: str, params: dict[str, str]) -> Reply:
    joiner = "&" if "?" in uri else "?"
    return Reply(302, headers={"Location": uri + joiner + urlencode(params)})


def _client_of(request: Request, form: dict[str, str]) -> tuple[str, str]:
    """The client id and secret of a token request: HTTP Basic (client_secret_basic) or
    the form's fields (client_secret_post)."""
    header = request.headers.get("authorization", "")
    if header.lower().startswith("basic "):
        try:
            pair = base64.b64decode(header[6:]).decode()
        except ValueError:
            return "", ""
        client_id, _, secret = pair.partition(":")
        return unquote_plus(client_id), unquote_plus(secret)  # RFC 6749 2.3.1
    return form.get("client_id", ""), form.get("client_secret", "")


def main() -> int:
    """``python -m outbox.testing.oidc``: a provider that signs in ``demo`` to every
    authorization (client ``outbox-console``, secret ``fake-client-secret``)."""
    return serve_main(
        lambda host, port: FakeOIDCProvider(host, port, default_subject="demo"),
        "A fake OpenID Connect provider (client outbox-console) that signs in 'demo'.",
    )


if __name__ == "__main__":
    raise SystemExit(main())
