"""Decisions only the daemon can sign: the seal on an answer, and the rule that checks it.

A *gated* question (one that names respondents, needs more than one approval, or refuses the
owner's own approval) counts only an answer the daemon's answering path wrote: the root core
signs every `response.json` it writes with an Ed25519 key only it can read
(deltad/inbox/sealing.py), and `delta` checks that signature with the public key the daemon
hands each resume (`DELTA_DECISION_KEYS`), when it takes the answer *and* again whenever it
reads the answer back from the journal. The agent's tools run as the workspace's owner; they
can write a file or a journal line, never a signature (docs/delta.md, "Decisions only the
daemon can sign"). A plain question keeps the spec's file mailbox: any writer, as ever.

What is signed is the *statement*: `response.json` as written, without its `seal`, and with a
secret's answer left out (the journal keeps the statement; it never keeps a secret, so the
seal of a secret binds which question and who, not the value). The message is a fixed prefix
and the statement's canonical JSON (sorted keys, no whitespace, ASCII), so a signature for one
kind of document can never be read as another's. Pure but for `trusted_keys` (the environment).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from .kinds import on_timeout
from .models import InteractionRequest
from .questions import interpret_json, statement
from .replies import AnswerRejected, Reply

__all__ = [
    "counts",
    "gated",
    "message",
    "parse_keys",
    "problem",
    "statement",
    "trusted_keys",
    "votes_message",
    "votes_sealed",
]

PREFIX = b"deltad-decision-v1\0"
ALGORITHM = "ed25519"
ENV = "DELTA_DECISION_KEYS"  # "ed25519:BASE64[,ed25519:BASE64...]": set on every resume
# Where `delta`, started by hand, looks when the variable is unset: the public half of the
# key of a daemon installed by its systemd unit (StateDirectory=deltad).
DEFAULT_PUBLIC_FILE = Path("/var/lib/deltad/decision-key.pub")


class BadKey(ValueError):
    """A public key that is not `ed25519:` + 32 bytes in base64 (one line)."""


def gated(req: InteractionRequest) -> bool:
    """Does an answer to `req` count only when the daemon signed it?"""
    return bool(req.respondents) or req.approvals_required > 1 or not req.owner_may_approve


def canonical(doc: Any) -> bytes:
    return json.dumps(
        doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    ).encode()


def message(said: Mapping[str, Any]) -> bytes:
    return PREFIX + canonical(said)


VOTES_PREFIX = b"deltad-votes-v1\0"  # four eyes' record (inbox/ballots.py): never an answer


def votes_message(record: Mapping[str, Any]) -> bytes:
    return VOTES_PREFIX + canonical({k: v for k, v in record.items() if k != "seal"})


def votes_sealed(record: Mapping[str, Any], keys: list[bytes]) -> bool:
    """Was four eyes' record (approvals.json) written by the daemon, as it reads?"""
    seal = record.get("seal")
    if not isinstance(seal, dict) or not isinstance(sig := seal.get("sig"), str):
        return False
    try:
        raw = base64.b64decode(sig, validate=True)
    except (binascii.Error, ValueError):
        return False
    return verifies(keys, raw, votes_message(record))


def encode_key(raw: bytes) -> str:
    return f"{ALGORITHM}:{base64.b64encode(raw).decode()}"


def key_id(raw: bytes) -> str:
    """A short name of a public key, shown in the seal and in messages."""
    return base64.b32encode(raw[:10]).decode().lower()


def parse_keys(text: str) -> list[bytes]:
    """`ed25519:BASE64[,...]` (spaces, commas or newlines between) → raw public keys."""
    keys = []
    for word in text.replace(",", " ").split():
        algo, _, b64 = word.partition(":")
        try:
            raw = base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError):
            raw = b""
        if algo != ALGORITHM or len(raw) != 32:
            raise BadKey(f"not an {ALGORITHM} public key: {word[:60]!r}")
        keys.append(raw)
    return keys


def trusted_keys(env: Mapping[str, str] | None = None) -> list[bytes]:
    """The keys `delta` checks a seal with: `DELTA_DECISION_KEYS` (set by the daemon on every
    resume), else the default public key file; none when neither is there. Raises BadKey."""
    env = os.environ if env is None else env
    if (text := env.get(ENV)) is not None:
        return parse_keys(text)
    try:
        return parse_keys(DEFAULT_PUBLIC_FILE.read_text(encoding="ascii")[:4096])
    except (OSError, UnicodeError):
        return []


def signature_valid(keys: Iterable[bytes], sig: bytes, said: Mapping[str, Any]) -> bool:
    return verifies(keys, sig, message(said))


def verifies(keys: Iterable[bytes], sig: bytes, data: bytes) -> bool:
    """Does `sig` sign `data` under one of `keys` (raw Ed25519 public keys)?"""
    # Imported here: only a gated question's answer pays for loading the library.
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    for raw in keys:
        try:
            Ed25519PublicKey.from_public_bytes(raw).verify(sig, data)
            return True
        except (InvalidSignature, ValueError):
            continue
    return False


def _content(reply: Reply) -> tuple[Any, ...]:
    return (
        reply.outcome,
        reply.value,
        reply.key,
        [d.model_dump(mode="json") for d in reply.decisions],
    )


def problem(req: InteractionRequest, reply: Reply, keys: list[bytes]) -> str | None:
    """Why `reply` does not count as an answer to gated question `req` (None: it does).

    A timeout or a skip is the run's own: it counts when it says what the question's own rule
    says (`on_timeout`: its default, or a rejection), never more. Anything else must carry a
    seal over a statement about this very question that verifies with one of `keys` and says
    what the reply says."""
    if reply.outcome == "skipped":
        return None if not reply.decisions and reply.value is None else "a skip that decides"
    if reply.outcome == "timeout":
        rule = on_timeout(req)
        return None if _content(rule) == _content(reply) else "a timeout that is not the rule's"
    seal = reply.seal
    if not seal:
        return "it is not signed by deltad; this question is answered through deltad's inbox"
    said, sig = seal.get("statement"), seal.get("sig")
    if not isinstance(said, dict) or not isinstance(sig, str):
        return "its seal is damaged"
    if said.get("request_id") != req.request_id:
        return "its seal is for another question"
    if not keys:
        return (
            f"deltad's public key is not known here ({ENV} is unset and "
            f"{DEFAULT_PUBLIC_FILE} is missing): the daemon resumes this run"
        )
    try:
        raw = base64.b64decode(sig, validate=True)
        ok = signature_valid(keys, raw, said)
    except (binascii.Error, ValueError, TypeError):
        ok = False
    if not ok:
        return "its signature does not verify with deltad's key"
    if req.is_secret:
        return None
    try:
        signed = interpret_json(req, json.dumps(said))
    except AnswerRejected:
        return "what deltad signed does not answer this question"
    if _content(signed) != _content(reply):
        return "the answer is not the one deltad signed"
    return None


def counts(req: InteractionRequest, keys: list[bytes]) -> Callable[[dict[str, Any]], bool] | None:
    """For `journal.replied`: which recorded answers to `req` count (None: all do). An answer
    to a gated question without a seal that checks out was not the daemon's: the question is
    still open to people."""
    if not gated(req):
        return None

    def sealed(payload: dict[str, Any]) -> bool:
        try:
            reply = Reply.model_validate(payload.get("reply"))
        except ValueError:
            return False
        return problem(req, reply, keys) is None

    return sealed
