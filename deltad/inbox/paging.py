"""Pages of a list served from the daemon's index: the cursor, the limit and the filters.

A cursor is the sort key of the last item a page looked at, base64url JSON: the next page is
everything below it, so items added or removed meanwhile never shift a page (a newer item
appears on no later page; a removed one is simply not there). Decisions here are pure."""

from __future__ import annotations

import base64
import binascii
import functools
import heapq
import json
import math
import pwd
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from deltad.inbox import scopes
from deltad.inbox.feed import Index, Listed
from deltad.protocol.printable import show_path

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
Kind = Literal["requests", "runs", "requests:oldest", "requests:deadline"]
# Per kind (a list, and a question list's sort): the types of the key's parts (a question:
# created, workspace, request id, or by deadline: expires_at, workspace, request id; a run:
# run id, workspace). The sort is in the cursor, so a cursor of one sort is refused by another.
KEY_TYPES: dict[Kind, tuple[type, ...]] = {
    "requests": (float, str, str),
    "requests:oldest": (float, str, str),
    "requests:deadline": (float, str, str),
    "runs": (str, str),
}
Sort = Literal["newest", "oldest", "deadline"]
SORTS: dict[Sort, Kind] = {
    "newest": "requests",
    "oldest": "requests:oldest",
    "deadline": "requests:deadline",
}
# A question with no deadline sorts after every one with one (a finite key, for the cursor's
# JSON): 2**53 s is far beyond any date a request can carry (year 9999 is 2.5e11).
NO_DEADLINE = float(2**53)
SORT_DOC = (
    "newest: newest question first (the default); oldest: waiting longest first; deadline: "
    "the soonest `expires_at` first, questions without one last. `next` continues the same "
    "sort (a cursor of another sort is 422)."
)
OLDER_DOC = (
    "Only questions asked at least this long ago: a duration like 90s, 10m, 1h30m or 2d (a "
    "number needs its unit; at most 366d)."
)
DUE_DOC = (
    "Only questions with a deadline (`expires_at`) at most this far ahead, or already passed "
    "and not yet acted on: a duration like 10m."
)
MINE_DOC = (
    "Only the questions that name the caller: it (any of its names: a person signed in "
    "through OIDC is `oidc:<email>` and `oidc:<sub>`) or one of its groups (`group:NAME`) is "
    "among the question's `respondents`, or the question was handed to it (`delegations`) or "
    "escalated to it (`follow_up.escalated`), and its role may answer. A question with no "
    "respondents (anyone in scope may answer it) is nobody's in particular: not listed."
)
MAX_DURATION = 366 * 86400.0
_DURATION = re.compile(r"([0-9]{1,9}(?:\.[0-9]{1,6})?)([smhd])")
_UNIT = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
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
        raise BadPage(f"cursor: not a cursor of /v1/{_shown(kind)}")
    key = [
        float(v) if t is float and type(v) is int else v
        for t, v in zip(types, doc[1:], strict=True)
    ]
    if not all(type(v) is t for t, v in zip(types, key, strict=True)) or not all(
        math.isfinite(v) for v in key if type(v) is float
    ):
        raise BadPage(f"cursor: not a cursor of /v1/{_shown(kind)}")
    return tuple(key)


def _shown(kind: Kind) -> str:
    name, _, sort = kind.partition(":")
    shown = f"{name}?sort={sort}" if sort else name
    return f"{shown} (a cursor continues the sort it came from)" if name == "requests" else shown


def sort_of(sort: str | None) -> Sort:
    """`?sort=`: newest (default), oldest or deadline; BadPage for anything else."""
    for name in SORTS:
        if sort in (None, name):
            return name
    raise BadPage("sort: newest (the default), oldest or deadline")


def duration(name: str, text: str | None) -> float | None:
    """A duration parameter (`90s`, `10m`, `1h30m`, `2d`) in seconds; None if absent; BadPage
    for anything else. A bare number is refused: `due_within=10` read as seconds answered an
    empty list where ten minutes was meant."""
    if text is None:
        return None
    raw = text.strip()
    forms = f"{name}: a duration like 90s, 10m, 1h30m or 2d, not {text[:40]!r}"
    if re.fullmatch(r"[0-9]{1,9}(?:\.[0-9]{1,6})?", raw):
        raise BadPage(f"{forms} (a number needs its unit: {raw}s, {raw}m, {raw}h or {raw}d)")
    parts = _DURATION.findall(raw)
    if not raw or "".join(n + u for n, u in parts) != raw:
        raise BadPage(forms)
    seconds = sum(float(n) * _UNIT[u] for n, u in parts)
    if not 0 < seconds <= MAX_DURATION:
        raise BadPage(f"{name}: more than 0 and at most 366d")
    return seconds


def deadline_key(e: Listed) -> tuple[float, str, str]:
    """Where a question sorts by deadline: soonest first, then workspace and request id."""
    return (
        e.deadline if e.deadline is not None else NO_DEADLINE,
        str(e.workspace),
        e.request_id or "",
    )


def soonest(
    entries: Iterable[Listed],
    keep: Callable[[Listed], bool],
    after: tuple[Any, ...] | None,
    limit: int,
) -> list[Listed]:
    """The kept questions after `after` by deadline, soonest first: enough of them for a page
    (`collect` reads at most 2 × limit, and one more says there is more). The index keeps no
    deadline order, so this is one pass over the kept ones and a heap of 2 × limit + 1: memory
    bounded by the page, time by the index, as any filter's."""
    return heapq.nsmallest(
        2 * limit + 1,
        (e for e in entries if keep(e) and (after is None or deadline_key(e) > after)),
        key=deadline_key,
    )


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
    asked_before: float | None = None  # questions asked at or before (`older_than`)
    due_by: float | None = None  # questions with a deadline at or before (`due_within`)
    # `?mine=true`: whether the question names the caller (handlers.py reads it from the
    # disk, so it is asked last, of what every other filter kept). Applied here, before a
    # page is cut, as every filter is: a page and its cursor see the same list.
    mine: Callable[[Listed], bool] | None = None

    def keep(self, e: Listed) -> bool:
        ws = str(e.workspace)
        return (
            (self.owner is None or e.owner == self.owner)
            and (self.asked_before is None or (e.created or 0.0) <= self.asked_before)
            and (self.due_by is None or (e.deadline is not None and e.deadline <= self.due_by))
            and (self.run_id is None or e.run_id == self.run_id)
            and (self.input_type is None or e.input_type == self.input_type)
            and (self.status is None or e.status == self.status)
            and scopes.allows_at(self.scopes, ws, e.real)
            and (not self.workspace or names_match(self.workspace, e.workspace))
            and (self.mine is None or self.mine(e))
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
    key: Callable[[Listed], tuple[Any, ...]] = lambda e: e.key,
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
        reads, last = reads + 1, key(e)
        doc = read(e)
        if doc is not None:
            docs.append(doc)
    return docs, None


def question_page(
    index: Index,
    wanted: Filters,
    sort: Sort,
    after: tuple[Any, ...] | None,
    read: Callable[[Listed], Doc | None],
    limit: int,
) -> tuple[list[Doc], str | None]:
    """A page of open questions in `sort` order after the cursor's key: documents and `next`."""
    if sort == "deadline":
        found = soonest(index.questions(), wanted.keep, after, limit)
        docs, last = collect(found, lambda e: True, read, limit, deadline_key)
    else:
        entries = index.questions(after, oldest=sort == "oldest")
        docs, last = collect(entries, wanted.keep, read, limit)
    return docs, encode(SORTS[sort], last) if last else None
