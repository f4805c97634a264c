"""Pages of a list served from the daemon's index: the cursor, the limit and the filters.

A cursor is the sort key of the last item a page looked at, base64url JSON: the next page is
everything below it, so items added or removed meanwhile never shift a page (a newer item
appears on no later page; a removed one is simply not there). Decisions here are pure."""

from __future__ import annotations

import base64
import binascii
import functools
import json
import math
import pwd
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from deltad.inbox.feed import Listed
from deltad.protocol.printable import show_path

from . import scopes

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
Kind = Literal["requests", "runs"]
# Per kind: the types of the key's parts (a question: created, workspace, request id; a
# run: run id, workspace).
KEY_TYPES: dict[Kind, tuple[type, ...]] = {"requests": (float, str, str), "runs": (str, str)}
Doc = TypeVar("Doc")


class BadPage(ValueError):
    """One line: why a page was refused (422)."""


def limit_of(limit: int) -> int:
    if not 1 <= limit <= MAX_LIMIT:
        raise BadPage(f"limit: between 1 and {MAX_LIMIT} (the default is {DEFAULT_LIMIT})")
    return limit


def encode(kind: Kind, key: tuple[Any, ...]) -> str:
    raw = json.dumps([kind, *key], separators=(",", ":")).encode()  # ASCII: \\u escapes
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode(kind: Kind, cursor: str | None) -> tuple[Any, ...] | None:
    """The key a cursor of this kind carries; BadPage for anything else."""
    if cursor is None:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        doc = json.loads(raw)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise BadPage("cursor: not one this server gave (take `next` as it is)") from None
    types = KEY_TYPES[kind]
    if not (isinstance(doc, list) and len(doc) == len(types) + 1 and doc[0] == kind):
        raise BadPage(f"cursor: not a cursor of /v1/{kind}")
    key = [
        float(v) if t is float and type(v) is int else v
        for t, v in zip(types, doc[1:], strict=True)
    ]
    if not all(type(v) is t for t, v in zip(types, key, strict=True)) or not all(
        math.isfinite(v) for v in key if type(v) is float
    ):
        raise BadPage(f"cursor: not a cursor of /v1/{kind}")
    return tuple(key)


def owner_uid(owner: str | None) -> int | None:
    """`?owner=` as a uid: a number is one, a name is looked up (an unknown name: BadPage)."""
    if owner is None:
        return None
    # isascii: "²" is a digit to str.isdigit but not to int(); a uid has at most 10 digits.
    if owner.isascii() and owner.isdigit() and len(owner) <= 10:
        return int(owner)
    try:
        return pwd.getpwnam(owner).pw_uid
    except (KeyError, ValueError):  # ValueError: a NUL byte in the name
        raise BadPage(f"owner: no user {owner!r} on this host") from None


@dataclass(frozen=True)
class Filters:
    """What a caller may see (its scopes) and asked for; None matches anything."""

    scopes: tuple[str, ...]
    workspace: str | None = None  # a glob, over the name as shown or as the file system has it
    owner: int | None = None
    run_id: str | None = None
    input_type: str | None = None  # questions
    status: str | None = None  # runs

    def keep(self, e: Listed) -> bool:
        ws = str(e.workspace)
        return (
            (self.owner is None or e.owner == self.owner)
            and (self.run_id is None or e.run_id == self.run_id)
            and (self.input_type is None or e.input_type == self.input_type)
            and (self.status is None or e.status == self.status)
            and scopes.allows_at(self.scopes, ws, e.real)
            and (not self.workspace or names_match(self.workspace, e.workspace))
        )


@functools.lru_cache(maxsize=16384)
def names_match(glob: str, ws: Path) -> bool:
    """A `?workspace=` glob matches the name as the API shows it, or as the file system has it
    (pure, so cached: a list filtered by one glob again costs a lookup per workspace)."""
    name = str(ws)
    shown = show_path(ws)
    return scopes.matches(glob, name) or (shown != name and scopes.matches(glob, shown))


def collect(
    entries: Iterable[Listed],
    keep: Callable[[Listed], bool],
    read: Callable[[Listed], Doc | None],
    limit: int,
) -> tuple[list[Doc], tuple[Any, ...] | None]:
    """Up to `limit` documents of the kept entries, in order, and the key to continue from
    (None: nothing kept is left). `read` gives None for an item that is gone or closed on the
    disk: it is skipped. At most 2 × limit are read, so a page of closed items comes back
    short, with a cursor, rather than reading the whole index."""
    docs: list[Doc] = []
    reads, last = 0, None
    for e in entries:
        if not keep(e):
            continue
        if len(docs) == limit or reads == 2 * limit:
            return docs, last
        reads, last = reads + 1, e.key
        doc = read(e)
        if doc is not None:
            docs.append(doc)
    return docs, None
