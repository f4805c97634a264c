"""Web sessions that survive a daemon restart: the cookie is the session, signed (HMAC-SHA256)
with a key kept in the state dir (`session.key`, 0600, made on first use). It carries the
token's name, a prefix of the token's digest (so a revoked, or revoked and re-added, token ends
its sessions at once), when it was issued, when it expires and a random id. The CSRF token is
derived from the cookie, so it too outlives a restart. A person signed in through OIDC
(deltad/http/oidc.py) gets the same cookie with their `oidc:` name, no token digest, and the
names and groups their ID token gave. `session_ttl_seconds` is applied at
each check to when a session was issued, so lowering it shortens sessions already out.

A logout is remembered by id in `sessions-closed.json` (0600, atomic replace) until the cookie
would have expired anyway, at most `CLOSED_PER_TOKEN` ids per token: past that, the token's
oldest remembered logout is not forgotten but folded into a cut-off (every session of that
token issued at or before it is refused), so no number of logouts brings a closed one back."""

from __future__ import annotations

import hmac
import json
import os
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deltad import keys, wire
from deltad.protocol import atomic_write_json

KEY_NAME = keys.SESSIONS.name
CLOSED_NAME = wire.SESSIONS_CLOSED_NAME
DIGEST_PREFIX = 16  # hex characters of the token's SHA-256: enough to tell tokens apart
COOKIE_MAX = 4000  # characters: a browser keeps a cookie of about 4 KiB (an OIDC person's groups)
CLOSED_PER_TOKEN = 100  # logout ids kept per token; older ones become the token's cut-off


@dataclass(frozen=True)
class Claims:
    name: str
    digest_prefix: str
    issued: int
    expires: int
    sid: str
    # A person signed in through OIDC (name `oidc:...`, no token: digest_prefix ""): the other
    # names they answer to and their groups, as the provider's ID token said at sign-in.
    also: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()


# -- the pure core ------------------------------------------------------------------------------
def seal(key: bytes, claims: Claims) -> str:
    payload: list[Any] = [
        claims.name,
        claims.digest_prefix,
        claims.issued,
        claims.expires,
        claims.sid,
    ]
    if claims.also or claims.groups:
        payload.append({"also": list(claims.also), "groups": list(claims.groups)})
    body = keys.b64(json.dumps(payload, separators=(",", ":")).encode())
    return f"{body}.{keys.b64(keys.sign(key, 'session', body))}"


def unseal(key: bytes, cookie: str | None, now: float) -> Claims | None:
    """The cookie's claims if it is ours, untampered and not expired; else None."""
    if not cookie or len(cookie) > COOKIE_MAX:
        return None
    body, _, mac = cookie.partition(".")
    try:
        if not keys.verify(key, keys.unb64(mac), "session", body):
            return None
        name, prefix, issued, expires, sid, *more = json.loads(keys.unb64(body))
    except (ValueError, TypeError):
        return None
    extra = more[0] if len(more) == 1 and isinstance(more[0], dict) else {}
    also, groups = extra.get("also", []), extra.get("groups", [])
    if len(more) > 1 or not all(
        isinstance(v, list) and all(isinstance(x, str) for x in v) for v in (also, groups)
    ):
        return None
    if not (
        isinstance(name, str)
        and isinstance(prefix, str)
        and isinstance(issued, int)
        and isinstance(expires, int)
        and isinstance(sid, str)
    ):
        return None
    if now >= expires:
        return None
    return Claims(name, prefix, issued, expires, sid, tuple(also), tuple(groups))


def csrf_for(key: bytes, cookie: str) -> str:
    """The CSRF token of a session: only the server (the key) can compute it from the cookie,
    and the page reads it from `GET /v1/session`, which another site's page cannot."""
    return keys.b64(keys.sign(key, "csrf", cookie))


def matches(claims: Claims, token_digest: str) -> bool:
    """Whether the session was opened with the token whose digest this is."""
    return hmac.compare_digest(token_digest[:DIGEST_PREFIX], claims.digest_prefix)


# -- the shell: the key file and the logouts ------------------------------------------------------
def load_key(state_dir: Path) -> bytes:
    """The session key, made on first use (deltad/keys.py)."""
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    return keys.load(state_dir, keys.SESSIONS)


