"""The daemon's signing key: every answer the root core writes is sealed with it.

The private key is a PKCS#8 file only root can read (`decision_key_file`, default
`<state_dir>/decision-key`), made on the first start; its public half is written beside it
(`.pub`, readable by all) and handed to every resume in `DELTA_DECISION_KEYS`, with any older
keys still trusted (`decision_keys_trusted`, for a rotation or an HA fleet). The inbox process
never loads it: it runs as another user, from a fresh interpreter, and answers only through
the core. What is signed and how `delta` checks it: deltad/protocol/seal.py.
"""

from __future__ import annotations

import base64
import contextlib
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from deltad.protocol import InteractionRequest
from deltad.protocol.fsio import atomic_write
from deltad.protocol.seal import encode_key, key_id, message, statement, votes_message

MAX_KEY_BYTES = 4096


class KeyProblem(Exception):
    """The key file cannot be used (one line, naming it)."""


@dataclass(frozen=True)
class Sealer:
    private: Ed25519PrivateKey
    public: bytes  # raw, 32 bytes

    @classmethod
    def of(cls, private: Ed25519PrivateKey) -> Sealer:
        raw = private.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        return cls(private, raw)

    @property
    def public_text(self) -> str:
        return encode_key(self.public)

    def seal(self, req: InteractionRequest, doc: Mapping[str, Any]) -> dict[str, str]:
        """The `seal` field of answer document `doc` to `req`."""
        sig = self.private.sign(message(statement(req, doc)))
        return {"key": key_id(self.public), "sig": base64.b64encode(sig).decode()}

    def seal_votes(self, record: Mapping[str, Any]) -> dict[str, str]:
        """The `seal` of four eyes' record (approvals.json): a vote the agent wrote into it
        counts for nobody."""
        sig = self.private.sign(votes_message(record))
        return {"key": key_id(self.public), "sig": base64.b64encode(sig).decode()}


def load_or_create(path: Path) -> Sealer:
    """The key at `path`, made (0600, then its `.pub`) when there is none. Raises KeyProblem
    for a file that is not a regular file of this user's, is readable by others, or is not
    an Ed25519 key."""
    try:
        sealer = read_key(path)
    except FileNotFoundError:
        return _create(path)
    _write_public(path, sealer)
    return sealer


def problem_of(path: Path) -> str | None:
    """What `load_or_create` would refuse (`deltad check`), writing nothing."""
    try:
        read_key(path)
    except FileNotFoundError:
        return None
    except KeyProblem as e:
        return str(e)
    return None


def read_key(path: Path) -> Sealer:
    """Raises FileNotFoundError, or KeyProblem (see `load_or_create`)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise KeyProblem(f"decision key {path}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise KeyProblem(f"decision key {path}: not a regular file")
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise KeyProblem(
                f"decision key {path}: must belong to this user and be readable by nobody "
                "else (chmod 600)"
            )
        data = os.read(fd, MAX_KEY_BYTES + 1)
    finally:
        os.close(fd)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        key = None
    if len(data) > MAX_KEY_BYTES or not isinstance(key, Ed25519PrivateKey):
        raise KeyProblem(f"decision key {path}: not an Ed25519 private key in PEM")
    return Sealer.of(key)


def _create(path: Path) -> Sealer:
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        atomic_write(path, pem, mode=0o600)
    except OSError as e:
        raise KeyProblem(f"decision key {path}: cannot write it: {e.strerror}") from None
    # Read back: of two daemons of an HA fleet making the shared key at once, the one whose
    # file stayed is the key both use.
    return load_or_create(path)


def _write_public(path: Path, sealer: Sealer) -> None:
    pub = path.with_name(path.name + ".pub")
    text = sealer.public_text + "\n"
    try:
        if pub.read_text(encoding="ascii") == text:
            return
    except (OSError, UnicodeError):
        pass
    # A convenience for people (`delta` by hand): resumes get the key in their environment.
    with contextlib.suppress(OSError):
        atomic_write(pub, text.encode(), mode=0o644)
