"""Bot Framework's authentication of the activities Teams sends a bot (learn.microsoft.com,
"Authentication with the Bot Connector API"): each POST carries `Authorization: Bearer <JWT>`,
signed (RS256) by a key the Bot Connector publishes in its OpenID metadata's `jwks_uri`.

    verify(token, keys, app_id, service_url, channel_id)
        The JWT's claims if it holds (pure, PyJWT): RS256 by the key its `kid` names in `keys`
        (a JWKS document), issuer `https://api.botframework.com`, audience the bot's app id,
        `exp` (and `nbf` when given) within five minutes of clock skew, its `serviceUrl` claim
        equal to the activity's, and the key endorsed for the activity's channel when the key
        lists endorsements. `Unauthentic` (with a code and the HTTP status) otherwise.
    BotKeys(metadata_url, timeout)
        The keys, fetched in the inbox process (never the core's loop): the metadata document,
        then its `jwks_uri`; kept for a day, fetched again for a `kid` not among them at most
        once every REFETCH_SECONDS (a token naming keys that do not exist cannot make this
        process fetch on every request).

Both processes run `verify`: the inbox to refuse at once without a call to the core, the core
again with the key set the inbox relays (deltad/outbound/teams.py), as it checks everything
the inbox hands it. The key set itself is fetched by the inbox: docs/inbox.md, "Microsoft
Teams", says what that trusts.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx
import jwt

ISSUER = "https://api.botframework.com"
LEEWAY = 5 * 60  # seconds of clock skew allowed on exp and nbf (Bot Framework's rule)
KEEP_SECONDS = 24 * 3600.0  # the key set fetched again after a day (Microsoft rotates keys)
REFETCH_SECONDS = 60.0  # at most one fetch a minute for a kid not in the set
DOC_MAX = 256 * 1024  # bytes of the metadata document or the key set


class Unauthentic(Exception):
    """An activity not signed as Bot Framework signs them: one line, a code, the status."""

    def __init__(self, code: str, why: str, http: int = 401) -> None:
        super().__init__(why)
        self.code, self.http = code, http


def kid_of(token: str) -> str:
    """The `kid` of the token's header (Unauthentic if it is no JWT, or not RS256)."""
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError:
        raise Unauthentic("bad_token", "the bearer token is not a JWT") from None
    if header.get("alg") != "RS256":
        raise Unauthentic("bad_token", "the token is not signed with RS256")
    kid = header.get("kid")
    if not isinstance(kid, str) or not kid:
        raise Unauthentic("bad_token", "the token names no signing key (kid)")
    return kid


def verify(
    token: str,
    keys: dict[str, Any],
    app_id: str,
    service_url: str | None,
    channel_id: str | None = None,
) -> dict[str, Any]:
    """The token's claims, checked as Bot Framework says (Unauthentic if they do not hold)."""
    kid = kid_of(token)
    found = [k for k in keys.get("keys") or [] if isinstance(k, dict) and k.get("kid") == kid]
    if not found:
        raise Unauthentic(
            "unknown_key", "the token is signed by a key the Bot Connector does not publish"
        )
    endorsed = found[0].get("endorsements")
    if isinstance(endorsed, list) and channel_id is not None and channel_id not in endorsed:
        raise Unauthentic(
            "not_endorsed", f"the signing key is not endorsed for {channel_id!r}", 403
        )
    try:
        key = jwt.PyJWK(found[0], algorithm="RS256")
        claims: dict[str, Any] = jwt.decode(
            token,
            key.key,
            algorithms=["RS256"],
            audience=app_id,
            issuer=ISSUER,
            leeway=LEEWAY,
            options={"require": ["exp", "iss", "aud"]},
        )
    except jwt.InvalidAudienceError:
        raise Unauthentic("wrong_audience", "the token is not for this bot's app id", 403) from None
    except jwt.InvalidIssuerError:
        raise Unauthentic(
            "wrong_issuer", "the token was not issued by the Bot Connector", 403
        ) from None
    except jwt.ExpiredSignatureError:
        raise Unauthentic("expired", "the token expired") from None
    except jwt.ImmatureSignatureError:
        raise Unauthentic("not_yet_valid", "the token is not valid yet") from None
    except jwt.InvalidSignatureError:
        raise Unauthentic("bad_signature", "the token's signature does not verify") from None
    except jwt.PyJWTError as e:
        raise Unauthentic("bad_token", f"the token does not verify ({type(e).__name__})") from None
    if service_url is None or claims.get("serviceUrl") != service_url:
        why = "the token's serviceUrl is not the activity's"
        raise Unauthentic("service_url_mismatch", why, 403)
    return claims


@dataclass
class _Fetched:
    keys: dict[str, Any]
    at: float


class BotKeys:
    """The Bot Connector's signing keys, fetched on demand and kept (thread-safe)."""

    def __init__(
        self, metadata_url: str, timeout: float, client: httpx.Client | None = None
    ) -> None:
        self.url, self.timeout = metadata_url, timeout
        self.client = client or httpx.Client(timeout=timeout, follow_redirects=False)
        self._lock = threading.Lock()
        self._have: _Fetched | None = None
        self._tried = -REFETCH_SECONDS  # monotonic time of the last fetch

    def for_kid(self, kid: str) -> dict[str, Any]:
        """A key set (JWKS document) holding `kid` if the Bot Connector publishes it; the one
        kept when it does not (verify then refuses). OSError/ValueError: none could be had."""
        with self._lock:
            now = time.monotonic()
            have = self._have
            fresh = have is not None and now - have.at < KEEP_SECONDS
            if have is not None and fresh and _holds(have.keys, kid):
                return have.keys
            if have is not None and fresh and now - self._tried < REFETCH_SECONDS:
                return have.keys  # fetched a moment ago: the kid is not there
            self._tried = now
            try:
                keys = self._fetch()
            except (OSError, ValueError, httpx.HTTPError) as e:
                if have is not None:
                    return have.keys
                raise OSError(f"the Bot Connector's keys could not be fetched: {e}") from None
            self._have = _Fetched(keys, now)
            return keys

    def _get(self, url: str) -> dict[str, Any]:
        r = self.client.get(url)
        if r.status_code != 200:
            raise ValueError(f"{url}: HTTP {r.status_code}")
        if len(r.content) > DOC_MAX:
            raise ValueError(f"{url}: over {DOC_MAX} bytes")
        doc = json.loads(r.content)
        if not isinstance(doc, dict):
            raise ValueError(f"{url}: not a JSON object")
        return doc

    def _fetch(self) -> dict[str, Any]:
        meta = self._get(self.url)
        uri = meta.get("jwks_uri")
        if not isinstance(uri, str) or not uri.startswith(("https://", "http://")):
            raise ValueError("the OpenID metadata names no jwks_uri")
        keys = self._get(uri)
        if not isinstance(keys.get("keys"), list):
            raise ValueError("the key set holds no keys")
        return {"keys": [k for k in keys["keys"] if isinstance(k, dict)]}

    def close(self) -> None:
        self.client.close()


def _holds(keys: dict[str, Any], kid: str) -> bool:
    return any(isinstance(k, dict) and k.get("kid") == kid for k in keys.get("keys") or [])
