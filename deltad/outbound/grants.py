"""Reply addresses: the secret that lets a mail answer one question.

A reply address is `<local>+<id><mac>@<domain>`: `id` names a grant kept in the channel's
state dir (the question's request id, its workspace, the one recipient it was sent to, its
expiry) and `mac` is the HMAC-SHA256, under a key made like the signed links' (0600, in the
state dir: deltad/keys.py), of the id and everything the grant says, cut to 80 bits. Lower
case hex only, so no MTA's case folding changes it, and short enough for a local part (a
signed link carries the workspace's path: too long, and base64 is case-sensitive).

Single use: the first reply that answers claims the grant (a file made with O_EXCL naming the
message), durably, until the grant expires; a later reply with the same address is refused
as a replay. A grant outlives its expiry by `KEEP_AFTER` so a late reply is told "expired",
not "unknown". Pure checks (`check`) apart from the directory (`Grants`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from deltad import keys
from deltad.protocol import atomic_write_json
from deltad.protocol.printable import show_path, unshow

KEY_NAME = keys.REPLIES.name
ID_HEX = 16
MAC_HEX = 20  # hex digits of the signature kept: 80 bits
TOKEN = re.compile(rf"[0-9a-f]{{{ID_HEX + MAC_HEX}}}")
KEEP_AFTER = 30 * 86400.0  # seconds a grant is kept past its expiry (a late reply is told why)
GRANT_MAX = 4096  # bytes: a grant file is ours; anything bigger is not
PROMPT_KEPT = 200  # characters of the question's first line a grant keeps (to quote it)
MESSAGE_ID_KEPT = 250  # characters of a Message-ID kept (ours are under 100)


class Refused(Exception):
    """Why a reply address does not answer (one line; `code` for the log)."""

    code = "bad_address"


class Unknown(Refused):
    code = "unknown_address"


class Replayed(Refused):
    code = "replayed"


class AddressExpired(Refused):
    code = "address_expired"


@dataclass(frozen=True)
class Grant:
    id: str
    request_id: str
    workspace: str  # as `show_path` shows it (a name that is not UTF-8 escaped)
    recipient: str  # the one address it was sent to (lower case)
    expires: float  # unix time
    # The mail it was sent in (its Message-ID) and the question's first line, unsigned: what a
    # later mail to the same person (a reminder, the notice that it closed) threads to and
    # quotes. "" in a grant from before they were kept.
    message_id: str = ""
    prompt: str = ""

    def signed(self) -> bytes:
        return json.dumps(
            [self.id, self.request_id, self.workspace, self.recipient, int(self.expires)],
            separators=(",", ":"),
        ).encode()

    @property
    def path(self) -> Path:
        """The workspace, as the file system names it."""
        return Path(unshow(self.workspace))


def mac(key: bytes, grant: Grant) -> str:
    return keys.sign(key, None, grant.signed()).hex()[:MAC_HEX]  # no purpose: as always


def token(key: bytes, grant: Grant) -> str:
    return grant.id + mac(key, grant)


def check(key: bytes, grant: Grant | None, tok: str, now: float) -> Grant:
    """The grant `tok` stands for, if its MAC is right and it has not expired."""
    given = keys.unhex(tok[ID_HEX:])
    if (
        grant is None
        or given is None
        or not keys.verify(key, given, None, grant.signed(), size=MAC_HEX // 2)
    ):
        raise Unknown("this reply address is not one deltad gave out (or was mistyped)")
    if now >= grant.expires:
        raise AddressExpired("this reply address has expired: answer on the page instead")
    return grant


class Grants:
    """The grants and their claims, in `<dir>/grants/` and `<dir>/used/` (0700, files 0600)."""

    def __init__(self, channel_dir: Path) -> None:
        self.dir = channel_dir / "grants"
        self.used = channel_dir / "used"
        self.questions = channel_dir / "questions"  # each question's grant ids
        for d in (channel_dir, self.dir, self.used, self.questions):
            d.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.key = keys.load(channel_dir, keys.REPLIES)

    def issue(
        self,
        request_id: str,
        workspace: str | Path,
        recipient: str,
        expires: float,
        message_id: str = "",
        prompt: str = "",
    ) -> tuple[Grant, str]:
        """A new grant, on disk before its token is returned (`message_id`: of the mail it goes
        in; `prompt`: the question's, its first line kept)."""
        workspace = show_path(workspace)
        line = prompt.strip().splitlines()[0][:PROMPT_KEPT] if prompt.strip() else ""
        line = line.encode("utf-8", "backslashreplace").decode("utf-8")  # a lone surrogate
        g = Grant(
            secrets.token_hex(ID_HEX // 2),
            request_id,
            workspace,
            recipient.lower(),
            expires,
            message_id[:MESSAGE_ID_KEPT],
            line,
        )
        if len(json.dumps(asdict(g), indent=2, ensure_ascii=False).encode()) > GRANT_MAX - 16:
            g = replace(g, prompt="")  # a long workspace name: the grant must still load
        atomic_write_json(self.dir / f"{g.id}.json", asdict(g), 0o600)
        index = self._index(request_id, workspace)
        atomic_write_json(index, [*self._ids(index), g.id], 0o600)
        return g, token(self.key, g)

    def _index(self, request_id: str, workspace: str) -> Path:
        named = f"{workspace}\0{request_id}".encode("utf-8", "surrogatepass")
        key = hashlib.sha256(named).hexdigest()[:32]
        return self.questions / f"{key}.json"

    def _ids(self, index: Path) -> list[str]:
        try:
            ids = json.loads(index.read_bytes()[: GRANT_MAX * 64])
        except (OSError, ValueError):
            return []
        return [i for i in ids if isinstance(i, str)] if isinstance(ids, list) else []

    def load(self, tok: str) -> Grant | None:
        if not TOKEN.fullmatch(tok):
            return None
        try:
            fd = os.open(self.dir / f"{tok[:ID_HEX]}.json", os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return None
        with os.fdopen(fd, "rb") as f:
            data = f.read(GRANT_MAX + 1)
        try:
            doc = json.loads(data) if len(data) <= GRANT_MAX else None
            g = Grant(**doc) if isinstance(doc, dict) else None
            kept = (g.message_id, g.prompt) if g is not None else ("", "")
            return g if all(isinstance(v, str) for v in kept) else None
        except (ValueError, TypeError):
            return None

    def verify(self, tok: str, now: float) -> Grant:
        """The grant behind reply token `tok`; Refused (one line) if there is none, it is
        forged or expired. Not yet claimed: see `claim`."""
        return check(self.key, self.load(tok.lower()), tok.lower(), now)

    def claimed_by(self, grant: Grant) -> str | None:
        """The message that claimed `grant`, if one did."""
        try:
            return (self.used / grant.id).read_text()[:256]
        except OSError:
            return None

    def claim(self, grant: Grant, message: str) -> bool:
        """Claim `grant` for `message` (a Maildir file name), durably; False when another
        message has claimed it (a replay). The same message may claim again (a pass cut short
        by a crash runs it again)."""
        path = self.used / grant.id
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            return self.claimed_by(grant) == message
        with os.fdopen(fd, "w") as f:
            f.write(message)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(self.used)
        return True

    def release(self, grant: Grant) -> None:
        """A reply that did not answer (it did not fit): the address may be used again."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.used / grant.id)
        _fsync_dir(self.used)

    def for_request(self, request_id: str, workspace: str | Path) -> list[Grant]:
        """The grants given out for one question (to tell their people it closed)."""
        workspace = show_path(workspace)
        out = []
        for gid in self._ids(self._index(request_id, workspace)):
            g = self.load(gid + "0" * MAC_HEX)
            if g is not None and g.request_id == request_id and g.workspace == workspace:
                out.append(g)
        return out

    def prune(self, now: float) -> int:
        """Forget grants (and their claims) KEEP_AFTER past their expiry; how many went."""
        gone = 0
        for path in sorted(self.dir.glob("*.json")):
            g = self.load(path.stem + "0" * MAC_HEX)
            if g is None or now >= g.expires + KEEP_AFTER:
                for p in (path, self.used / path.stem):
                    with contextlib.suppress(FileNotFoundError):
                        p.unlink()
                gone += 1
        for index in sorted(self.questions.glob("*.json")):
            if not any((self.dir / f"{i}.json").exists() for i in self._ids(index)):
                with contextlib.suppress(FileNotFoundError):
                    index.unlink()
        return gone


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