@dataclass(frozen=True)
class Closed:
    """The logouts: ids (sid -> token name, issued, expires), and per token a cut-off (every
    session of that token issued at or before it is closed) with when the last session it
    stands for expires."""

    ids: dict[str, tuple[str, int, int]]
    before: dict[str, tuple[int, int]]  # name -> (issued at or before, until)

    def shut(self, c: Claims) -> bool:
        return c.sid in self.ids or c.issued <= self.before.get(c.name, (-1, 0))[0]

    def add(self, c: Claims, now: int) -> Closed:
        """With `c`'s logout: what had expired dropped (by its own expiry: a TTL raised later
        must not bring a logout back), and per token at most CLOSED_PER_TOKEN ids, the oldest
        folded into the cut-off, never forgotten."""
        ids = {s: v for s, v in self.ids.items() if v[2] > now}
        ids[c.sid] = (c.name, c.issued, c.expires)
        before = {n: cut for n, cut in self.before.items() if cut[1] > now}
        mine = sorted((v[1], s) for s, v in ids.items() if v[0] == c.name)
        if not c.name:
            mine = []  # ids carried over from the old file (no name): they only age out
        newest = mine[-1][0] if mine else 0
        for issued, sid in mine[: max(0, len(mine) - CLOSED_PER_TOKEN)]:
            if issued >= newest:
                # Never fold the newest second: sessions are issued by the second, and a cut-off
                # at this second would close the ones its token is issued next (many logouts
                # within one second stay ids until a later second folds them).
                break
            cut, until = before.get(c.name, (-1, 0))
            before[c.name] = (max(cut, issued), max(until, ids[sid][2]))
            del ids[sid]
        return Closed(ids, before)

    def document(self) -> dict[str, Any]:
        return {
            "ids": {s: list(v) for s, v in self.ids.items()},
            "before": {n: list(cut) for n, cut in self.before.items()},
        }


def _ints(v: object, n: int) -> bool:
    return isinstance(v, list) and len(v) == n and all(isinstance(x, int) for x in v)


def closed_from(doc: Any, now: float) -> Closed:
    """The logouts a file holds (what does not fit the form is skipped)."""
    if not isinstance(doc, dict):
        return Closed({}, {})
    if "ids" not in doc:  # the old form, {sid: expires}: kept by id until they expire
        old = {s: ("", e, e) for s, e in doc.items() if isinstance(e, int) and e > now}
        return Closed(old, {})
    ids: dict[str, tuple[str, int, int]] = {}
    raw_ids = doc.get("ids", {})
    for sid, v in raw_ids.items() if isinstance(raw_ids, dict) else ():
        named = isinstance(v, list) and len(v) == 3 and isinstance(v[0], str)
        if named and _ints(v[1:], 2) and v[2] > now:
            ids[sid] = (v[0], v[1], v[2])
    raw_before = doc.get("before", {})
    before = {
        n: (cut[0], cut[1])
        for n, cut in (raw_before.items() if isinstance(raw_before, dict) else ())
        if isinstance(n, str) and _ints(cut, 2) and cut[1] > now
    }
    return Closed(ids, before)


class Sessions:
    """Opens and checks session cookies; `closed` (logouts) is kept in a file when a state dir
    is given, in memory otherwise (in-process tests)."""

    def __init__(self, key: bytes, ttl: float, closed_path: Path | None = None) -> None:
        self.key, self.ttl, self.closed_path = key, ttl, closed_path
        self._lock = threading.Lock()
        self._closed = self._load_closed()

    def open(
        self,
        name: str,
        token_digest: str,
        now: float | None = None,
        also: tuple[str, ...] = (),
        groups: tuple[str, ...] = (),
    ) -> tuple[str, str]:
        """A new session cookie for this token (or OIDC person: `token_digest` ""), and its
        CSRF token."""
        issued = int(now if now is not None else time.time())
        claims = Claims(
            name, token_digest[:DIGEST_PREFIX], issued, issued + int(self.ttl), _sid(), also, groups
        )
        cookie = seal(self.key, claims)
        return cookie, csrf_for(self.key, cookie)

    def get(self, cookie: str | None, now: float | None = None) -> Claims | None:
        claims = self._live(cookie, time.time() if now is None else now)
        if claims is None:
            return None
        with self._lock:
            return None if self._closed.shut(claims) else claims

    def _live(self, cookie: str | None, now: float) -> Claims | None:
        """Sealed by us and within both its own expiry and the TTL configured now."""
        claims = unseal(self.key, cookie, now)
        if claims is None or now >= claims.issued + self.ttl:
            return None
        return claims

    def csrf(self, cookie: str) -> str:
        return csrf_for(self.key, cookie)

    def close(self, cookie: str | None, now: float | None = None) -> None:
        at = time.time() if now is None else now
        claims = self._live(cookie, at)
        if claims is None:
            return
        with self._lock:
            self._closed = self._closed.add(claims, int(at))
            if self.closed_path is not None:
                atomic_write_json(self.closed_path, self._closed.document(), 0o600)

    def _load_closed(self) -> Closed:
        if self.closed_path is None:
            return Closed({}, {})
        try:
            fd = os.open(self.closed_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return Closed({}, {})
        with os.fdopen(fd, "rb") as f:
            try:
                doc: Any = json.loads(f.read(1 << 22))
            except ValueError:
                doc = {}  # a torn file cannot happen (atomic replace); a foreign one is ignored
        return closed_from(doc, time.time())


def _sid() -> str:
    return secrets.token_urlsafe(12)
