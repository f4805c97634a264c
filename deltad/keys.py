"""The daemon's HMAC keys and what they sign, in one place to review.

A key is a file of 32 random bytes, made on first use: 0600, written aside and linked in (a
reader beside never reads one half written, and the first maker's wins), never made or read
through a symlink, and refused unless a regular file. Each file keeps the form it has always
had, so a daemon upgraded in place accepts what it signed before:

    link.key      hex text   answer links (inbox/links.py), in the state dir
    session.key   hex text   web sessions' cookies and CSRF tokens (http/sessions.py), in the
                             inbox's directory, made by the inbox process
    reply.key     hex text   email reply addresses (outbound/grants.py), in the channel's dir
    executor.key  raw bytes  the tags that mark a job on an engine as this fleet's
                             (executors/remote.py); it may sit in a directory a fleet shares,
                             so it is refused unless this user's own, mode 0600

A signature is the HMAC-SHA256 of its parts joined by NUL, the purpose first where the kind has
one (a session's cookie and its CSRF token are signed with one key); links, reply addresses and
executor tags were signed without one and stay so. `verify` compares in constant time. Standard
Webhooks signing (outbound/webhooks.py) is a protocol of its own, not one of these.

A leaf: it imports nothing of deltad, so every layer (the executors, the inbox process) may.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import os
import re
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

SIZE = 32  # bytes of a key, and of a signature before any cut
MIN_RAW = 16  # bytes: a raw key file shorter than this is refused
HEX_MAX = 256  # bytes read of a hex key file
RAW_MAX = 4096
_HEX = re.compile(r"(?:[0-9a-f]{2})*")


class KeyUnusable(ValueError):
    """A key file that is there but cannot be used (one line; the caller names the file)."""


@dataclass(frozen=True)
class KeyFile:
    name: str
    raw: bool = False  # raw bytes (else hex text)
    strict: bool = False  # refused unless this user's own, mode 0600


LINKS = KeyFile("link.key")
SESSIONS = KeyFile("session.key")
REPLIES = KeyFile("reply.key")
EXECUTORS = KeyFile("executor.key", raw=True, strict=True)


def load(directory: Path, kind: KeyFile) -> bytes:
    """The key `kind` in `directory`, made on first use. OSError when the file cannot be made
    or opened (a symlink among them), KeyUnusable when it is not a key of this form."""
    path = directory / kind.name
    if not os.path.lexists(path):
        _make(path, kind)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if kind.strict and (
            not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077
        ):
            raise KeyUnusable("must be a file of this daemon's user, mode 0600")
        if not stat.S_ISREG(st.st_mode):
            raise KeyUnusable("not a regular file")
        data = os.read(fd, RAW_MAX if kind.raw else HEX_MAX)
    finally:
        os.close(fd)
    if kind.raw:
        if len(data) < MIN_RAW:
            raise KeyUnusable("too short (delete it to make anew)")
        return data
    try:
        return bytes.fromhex(data.decode())
    except ValueError:  # UnicodeDecodeError too
        raise KeyUnusable("not a key in hex (delete it to make anew)") from None


def _make(path: Path, kind: KeyFile) -> None:
    key = secrets.token_bytes(SIZE)
    tmp = path.with_name(f".{kind.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            os.write(fd, key if kind.raw else key.hex().encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        with contextlib.suppress(FileExistsError):  # the first maker's key wins
            os.link(tmp, path)
    finally:
        os.unlink(tmp)


def sign(key: bytes, purpose: str | None, *data: str | bytes) -> bytes:
    """HMAC-SHA256 of `purpose` (None: a kind signed without one) and `data`, joined by NUL.
    Names are bytes: a string is UTF-8, a name's undecodable bytes kept (surrogateescape)."""
    parts = [purpose, *data] if purpose is not None else list(data)
    msg = b"\0".join(p if isinstance(p, bytes) else _utf8(p) for p in parts)
    return hmac.new(key, msg, hashlib.sha256).digest()


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def verify(
    key: bytes, mac: bytes, purpose: str | None, *data: str | bytes, size: int = SIZE
) -> bool:
    """Whether `mac` is the signature of `data` (its first `size` bytes, for a kind that cuts
    it: nothing shorter is taken), compared in constant time."""
    return len(mac) == size and hmac.compare_digest(mac, sign(key, purpose, *data)[:size])


def b64(data: bytes) -> str:
    """URL-safe base64 without padding (a token's body and signature)."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unb64(text: str) -> bytes:
    """ValueError when `text` is not base64."""
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def unhex(text: str) -> bytes | None:
    """The bytes of lower-case hex as `hexdigest` writes it; None for anything else."""
    return bytes.fromhex(text) if _HEX.fullmatch(text) else None
