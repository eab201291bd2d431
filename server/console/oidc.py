"""Sign-in through an OpenID Connect provider: the authorization code flow with PKCE.

``outbox serve --oidc-issuer URL --oidc-client-id ID --oidc-client-secret-env VAR`` names
the provider. A sign-in goes: the console sends the browser to the provider's
authorization endpoint (from its discovery document) with a fresh ``state``, ``nonce`` and
PKCE challenge (S256), keeping the three in a short-lived cookie of its own
(``FLOW_COOKIE``); the provider sends the browser back with a code; the console checks the
``state`` against its cookie, exchanges the code (with its secret and PKCE verifier) for an
ID token at the token endpoint, and checks the token: its signature against the provider's
JSON Web Key Set (PyJWT), its issuer, audience (and ``azp``), expiry and issue time, and
its nonce against the cookie's. Only then is its ``sub`` looked up: the person is the
console account an operator gave that subject (``outbox console users add ...
--oidc-subject``), so the tenant and role are the operator's decision, never the
provider's. The session is the one a password opens (``outbox.accounts``).

The discovery document and the keys are fetched with httpx2 and kept for ``CACHE_S``; a
token signed with a key id the set does not hold fetches the set again (at most every
``REFETCH_S``), so a provider's key rotation needs no restart. The client secret is read
from the environment variable the command names, never an argument, and is never logged
or shown (``repr`` leaves it out).
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote_plus, urlencode

import httpx2
import jwt

FLOW_COOKIE = "outbox_console_oidc"
CALLBACK = "/console/sign-in/oidc/callback"
CACHE_S = 3600.0  # seconds the discovery document and the keys are kept
REFETCH_S = 60.0  # seconds between fetches of the keys for an unknown key id
HTTP_TIMEOUT_S = 10.0  # seconds a request to the provider may take
LEEWAY_S = 60  # seconds of clock difference allowed on exp and iat
# Asymmetric algorithms only: a token "signed" with none or with HMAC (keyed by the client
# secret) is refused, whatever the provider's document says.
ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512")
REQUIRED_CLAIMS = ["iss", "sub", "aud", "exp", "iat"]


@dataclass(frozen=True)
class Settings:
    """The provider of ``outbox serve --oidc-*``; ``name`` is shown on the button."""

    issuer: str
    client_id: str
    client_secret: str | None = field(default=None, repr=False)
    name: str = ""
    redirect_url: str | None = None  # None: the URL the browser used, + CALLBACK

    @property
    def label(self) -> str:
        return self.name or self.issuer


class Refused(Exception):
    """A sign-in through the provider that opens no session; the message says why and
    what to do, for the person (and the operator they show it to)."""

    def __init__(self, message: str, status: int = 401) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Flow:
    """One sign-in under way: what the browser's flow cookie keeps."""

    state: str
    nonce: str
    verifier: str

    @classmethod
    def new(cls) -> Flow:
        return cls(secrets.token_urlsafe(32), secrets.token_urlsafe(32), secrets.token_urlsafe(48))

    def cookie(self) -> str:
        return f"{self.state}.{self.nonce}.{self.verifier}"

    @classmethod
    def from_cookie(cls, value: str | None) -> Flow | None:
        parts = (value or "").split(".")
        return cls(*parts) if len(parts) == 3 and all(parts) else None

    @property
    def challenge(self) -> str:
        """The PKCE code challenge (RFC 7636, S256) of the verifier."""
        digest = hashlib.sha256(self.verifier.encode("ascii")).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


