"""Signed answer links: `/a/<token>` answers one question without a bearer token, for a person
reading a chat message. The token binds the request id, the workspace holding it and an
expiry under an HMAC key kept in the state dir (`link.key`, deltad/keys.py). A link is
single-use by construction: the answering path is a compare-and-set on the request id, so once
the question is answered every later use is refused (409), and after its expiry it is refused
(410) before anything is looked up."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from deltad import keys

KEY_NAME = keys.LINKS.name


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


def load_key(state_dir: Path) -> bytes:
    """The link key, made on first use (deltad/keys.py)."""
    return keys.load(state_dir, keys.LINKS)


def sign(key: bytes, request_id: str, workspace: str, ttl: float, now: float | None = None) -> str:
    expires = int((now if now is not None else time.time()) + ttl)
    payload = [request_id, expires, workspace]
    body = keys.b64(json.dumps(payload, separators=(",", ":")).encode())
    return f"{body}.{keys.b64(keys.sign(key, None, body))}"  # no purpose: as links always were


def verify(key: bytes, token: str, now: float | None = None) -> Link:
    body, _, mac = token.partition(".")
    try:
        if not keys.verify(key, keys.unb64(mac), None, body):
            raise BadLink("this link is not valid")
        # A link without its workspace (made before links named it) is not valid.
        request_id, expires, workspace = json.loads(keys.unb64(body))
    except (ValueError, TypeError):
        raise BadLink("this link is not valid") from None
    if not (
        isinstance(request_id, str) and isinstance(expires, int) and isinstance(workspace, str)
    ):
        raise BadLink("this link is not valid")
    if (now if now is not None else time.time()) >= expires:
        raise LinkExpired("this link has expired")
    return Link(request_id, workspace, expires)
