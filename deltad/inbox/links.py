"""Signed answer links: `/a/<token>` answers one question without a bearer token, for a person
reading a chat message. The token binds the request id, the workspace holding it and an
expiry under an HMAC key kept in
the state dir (0600). A link is single-use by construction: the answering path is a
compare-and-set on the request id, so once the question is answered every later use is refused
(409), and after its expiry it is refused (410) before anything is looked up."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

KEY_NAME = "link.key"


class BadLink(Exception):
    code = "bad_link"
    http = 404


class LinkExpired(BadLink):
    code = "link_expired"
    http = 410


@dataclass(frozen=True)
class Link:
    request_id: str
    workspace: str  # a request id names a question only within its workspace
    expires: int


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def load_key(state_dir: Path) -> bytes:
    """The link key, made on first use."""
    return key_file(state_dir / KEY_NAME)


def key_file(path: Path) -> bytes:
    """A 32-byte HMAC key kept in `path`, made on first use (0600, O_EXCL: two makers never
    disagree; never through a symlink). The links' and the sessions' keys."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(32).hex().encode())
            f.flush()
            os.fsync(f.fileno())
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        return bytes.fromhex(f.read(256).decode())


def sign(key: bytes, request_id: str, workspace: str, ttl: float, now: float | None = None) -> str:
    expires = int((now if now is not None else time.time()) + ttl)
    payload = [request_id, expires, workspace]
    body = _b64(json.dumps(payload, separators=(",", ":")).encode())
    mac = hmac.new(key, body.encode(), hashlib.sha256).digest()
    return f"{body}.{_b64(mac)}"


def verify(key: bytes, token: str, now: float | None = None) -> Link:
    body, _, mac = token.partition(".")
    try:
        good = hmac.new(key, body.encode(), hashlib.sha256).digest()
        if not hmac.compare_digest(good, _unb64(mac)):
            raise BadLink("this link is not valid")
        # A link without its workspace (made before links named it) is not valid.
        request_id, expires, workspace = json.loads(_unb64(body))
    except (ValueError, TypeError):
        raise BadLink("this link is not valid") from None
    if not (
        isinstance(request_id, str) and isinstance(expires, int) and isinstance(workspace, str)
    ):
        raise BadLink("this link is not valid")
    if (now if now is not None else time.time()) >= expires:
        raise LinkExpired("this link has expired")
    return Link(request_id, workspace, expires)
