"""Bearer tokens: `deltad token add|list|revoke`. Only a token's SHA-256 is stored (the token is
32 random bytes, so a slow hash buys nothing), in `tokens.json` in the state dir, 0600. The
server re-reads the file when it changes, so an added or revoked token counts at once; a file
that is over `FILE_MAX`, not JSON or not a token file is refused in one log line (once per
change) and the last good table keeps serving."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import re
import secrets
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import structlog

from deltad.inbox.scopes import ALL, GlobError, check, normal
from deltad.protocol import atomic_write_json, iso, utcnow

# `metrics`: may read /metrics and nothing else (Prometheus' credentials_file).
Role = Literal["reader", "answerer", "admin", "metrics"]
ROLES: tuple[Role, ...] = ("reader", "answerer", "admin", "metrics")
TOKENS_NAME = "tokens.json"
PREFIX = "dlt_"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
FILE_MAX = 4 * 1024 * 1024  # bytes: some 10,000 tokens; anything bigger is not ours
log = structlog.get_logger("deltad.http")


class TokenError(Exception):
    """A one-line reason a token command cannot do what was asked."""


@dataclass(frozen=True)
class Identity:
    name: str
    role: Role
    scopes: tuple[str, ...]
    groups: tuple[str, ...] = ()  # for questions naming respondents as group:NAME
    # Who holds the token (`--person`; default its name): four eyes counts people, so two
    # tokens of one person are one vote, and `owner_may_approve` compares the owner's user.
    person: str = ""
    # Other names the caller answers to (a person signed in through OIDC: `oidc:<sub>` beside
    # `oidc:<email>`), for questions naming respondents.
    also: tuple[str, ...] = ()

    def can_answer(self) -> bool:
        return self.role in ("answerer", "admin")

    @property
    def voter(self) -> str:
        return self.person or self.name


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class TokenStore:
    """The tokens in `directory` (the inbox's directory under the state dir). `owner`: the
    only uid the file may belong to (the core passes its own: the inbox process can write in
    that directory, and a token file it made must never count)."""

    def __init__(self, directory: Path, owner: int | None = None) -> None:
        self.path = directory / TOKENS_NAME
        self.owner = owner
        self._lock = threading.Lock()
        self._seen: tuple[int, int, int] | None = None
        self._by_digest: dict[str, Identity] = {}

    # -- the commands -----------------------------------------------------------------------------
    def add(
        self,
        name: str,
        scopes: list[str],
        role: Role,
        groups: tuple[str, ...] = (),
        person: str | None = None,
    ) -> str:
        for n in (name, *groups, *([person] if person is not None else [])):
            if not NAME.fullmatch(n):
                raise TokenError(f"{n!r}: a name is letters, digits and . _ @ - (up to 64)")
        for s in scopes:
            if normal(s.replace("*", "x").replace("?", "x")) is None:
                raise TokenError(f"scope {s!r}: must be an absolute path glob with no . or ..")
            try:
                check(s)
            except GlobError as e:
                raise TokenError(f"scope {s[:80]!r}: {e}") from None
        doc = self._read()
        if name in doc:
            raise TokenError(f"a token named {name} exists (revoke it first)")
        token = PREFIX + secrets.token_urlsafe(32)
        doc[name] = {
            "sha256": digest(token),
            "role": role,
            "scopes": scopes or [ALL],
            "created_at": iso(utcnow()),
            **({"groups": list(groups)} if groups else {}),
            **({"person": person} if person is not None and person != name else {}),
        }
        self._write(doc)
        return token

    def list(self) -> list[dict[str, Any]]:
        return [
            {
                "name": n,
                "role": d["role"],
                "scopes": d["scopes"],
                "groups": d.get("groups", []),
                "person": d.get("person", n),
                "created_at": d.get("created_at", ""),
            }
            for n, d in sorted(self._read().items())
        ]

    def revoke(self, name: str) -> None:
        doc = self._read()
        if doc.pop(name, None) is None:
            raise TokenError(f"no token named {name}")
        self._write(doc)

    # -- the server -------------------------------------------------------------------------------
    def verify(self, token: str) -> Identity | None:
        self._refresh()
        wanted = digest(token)
        with self._lock:
            for d, who in self._by_digest.items():
                if hmac.compare_digest(d, wanted):
                    return who
        return None

    def by_name(self, name: str) -> tuple[str, Identity] | None:
        """The digest and identity of the token named so (a web session names its token)."""
        self._refresh()
        with self._lock:
            return next(((d, w) for d, w in self._by_digest.items() if w.name == name), None)

    def _refresh(self) -> None:
        try:
            st = os.stat(self.path)
            # An atomic replace is a new inode: a revoke within one mtime tick still counts.
            seen: tuple[int, int, int] | None = (st.st_ino, st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            seen = None
        with self._lock:
            if seen == self._seen:
                return
        try:
            doc = self._read() if seen else {}
        except TokenError as e:
            # Once per change of the file, not per request; what was good keeps serving.
            log.error("tokens_refused", error=str(e), kept=len(self._by_digest))
            with self._lock:
                self._seen = seen
            return
        table = {
            d["sha256"]: Identity(
                n, d["role"], tuple(d["scopes"]), tuple(d.get("groups") or ()), d.get("person", "")
            )
            for n, d in doc.items()
        }
        with self._lock:
            self._by_digest, self._seen = table, seen

    # -- the file ---------------------------------------------------------------------------------
    def _read(self) -> dict[str, dict[str, Any]]:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return {}
        except OSError as e:
            raise TokenError(f"{self.path}: {e.strerror}") from None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            # 0640 is its mode where the inbox runs as another user (its group reads it).
            if st.st_mode & 0o037:
                raise TokenError(f"{self.path} is readable by others; chmod 600 it")
            if self.owner is not None and st.st_uid != self.owner:
                raise TokenError(
                    f"{self.path} is not owned by uid {self.owner}: not used (deltad token did "
                    "not make it; remove it, then add the tokens again)"
                )
            if st.st_size > FILE_MAX:
                raise TokenError(f"{self.path} is over {FILE_MAX // (1024 * 1024)} MiB")
            try:
                doc = json.loads(f.read(FILE_MAX + 1))
            except ValueError:
                raise TokenError(f"{self.path} is not a token file (not JSON)") from None
        why = malformed(doc)
        if why is not None:
            raise TokenError(f"{self.path} is not a token file ({why})")
        table: dict[str, dict[str, Any]] = doc
        return table

    def _write(self, doc: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        group = shared_group(self.path.parent)
        if group is None:
            atomic_write_json(self.path, doc, 0o600)
            return
        # Root writing for an inbox that runs as another user: root's file, 0640 to the
        # inbox's group, set before it takes the name (no moment it is unreadable).
        fd, tmp = tempfile.mkstemp(prefix=".tokens.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write((json.dumps(doc, indent=2) + "\n").encode())
                os.fchown(f.fileno(), 0, group)
                os.fchmod(f.fileno(), 0o640)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


def shared_group(directory: Path) -> int | None:
    """The group of an inbox directory that root shares with the inbox's user (its mode is
    1770: the inbox makes its own files there, and cannot replace root's); None if this is
    not root writing into one."""
    if os.geteuid() != 0:
        return None
    try:
        st = os.lstat(directory)
    except OSError:
        return None
    return (
        st.st_gid if st.st_uid == 0 and st.st_gid != 0 and st.st_mode & 0o1070 == 0o1070 else None
    )


def malformed(doc: object) -> str | None:
    """Why a parsed tokens.json is not one (every entry as `add` writes it), or None."""
    if not isinstance(doc, dict):
        return "not an object"
    for name, d in doc.items():
        if not isinstance(d, dict):
            return f"{name[:64]!r} is not an object"
        if not isinstance(d.get("sha256"), str) or d.get("role") not in ROLES:
            return f"{name[:64]!r} has no sha256 or role"
        for key, absent in (("scopes", None), ("groups", [])):
            v = d.get(key, absent)
            if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                return f"{name[:64]!r}: {key} is not a list of strings"
        for key in ("created_at", "person"):
            if not isinstance(d.get(key, ""), str):
                return f"{name[:64]!r}: {key} is not a string"
    return None
