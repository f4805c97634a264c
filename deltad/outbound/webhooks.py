"""Standard Webhooks (https://www.standardwebhooks.com/): the headers of one delivery attempt.

`webhook-id` names the delivery (the same on every attempt, so receivers dedupe on it),
`webhook-timestamp` is the attempt's unix time, and `webhook-signature` is
`v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`. A receiver refuses a timestamp too far
from its clock, so a captured delivery cannot be replayed later. Pure functions only.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac

PREFIX = "whsec_"


class SecretError(ValueError):
    """The signing secret cannot be used (one line, naming why)."""


def signing_key(secret: bytes) -> bytes:
    """The HMAC key a secret stands for: `whsec_<base64>` is decoded (the spec's form, what
    the `standardwebhooks` packages take); anything else is used as raw bytes."""
    if secret.startswith(PREFIX.encode()):
        try:
            key = base64.b64decode(secret[len(PREFIX) :], validate=True)
        except (binascii.Error, ValueError):
            raise SecretError("a whsec_ secret must be base64 after the prefix") from None
    else:
        key = secret
    if not key:
        raise SecretError("the signing secret is empty")
    return key


def signature(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def headers(
    msg_id: str, timestamp: int, body: bytes, key: bytes | None, event: str
) -> dict[str, str]:
    """Everything one attempt sends besides the body; unsigned without a key."""
    out = {
        "Content-Type": "application/json",
        "User-Agent": "deltad",
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "X-Deltad-Event": event,
    }
    if key is not None:
        out["webhook-signature"] = signature(key, msg_id, timestamp, body)
    return out