class Provider:
    """The provider of ``settings``: where to send a browser, and the check of what it
    sends back. One per server process, shared by its requests."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._metadata: tuple[float, dict[str, Any]] | None = None
        self._keys: tuple[float, jwt.PyJWKSet] | None = None

    async def authorization_url(self, flow: Flow, redirect_uri: str) -> str:
        endpoint = str((await self.metadata())["authorization_endpoint"])
        query = {
            "response_type": "code",
            "client_id": self.settings.client_id,
            "redirect_uri": redirect_uri,
            "scope": "openid",
            "state": flow.state,
            "nonce": flow.nonce,
            "code_challenge": flow.challenge,
            "code_challenge_method": "S256",
        }
        return endpoint + ("&" if "?" in endpoint else "?") + urlencode(query)

    async def subject(self, flow: Flow, query: dict[str, str], redirect_uri: str) -> str:
        """The ``sub`` of the person the provider sent back, once everything is checked:
        the state, the code's exchange, the ID token. ``Refused`` otherwise."""
        if "error" in query:
            said = query.get("error_description") or query["error"]
            raise Refused(f"{self.settings.label} did not sign you in: {said}. Try again.")
        if not secrets.compare_digest(query.get("state", ""), flow.state):
            raise Refused(
                "This sign-in's state does not match the one this browser started (an old "
                "or forged link). Start the sign-in again from the sign-in page.",
                400,
            )
        code = query.get("code")
        if not code:
            raise Refused(f"{self.settings.label} sent no code back. Try again.", 400)
        token = await self._exchange(code, flow, redirect_uri)
        claims = await self.verify(token, flow.nonce)
        return str(claims["sub"])

    async def _exchange(self, code: str, flow: Flow, redirect_uri: str) -> str:
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": redirect_uri,
            "code_verifier": flow.verifier,
        }
        headers = {"accept": "application/json"}
        secret = self.settings.client_secret
        if secret is None:
            form["client_id"] = self.settings.client_id  # a public client: PKCE alone
        else:
            pair = f"{quote_plus(self.settings.client_id)}:{quote_plus(secret)}"
            headers["authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        endpoint = str((await self.metadata())["token_endpoint"])
        answer = await self._request("POST", endpoint, data=form, headers=headers)
        body = _json(answer)
        if answer.status_code != 200:
            said = body.get("error_description") or body.get("error") or answer.status_code
            raise Refused(
                f"{self.settings.label} refused this sign-in's code ({said}): a code is good "
                "once and for a few minutes. Start the sign-in again."
            )
        if not isinstance(body.get("id_token"), str):
            raise Refused(f"{self.settings.label} answered without an ID token.", 502)
        return str(body["id_token"])

    async def verify(self, token: str, nonce: str) -> dict[str, Any]:
        """The claims of ``token`` once its signature (the provider's keys), issuer,
        audience, expiry, issue time and nonce are checked; ``Refused`` otherwise."""
        label, client_id = self.settings.label, self.settings.client_id
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError as err:
            raise Refused(f"{label} sent an ID token that is not a JWT ({err}).") from None
        algorithm = header.get("alg")
        allowed = (await self.metadata()).get("id_token_signing_alg_values_supported", ["RS256"])
        if algorithm not in ALGORITHMS or algorithm not in allowed:
            raise Refused(f"{label}'s ID token is signed with {algorithm!r}, which is refused.")
        key = await self._key(str(header.get("kid", "")))
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key,
                algorithms=[str(algorithm)],
                audience=client_id,
                issuer=self.settings.issuer,
                leeway=LEEWAY_S,
                options={"require": REQUIRED_CLAIMS},
            )
        except jwt.InvalidSignatureError:
            raise Refused(
                f"{label}'s ID token does not verify against its published keys (JWKS): it "
                "was not signed by the provider. No session was opened."
            ) from None
        except jwt.ExpiredSignatureError:
            raise Refused(
                f"{label}'s ID token has expired. Start the sign-in again; if this persists, "
                "check the clocks of this server and the provider."
            ) from None
        except jwt.InvalidAudienceError:
            raise Refused(
                f"{label}'s ID token was issued to another client, not to this console "
                f"(client id {client_id}). No session was opened."
            ) from None
        except jwt.InvalidIssuerError:
            raise Refused(
                f"The ID token was issued by another issuer than {self.settings.issuer}. "
                "No session was opened."
            ) from None
        except jwt.MissingRequiredClaimError as err:
            raise Refused(f"{label}'s ID token has no {err.claim!r} claim.") from None
        except jwt.InvalidTokenError as err:
            raise Refused(f"{label}'s ID token is not valid: {err}.") from None
        audiences = claims["aud"] if isinstance(claims["aud"], list) else [claims["aud"]]
        if (len(audiences) > 1 or "azp" in claims) and claims.get("azp") != client_id:
            raise Refused(f"{label}'s ID token was issued to another party (azp).")
        if not secrets.compare_digest(str(claims.get("nonce", "")), nonce):
            raise Refused(
                f"{label}'s ID token does not carry this sign-in's nonce (a token of another "
                "sign-in, replayed). Start the sign-in again."
            )
        return claims

    async def metadata(self) -> dict[str, Any]:
        """The provider's discovery document (kept ``CACHE_S``); its issuer must be the
        one configured, to the character (OpenID Connect Discovery, 4.3)."""
        now = time.monotonic()
        if self._metadata is not None and now - self._metadata[0] < CACHE_S:
            return self._metadata[1]
        url = self.settings.issuer.rstrip("/") + "/.well-known/openid-configuration"
        answer = await self._request("GET", url)
        document = _json(answer)
        needed = ("authorization_endpoint", "token_endpoint", "jwks_uri")
        if answer.status_code != 200 or any(not document.get(name) for name in needed):
            raise Refused(
                f"{url} gave no OpenID Connect discovery document (HTTP "
                f"{answer.status_code}). Check --oidc-issuer.",
                502,
            )
        if document.get("issuer") != self.settings.issuer:
            raise Refused(
                f"The discovery document names the issuer {document.get('issuer')!r}, not "
                f"{self.settings.issuer!r}: give --oidc-issuer exactly as the provider does.",
                502,
            )
        self._metadata = (now, document)
        return document

    async def _key(self, kid: str) -> Any:
        """The provider's public key ``kid``: from the kept set, or the set fetched again
        when it is old or (at most every ``REFETCH_S``) lacks ``kid``."""
        now = time.monotonic()
        kept = self._keys
        if (
            kept is None
            or now - kept[0] >= CACHE_S
            or (_find(kept[1], kid) is None and now - kept[0] >= REFETCH_S)
        ):
            kept = self._keys = (now, await self._fetch_keys())
        found = _find(kept[1], kid)
        if found is None:
            raise Refused(
                f"{self.settings.label}'s ID token names a key ({kid or 'none'}) that its "
                "published keys (JWKS) do not hold. No session was opened."
            )
        return found.key

    async def _fetch_keys(self) -> jwt.PyJWKSet:
        url = str((await self.metadata())["jwks_uri"])
        answer = await self._request("GET", url)
        try:
            return jwt.PyJWKSet.from_dict(_json(answer))
        except jwt.PyJWKSetError as err:
            raise Refused(f"{url} gave no usable key set ({err}).", 502) from None

    async def _request(self, method: str, url: str, **options: Any) -> httpx2.Response:
        try:
            async with httpx2.AsyncClient(timeout=HTTP_TIMEOUT_S) as client:
                return await client.request(method, url, **options)
        except httpx2.HTTPError as err:
            raise Refused(
                f"{self.settings.label} did not answer ({url}: {type(err).__name__}). Try "
                "again later.",
                502,
            ) from None


def _find(keys: jwt.PyJWKSet, kid: str) -> jwt.PyJWK | None:
    # A set of one key may name none (kid optional); then that key is the one.
    if not kid and len(keys.keys) == 1:
        return keys.keys[0]
    return next((key for key in keys.keys if key.key_id == kid), None)


def _json(answer: httpx2.Response) -> dict[str, Any]:
    try:
        body = answer.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
