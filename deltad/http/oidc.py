"""Sign-in through an OpenID provider (`http.oidc`), in the inbox process: the provider's
discovery document and keys (fetched here, never by the core, kept `cache_seconds`; a key id
not in the set fetches them again, at most once per `jwks_refetch_seconds`), the checks of an
ID token or a bearer JWT against them (joserfc: signature, iss, aud, exp, nonce), and the
authorization code flow with PKCE (S256), `state` and `nonce` kept in a short-lived signed
cookie of the browser that started it.

The checks are pure functions (`claims_refusal`, `callback_refusal`); `Provider` is the shell
(HTTP with httpx, the caches). What the checks accept becomes a person (deltad/inbox/oidc.py).
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

import httpx
import structlog
from joserfc import jwt
from joserfc.errors import ClaimError, JoseError
from joserfc.jwk import KeySet
from joserfc.jwt import ClaimsOption

from deltad import keys
from deltad.inbox import oidc as people
from deltad.inbox.config import OidcConfig
from deltad.inbox.tokens import Identity

log = structlog.get_logger("deltad.http.oidc")

# Asymmetric only: a key set never holds a shared secret, and "none"/HS* must never pass.
ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512")
LEEWAY = 60  # seconds of clock skew allowed on exp/iat/nbf
PENDING_SECONDS = 600  # a sign-in not finished by then starts again
DOCUMENT_MAX = 1 << 20  # bytes of a discovery document or key set
PENDING_COOKIE = "deltad_oidc"
CALLBACK_PATH = "/v1/oidc/callback"


class Refused(Exception):
    """Why a token or a callback is not accepted (one line, no token in it)."""


@dataclass(frozen=True)
class Pending:
    """A sign-in started by this browser: what its callback must match."""

    state: str
    nonce: str
    verifier: str
    expires: int


# -- the pure checks ----------------------------------------------------------------------------
def challenge(verifier: str) -> str:
    """PKCE S256 (RFC 7636): the verifier's SHA-256, base64url without padding."""
    return (
        base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    )


def claims_refusal(
    claims: Mapping[str, Any], issuer: str, audience: str, now: int, nonce: str | None = None
) -> str | None:
    """Why a signed token's claims are not accepted, or None: iss, aud, exp (essential), nbf
    and iat not in the future, the nonce when one was sent (an ID token of this sign-in)."""
    wanted: dict[str, ClaimsOption] = {
        "iss": {"essential": True, "value": issuer},
        "aud": {"essential": True, "value": audience},
        "exp": {"essential": True},
        "sub": {"essential": True},
    }
    if nonce is not None:
        wanted["nonce"] = {"essential": True, "value": nonce}
    registry = jwt.JWTClaimsRegistry(now=now, leeway=LEEWAY, **wanted)
    try:
        registry.validate(dict(claims))
    except ClaimError as e:
        return f"{e.error} ({e.claim}): {e.description}"
    except JoseError as e:
        return f"{e.error}: {e.description}" if e.description else str(e.error)
    aud = claims.get("aud")
    if isinstance(aud, list) and len(aud) > 1 and claims.get("azp", audience) != audience:
        return "invalid_claim: azp is not this client"  # OIDC Core 3.1.3.7 (6)
    return None


def callback_refusal(
    pending: Pending | None, params: Mapping[str, str], issuer: str, iss_required: bool, now: int
) -> str | None:
    """Why a callback is not the one this browser's sign-in awaits, or None: its `state`,
    its `iss` (RFC 9207: when sent, or when the provider says it always sends it), a code."""
    if pending is None or now >= pending.expires:
        return "no sign-in was started in this browser (or it is over 10 minutes old): start again"
    if "error" in params:
        return f"the provider refused: {params['error'][:80]}"
    if not secrets.compare_digest(params.get("state", ""), pending.state):
        return "state does not match this browser's sign-in"
    iss = params.get("iss")
    if (iss is not None or iss_required) and iss != issuer:
        return "iss is not the configured issuer (RFC 9207)"
    if not params.get("code"):
        return "no code"
    return None


def seal_pending(key: bytes, p: Pending) -> str:
    body = keys.b64(json.dumps([p.state, p.nonce, p.verifier, p.expires]).encode())
    return f"{body}.{keys.b64(keys.sign(key, 'oidc', body))}"


