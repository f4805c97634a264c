"""Web sessions that survive a daemon restart: the cookie is the session, signed (HMAC-SHA256)
with a key kept in the state dir (`session.key`, 0600, made on first use). It carries the
token's name, a prefix of the token's digest (so a revoked, or revoked and re-added, token ends
its sessions at once), when it was issued, when it expires and a random id. The CSRF token is
derived from the cookie, so it too outlives a restart. A logout is remembered by id in
`sessions-closed.json` (0600, atomic replace) until the cookie would have expired anyway."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deltad.protocol import atomic_write_json

from .links import key_file

KEY_NAME = "session.key"
CLOSED_NAME = "sessions-closed.json"
DIGEST_PREFIX = 16  # hex characters of the token's SHA-256: enough to tell tokens apart
CLOSED_MAX = 10_000  # logouts remembered at most (oldest forgotten first)


@dataclass(frozen=True)
class Claims:
    name: str
    digest_prefix: str
    issued: int
    expires: int
    sid: str


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(key: bytes, purpose: bytes, body: str) -> bytes:
    return hmac.new(key, purpose + b"\0" + body.encode(), hashlib.sha256).digest()


# -- the pure core ------------------------------------------------------------------------------
def seal(key: bytes, claims: Claims) -> str:
    payload = [claims.name, claims.digest_prefix, claims.issued, claims.expires, claims.sid]
    body = _b64(json.dumps(payload, separators=(",", ":")).encode())
    return f"{body}.{_b64(_mac(key, b'session', body))}"


def unseal(key: bytes, cookie: str | None, now: float) -> Claims | None:
    """The cookie's claims if it is ours, untampered and not expired; else None."""
    if not cookie or len(cookie) > 1024:
        return None
    body, _, mac = cookie.partition(".")
    try:
        if not hmac.compare_digest(_mac(key, b"session", body), _unb64(mac)):
            return None
        name, prefix, issued, expires, sid = json.loads(_unb64(body))
    except (ValueError, TypeError):
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
    return Claims(name, prefix, issued, expires, sid)


def csrf_for(key: bytes, cookie: str) -> str:
    """The CSRF token of a session: only the server (the key) can compute it from the cookie,
    and the page reads it from `GET /v1/session`, which another site's page cannot."""
    return _b64(_mac(key, b"csrf", cookie))


def matches(claims: Claims, token_digest: str) -> bool:
    """Whether the session was opened with the token whose digest this is."""
    return hmac.compare_digest(token_digest[:DIGEST_PREFIX], claims.digest_prefix)


# -- the shell: the key file and the logouts ------------------------------------------------------
def load_key(state_dir: Path) -> bytes:
    """The session key, made on first use (as the links' key is)."""
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    return key_file(state_dir / KEY_NAME)


class Sessions:
    """Opens and checks session cookies; `closed` (logouts) is kept in a file when a state dir
    is given, in memory otherwise (in-process tests)."""

    def __init__(self, key: bytes, ttl: float, closed_path: Path | None = None) -> None:
        self.key, self.ttl, self.closed_path = key, ttl, closed_path
        self._lock = threading.Lock()
        self._closed: dict[str, int] = self._load_closed()

    def open(self, name: str, token_digest: str, now: float | None = None) -> tuple[str, str]:
        """A new session cookie for this token, and its CSRF token."""
        issued = int(now if now is not None else time.time())
        claims = Claims(name, token_digest[:DIGEST_PREFIX], issued, issued + int(self.ttl), _sid())
        cookie = seal(self.key, claims)
        return cookie, csrf_for(self.key, cookie)

    def get(self, cookie: str | None) -> Claims | None:
        claims = unseal(self.key, cookie, time.time())
        if claims is None:
            return None
        with self._lock:
            return None if claims.sid in self._closed else claims

    def csrf(self, cookie: str) -> str:
        return csrf_for(self.key, cookie)

    def close(self, cookie: str | None) -> None:
        claims = unseal(self.key, cookie, time.time())
        if claims is None:
            return
        now = int(time.time())
        with self._lock:
            live = {s: e for s, e in self._closed.items() if e > now}
            live[claims.sid] = claims.expires
            self._closed = dict(sorted(live.items(), key=lambda kv: kv[1])[-CLOSED_MAX:])
            if self.closed_path is not None:
                atomic_write_json(self.closed_path, self._closed, 0o600)

    def _load_closed(self) -> dict[str, int]:
        if self.closed_path is None:
            return {}
        try:
            fd = os.open(self.closed_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return {}
        with os.fdopen(fd, "rb") as f:
            try:
                doc: Any = json.loads(f.read(1 << 22))
            except ValueError:
                doc = {}  # a torn file cannot happen (atomic replace); a foreign one is ignored
        if not isinstance(doc, dict):
            return {}
        now = time.time()
        return {s: e for s, e in doc.items() if isinstance(e, int) and e > now}


def _sid() -> str:
    return secrets.token_urlsafe(12)
