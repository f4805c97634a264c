"""What the handlers work with, apart from the handlers themselves: the context they are
given (`Context`: the feed, the tokens, the settings, the idempotency keys, the document
cache), and who may see which workspace. Light: the inbox process builds a `Context` for its
routes and imports nothing of the answering code with it."""

from __future__ import annotations

import hmac
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import structlog

from deltad.health import Standalone, Vitals
from deltad.inbox import scopes
from deltad.inbox.config import HttpConfig
from deltad.inbox.feed import Feed
from deltad.inbox.idempotency import FILE as KEYS_FILE
from deltad.inbox.idempotency import KeyLog
from deltad.inbox.idempotency import Record as KeyRecord
from deltad.inbox.ops import ApiError, Caller
from deltad.inbox.schemas import Question, document_json
from deltad.inbox.tokens import Identity, TokenStore
from deltad.metrics import HttpMetrics
from deltad.protocol import utcnow
from deltad.protocol.printable import show_path

log = structlog.get_logger("deltad.api")

# Question documents kept for list pages, by their size: compressed JSON (~0.5 KB each, a
# model ~4 KB), so 10,000 open questions are paged from memory, not read item by item.
DOCUMENT_CACHE_BYTES = 16 * 1024 * 1024
ENTRY_OVERHEAD = 240  # bytes an entry costs beside its document (key, stamp, record)


class Idempotency:
    """(token, Idempotency-Key, request id) → the workspace answered, the body's digest and
    the response it got: kept 24 hours, at most 10,000, in the state dir when `state_dir` is
    given (idempotency.py), so a retry after a restart gets the same 202. A repeat to the same
    question gets the same response, a different body a 422; the key on another question is
    another answer."""

    def __init__(self, state_dir: Path | None = None) -> None:
        self.lock = threading.Lock()
        self.log = KeyLog(state_dir / KEYS_FILE if state_dir is not None else None)

    def seen(
        self, who: str, key: str, request_id: str, workspace: Path | None, body_digest: str
    ) -> dict[str, Any] | None:
        with self.lock:
            hit = self.log.get((who, key, request_id), time.time())
            sealed = self.log.seal(body_digest)
        if hit is None or (workspace is not None and hit.workspace != str(workspace)):
            return None
        if not hmac.compare_digest(hit.sealed, sealed):
            raise ApiError(
                422, "idempotency_mismatch", "this Idempotency-Key was used with another body"
            )
        return hit.doc

    def remember(
        self, who: str, key: str, request_id: str, body_digest: str, doc: dict[str, Any]
    ) -> None:
        with self.lock:
            rec = KeyRecord(doc["workspace"], self.log.seal(body_digest), doc, time.time())
            try:
                self.log.put((who, key, request_id), rec)
            except OSError as e:  # the answer is delivered; only a retry's 202 is at risk
                log.warning("idempotency_not_kept", error=str(e))


@dataclass
class Context:
    """What every handler needs, and the routes: built once by the core (and by the inbox
    process for its routes, with `core` its way to the core)."""

    feed: Feed
    tokens: TokenStore
    config: HttpConfig
    link_key: bytes
    base_url: str = ""
    idempotency: Idempotency = field(default_factory=Idempotency)  # in memory: tests
    documents: Documents = field(default_factory=lambda: Documents())
    # Health and the core's metrics as plain data (deltad/health.py: the seam to the loop).
    vitals: Vitals = field(default_factory=lambda: Standalone())
    http_metrics: HttpMetrics = field(default_factory=lambda: HttpMetrics())
    # Where the routes' and MCP tools' operations go (deltad/inbox/ops.py): in the inbox
    # process the core, over the socket; None: the table served in this process (tests).
    core: Caller | None = None
    # The audit log each four-eyes vote is appended to (daemon/audit.py); None: not kept.
    audit: Path | None = None
    # Channels that take requests of their own (Slack's interactions), by name, in the core:
    # (raw body, timestamp header, signature header) -> {"response": ...} (deltad/outbound).
    interactions: dict[str, Callable[[str, str, str], dict[str, Any]]] = field(default_factory=dict)


# -- who may see what -----------------------------------------------------------------------------
def visible(who: Identity, ws: Path) -> bool:
    return scopes.allows(list(who.scopes), str(ws))


def glob_names(glob: str, ws: Path) -> bool:
    """A `?workspace=` glob matches the name as the API shows it, or as the file system has it."""
    return scopes.matches(glob, str(ws)) or scopes.matches(glob, show_path(ws))


@dataclass(frozen=True)
class Shown:
    """A question's document as last read (its JSON, compressed), and what decides whether a
    page shows it."""

    stamp: tuple[int, ...]
    packed: bytes
    expires_at: datetime | None
    answer_waiting: bool

    @classmethod
    def of(
        cls, stamp: tuple[int, ...], doc: Question, expires_at: datetime | None, waiting: bool
    ) -> Shown:
        # As the routes send it (by alias, the fields set): a tool's `schema` survives the trip.
        return cls(stamp, zlib.compress(document_json(doc), 1), expires_at, waiting)

    def shows(self) -> bool:
        """Whether a page lists it: no answer waiting, not expired."""
        return not self.answer_waiting and (self.expires_at is None or self.expires_at > utcnow())

    def page_json(self) -> bytes | None:
        """The document as a page lists it (`document_json`'s bytes), if a page shows it: a
        kept page is joined from these (`schemas.page_json`), never made into models again."""
        return zlib.decompress(self.packed) if self.shows() else None

    def page_item(self) -> Question | None:
        """The document as a model, if a page shows it (a filter that reads its fields)."""
        raw = self.page_json()
        return None if raw is None else Question.model_validate_json(raw)

    @property
    def size(self) -> int:
        return len(self.packed) + ENTRY_OVERHEAD


@dataclass
class Documents:
    """Question documents by (workspace, request id), reused while the files they were read
    from are the same (device, inode, mtime, size of request.json, of the mailbox directory —
    an answer or a refusal note changes it — and of the run's metadata). A page costs a few
    stats per item instead of a dozen safe opens. The most recent only, up to
    DOCUMENT_CACHE_BYTES, so memory is bounded whatever the fleet."""

    shown: OrderedDict[tuple[Path, str], Shown] = field(default_factory=OrderedDict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    budget: int = DOCUMENT_CACHE_BYTES
    held: int = 0  # bytes the kept entries cost
    evicted: int = 0  # entries let go for the budget, ever (inbox/readahead.py)

    def get(self, key: tuple[Path, str], stamp: tuple[int, ...]) -> Shown | None:
        with self.lock:
            hit = self.shown.get(key)
            if hit is None or hit.stamp != stamp:
                return None
            self.shown.move_to_end(key)
            return hit

    def put(self, key: tuple[Path, str], shown: Shown) -> None:
        with self.lock:
            if (old := self.shown.pop(key, None)) is not None:
                self.held -= old.size
            self.shown[key] = shown
            self.held += shown.size
            while self.held > self.budget and self.shown:
                self.held -= self.shown.popitem(last=False)[1].size
                self.evicted += 1