def unseal_pending(key: bytes, cookie: str | None) -> Pending | None:
    if not cookie or len(cookie) > 1024:
        return None
    body, _, mac = cookie.partition(".")
    try:
        if not keys.verify(key, keys.unb64(mac), "oidc", body):
            return None
        state, nonce, verifier, expires = json.loads(keys.unb64(body))
    except (ValueError, TypeError):
        return None
    if not all(isinstance(x, str) for x in (state, nonce, verifier)) or not isinstance(
        expires, int
    ):
        return None
    return Pending(state, nonce, verifier, expires)


def looks_like_jwt(token: str) -> bool:
    return token.count(".") == 2 and token.startswith("eyJ")


# -- the shell ----------------------------------------------------------------------------------
class Provider:
    """The configured provider as this process reaches it (thread-safe: routes run in
    threads). `client`: the HTTP client (tests hand their own)."""

    def __init__(
        self,
        config: OidcConfig,
        secret: str | None,
        base_url: str,
        client: httpx.Client | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config, self.secret, self.clock = config, secret, clock
        self.redirect_url = config.redirect_url or base_url.rstrip("/") + CALLBACK_PATH
        self.audience = config.audience or config.client_id
        self.client = client or httpx.Client(timeout=config.timeout_seconds)
        self._lock = threading.Lock()
        self._fetch = threading.RLock()  # one fetch at a time (keys take discovery inside)
        self._meta: tuple[float, dict[str, Any]] | None = None
        self._keys: tuple[float, KeySet] | None = None
        self._refetched = -1e18

    # -- discovery and keys --------------------------------------------------------------------
    def _get(self, url: str) -> dict[str, Any]:
        try:
            r = self.client.get(url, headers={"Accept": "application/json"})
        except httpx.HTTPError as e:
            raise Refused(f"the provider is unreachable ({type(e).__name__})") from None
        if r.status_code != 200 or len(r.content) > DOCUMENT_MAX:
            raise Refused(f"the provider answered {r.status_code} for {url}")
        try:
            doc = r.json()
        except ValueError:
            raise Refused(f"the provider's {url} is not JSON") from None
        if not isinstance(doc, dict):
            raise Refused(f"the provider's {url} is not a JSON object")
        return doc

    def metadata(self) -> dict[str, Any]:
        now = self.clock()
        with self._lock:
            if self._meta is not None and now < self._meta[0]:
                return self._meta[1]
        with self._fetch:
            url = self.config.issuer.rstrip("/") + "/.well-known/openid-configuration"
            doc = self._get(url)
            if doc.get("issuer") != self.config.issuer:
                raise Refused("the discovery document names another issuer")
            for k in ("authorization_endpoint", "token_endpoint", "jwks_uri"):
                if not isinstance(doc.get(k), str):
                    raise Refused(f"the discovery document has no {k}")
            log.info("oidc_discovered", issuer=self.config.issuer)
            with self._lock:
                self._meta = (now + self.config.cache_seconds, doc)
            return doc

    def keyset(self, kid: str | None) -> KeySet:
        """The provider's keys; fetched again when `kid` is not among them (a rotation), at
        most once per `jwks_refetch_seconds` (a flood of made-up kids costs one fetch)."""
        now = self.clock()
        with self._lock:
            held = self._keys
            fresh = held is not None and now < held[0]
            known = held is not None and (kid is None or _has(held[1], kid))
            if fresh and known:
                assert held is not None
                return held[1]
            if (
                held is not None
                and fresh
                and now - self._refetched < self.config.jwks_refetch_seconds
            ):
                return held[1]
        with self._fetch:
            doc = self._get(str(self.metadata()["jwks_uri"]))
            try:
                ks = KeySet.import_key_set(doc)  # type: ignore[arg-type]
            except (JoseError, ValueError, TypeError, KeyError) as e:
                raise Refused(f"the provider's key set is not one ({type(e).__name__})") from None
            log.info("oidc_keys_fetched", issuer=self.config.issuer, keys=len(ks.keys))
            with self._lock:
                self._keys, self._refetched = (now + self.config.cache_seconds, ks), now
            return ks

    # -- tokens ----------------------------------------------------------------------------------
    def verify(
        self, token: str, nonce: str | None = None, audience: str | None = None
    ) -> dict[str, Any]:
        """The claims of a JWT the provider signed, checked (Refused otherwise)."""
        try:
            header = json.loads(keys.unb64(token.split(".", 1)[0]))
        except (ValueError, TypeError):
            raise Refused("not a JWT") from None
        kid = header.get("kid") if isinstance(header, dict) else None
        ks = self.keyset(kid if isinstance(kid, str) else None)
        try:
            decoded = jwt.decode(token, ks, algorithms=list(ALGORITHMS))
        except (JoseError, ValueError) as e:
            raise Refused(f"the signature does not check out ({type(e).__name__})") from None
        why = claims_refusal(
            decoded.claims, self.config.issuer, audience or self.audience, int(self.clock()), nonce
        )
        if why is not None:
            raise Refused(why)
        return dict(decoded.claims)

    def caller(self, token: str) -> Identity:
        """A bearer JWT the provider signed (for `audience`), as the person it names: the
        API's and the MCP endpoint's one check (Refused otherwise). The role and scopes are
        the configuration's (the core makes them again from its own)."""
        person = people.person(self.verify(token), self.config.groups_claim)
        if isinstance(person, str):
            raise Refused(person)
        return people.identity(person, self.config)

    # -- the code flow ---------------------------------------------------------------------------
    def cookie_path(self) -> str:
        """The path the session cookie is set for: where the browser sees /v1 (the callback's
        own path, less /oidc/callback: right under a reverse proxy's prefix too)."""
        path = urlsplit(self.redirect_url).path
        tail = CALLBACK_PATH.removeprefix("/v1")
        return path.removesuffix(tail) if path.endswith(CALLBACK_PATH) else "/"

    def start(self) -> tuple[str, Pending]:
        """Where to send the browser, and what its callback must match."""
        p = Pending(
            secrets.token_urlsafe(24),
            secrets.token_urlsafe(24),
            secrets.token_urlsafe(48),
            int(self.clock()) + PENDING_SECONDS,
        )
        query = {
            "response_type": "code",
            "client_id": self.config.client_id,
            "redirect_uri": self.redirect_url,
            "scope": " ".join(self.config.scopes),
            "state": p.state,
            "nonce": p.nonce,
            "code_challenge": challenge(p.verifier),
            "code_challenge_method": "S256",
        }
        endpoint = str(self.metadata()["authorization_endpoint"])
        return f"{endpoint}{'&' if '?' in endpoint else '?'}{urlencode(query)}", p

    def finish(self, params: Mapping[str, str], pending: Pending | None) -> dict[str, Any]:
        """The checked ID token claims of a callback (Refused otherwise)."""
        meta = self.metadata()
        required = meta.get("authorization_response_iss_parameter_supported") is True
        why = callback_refusal(pending, params, self.config.issuer, required, int(self.clock()))
        if why is not None:
            raise Refused(why)
        assert pending is not None
        form = {
            "grant_type": "authorization_code",
            "code": params["code"],
            "redirect_uri": self.redirect_url,
            "code_verifier": pending.verifier,
            "client_id": self.config.client_id,
        }
        try:
            if self.secret is not None:  # client_secret_basic
                basic = (self.config.client_id, self.secret)
                r = self.client.post(str(meta["token_endpoint"]), data=form, auth=basic)
            else:
                r = self.client.post(str(meta["token_endpoint"]), data=form)
        except httpx.HTTPError as e:
            raise Refused(f"the provider is unreachable ({type(e).__name__})") from None
        if r.status_code != 200:
            raise Refused(f"the provider refused the code ({r.status_code})")
        try:
            id_token = r.json().get("id_token")
        except (ValueError, AttributeError):
            id_token = None
        if not isinstance(id_token, str):
            raise Refused("the provider sent no ID token")
        return self.verify(id_token, nonce=pending.nonce, audience=self.config.client_id)


def signed_in(name: str, groups: tuple[str, ...]) -> None:
    log.info("oidc_signed_in", name=name, groups=list(groups))


def refused(reason: str) -> None:
    """A callback that minted no session (never its code or token: the reason alone)."""
    log.warning("oidc_sign_in_refused", reason=reason)


def _has(ks: KeySet, kid: str) -> bool:
    return any(k.kid == kid for k in ks.keys)
