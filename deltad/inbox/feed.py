"""What the daemon's loop tells the rest of the world: an index of workspaces (for the HTTP
API, which must never wait on a reconcile) and a feed of events (`request.created`,
`request.answered`, `request.expired`, `run.status`) for the event stream and notifications.

Both are written only by the loop (through the registry's change hook) and read from other
threads, so each is one lock around plain data. Publishing never blocks: subscribers are
callbacks that queue and return. Events are hints, like inotify's: every reader that acts
looks at the disk again (the answering path does).
"""

from __future__ import annotations

import bisect
import contextlib
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import structlog

from deltad import platform
from deltad.protocol import iso, utcnow
from deltad.protocol.printable import show_path

from .feedlog import Announced, EventLog

log = structlog.get_logger("deltad.feed")

EventType = Literal[
    "request.created",
    "request.answered",
    "request.expired",
    "run.status",
    "request.reminder",  # an open question's respondents reminded (daemon/followup.py)
    "request.escalated",  # an open question escalated: more respondents
    "request.overdue",  # an open question past its SLA (it stays open)
]
EVENT_TYPES: tuple[EventType, ...] = (
    "request.created",
    "request.answered",
    "request.expired",
    "run.status",
    "request.reminder",
    "request.escalated",
    "request.overdue",
)
DEFAULT_BUFFER = 1000
CLOSED_MEMORY = 10_000


@dataclass(frozen=True, slots=True)  # one per workspace: no per-instance dict
class View:
    """The loop's latest belief about one workspace (`state` is reconcile's State value)."""

    workspace: Path
    state: str
    run_id: str | None = None
    status: str | None = None
    request_id: str | None = None
    input_type: str | None = None
    created: float | None = None  # the open question's timestamp (the inbox's order)
    deadline: float | None = None  # the open question's expires_at (the inbox's due soon)
    # Set by the index when it files the view (scopes and the owner filter); not part of
    # the belief, so not compared.
    real: str | None = field(default=None, compare=False)  # the real path, if not the name
    owner: int | None = field(default=None, compare=False)  # the owner's uid


Holders = Path | set[Path]  # the workspaces showing one request id
QuestionKey = tuple[float, str, str]  # (created, workspace, request id)
RunKey = tuple[str, str]  # (run id, workspace): run ids start with their start time


def question_key(view: View) -> QuestionKey | None:
    """Where a workspace's view files its open question, if it is waiting on one."""
    if view.state != "waiting" or not view.request_id:
        return None
    return (view.created or 0.0, str(view.workspace), view.request_id)


def run_key(view: View) -> RunKey | None:
    """Where a workspace's view files its latest run, if it has one."""
    return None if view.run_id is None else (view.run_id, str(view.workspace))


@dataclass(frozen=True, slots=True)
class Listed:
    """An open question or a run as listing sees it: the view it was filed from, which the
    index keeps in its sorted lists (an entry object and its key tuple cost ~150 bytes per
    workspace, twice). Made as a page is read, not kept. The document itself is read from
    disk, only for a page's items."""

    view: View

    @property
    def key(self) -> tuple[Any, ...]:
        raise NotImplementedError

    @property
    def workspace(self) -> Path:
        return self.view.workspace

    @property
    def real(self) -> str:
        """The workspace's real path when the loop last saw it change (scopes)."""
        return self.view.real or str(self.view.workspace)

    @property
    def owner(self) -> int | None:
        return self.view.owner

    @property
    def run_id(self) -> str | None:
        return self.view.run_id

    @property
    def status(self) -> str | None:
        return self.view.status

    @property
    def request_id(self) -> str | None:
        return self.view.request_id

    @property
    def input_type(self) -> str | None:
        return self.view.input_type

    @property
    def created(self) -> float | None:
        return self.view.created

    @property
    def deadline(self) -> float | None:
        return self.view.deadline


class ListedQuestion(Listed):
    """An open question, by (created, workspace, request id)."""

    __slots__ = ()

    @property
    def key(self) -> tuple[Any, ...]:
        return _question_order(self.view)


class ListedRun(Listed):
    """A workspace's latest run, by (run id, workspace)."""

    __slots__ = ()

    @property
    def key(self) -> tuple[Any, ...]:
        return _run_order(self.view)


def _question_order(view: View) -> tuple[Any, ...]:
    return question_key(view) or ()


def _run_order(view: View) -> tuple[Any, ...]:
    return run_key(view) or ()


Order = Callable[[View], tuple[Any, ...]]


def newest_first(order: list[View], by: Order, before: tuple[Any, ...] | None) -> list[View]:
    """Views of an ascending list with a key below `before` (all if None), newest first."""
    end = len(order) if before is None else bisect.bisect_left(order, before, key=by)
    return order[:end][::-1]


def oldest_first(order: list[View], by: Order, after: tuple[Any, ...] | None) -> list[View]:
    """Views of an ascending list with a key above `after` (all if None), oldest first."""
    return order[0 if after is None else bisect.bisect_right(order, after, key=by) :]


@dataclass(frozen=True)
class FeedEvent:
    id: int
    type: EventType
    at: str
    data: dict[str, Any]

    @property
    def workspace(self) -> str:
        return str(self.data.get("workspace", ""))

    def document(self) -> dict[str, Any]:
        doc = {"id": self.id, "type": self.type, "at": self.at, **self.data}
        if "workspace" in doc:  # kept as the file system has it; shown escaped (names are bytes)
            doc["workspace"] = show_path(self.workspace)
        return doc


class Index:
    """Workspaces by path and open questions by (workspace, request id). A request id is only
    a name a workspace's `request.json` gives itself: two workspaces may show the same one
    (a copy, or a tenant copying another's), so every lookup by id returns all holders and
    the caller decides (the API serves one only where the caller's scope makes it unique)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._views: dict[Path, View] = {}
        # id -> the workspace holding it, or a set once several do (copies: 100,000 may
        # share one); a set for each id cost 216 bytes per workspace, twice
        self._requests: dict[str, Holders] = {}
        # Questions seen open and gone since: a late answer gets 409 (or 410), not 404. The
        # order bounds the memory; the second map answers `closed` without a scan.
        self._closed: OrderedDict[tuple[str, Path], None] = OrderedDict()
        self._closed_by_id: dict[str, dict[Path, bool]] = {}  # -> expired
        # Listing from memory: open questions and latest runs, each sorted by its key. What
        # a workspace filed is found again from its view's keys (a table of it cost 150
        # bytes per workspace); the holders of a run id by bisecting the runs, sorted by run
        # id first (a table of them cost ~100 bytes per workspace).
        self._questions: list[View] = []
        self._runs: list[View] = []
        self._kinds: dict[str, int] = {}  # open questions by input type (metrics)
        # Counts every change (a put or a removal): a reader that walked the index knows
        # whether there is anything new to walk (inbox/readahead.py).
        self.generation = 0

    def _close(self, request_id: str, ws: Path, expired: bool) -> None:
        _release(self._requests, request_id, ws)
        self._closed[(request_id, ws)] = None
        self._closed.move_to_end((request_id, ws))
        self._closed_by_id.setdefault(request_id, {})[ws] = expired
        while len(self._closed) > CLOSED_MEMORY:
            self._forget(*self._closed.popitem(last=False)[0])

    def _forget(self, request_id: str, ws: Path) -> None:
        self._closed.pop((request_id, ws), None)
        gone = self._closed_by_id.get(request_id, {})
        gone.pop(ws, None)
        if not gone:
            self._closed_by_id.pop(request_id, None)

    def _unfile(self, old: View | None) -> None:
        """Take out what `old`, the workspace's view until now, filed: its keys say where."""
        if old is None:
            return
        for order, by in ((self._questions, _question_order), (self._runs, _run_order)):
            if key := by(old):
                i = bisect.bisect_left(order, key, key=by)
                if i < len(order) and by(order[i]) == key:
                    del order[i]
        if question_key(old) is not None:
            kind = old.input_type or "unknown"
            if (left := self._kinds.get(kind, 0) - 1) > 0:
                self._kinds[kind] = left
            else:
                self._kinds.pop(kind, None)

    def _file(self, view: View) -> None:
        for order, by in ((self._questions, _question_order), (self._runs, _run_order)):
            if by(view):
                bisect.insort(order, view, key=by)
        if question_key(view) is not None:
            kind = view.input_type or "unknown"
            self._kinds[kind] = self._kinds.get(kind, 0) + 1

    def put(self, view: View) -> None:
        if view.run_id is not None or view.request_id:  # listed: scopes need both
            real, owner = _where(view.workspace)  # outside the lock: the file system is slow
            view = replace(view, real=real, owner=owner)
        # else never listed: no open and readlink for each of 100,000 workspaces found at
        # startup before READY; their reads after READY file them with both
        with self._lock:
            old = self._views.get(view.workspace)
            if old is not None and old.request_id and old.request_id != view.request_id:
                self._close(old.request_id, view.workspace, old.state == "expired")
            self._views[view.workspace] = view
            if view.request_id:
                _hold(self._requests, view.request_id, view.workspace)
                self._forget(view.request_id, view.workspace)  # open again (a re-posted copy)
            self._unfile(old)
            self._file(view)
            self.generation += 1

    def remove(self, ws: Path) -> None:
        with self._lock:
            old = self._views.pop(ws, None)
            if old is not None and old.request_id:
                self._close(old.request_id, ws, old.state == "expired")
            self._unfile(old)
            self.generation += 1

    def pending_summary(self) -> tuple[dict[str, int], float | None]:
        """Open questions by input type, and the oldest one's timestamp (metrics: O(kinds))."""
        with self._lock:
            oldest = self._questions[0].created if self._questions else None
            return dict(self._kinds), oldest

    def asking(self) -> Iterator[View]:
        """For the loop, the writer (no lock): the views with an open question, oldest
        first."""
        return iter(self._questions)

    @property
    def table(self) -> dict[Path, View]:
        """The views by workspace, for the loop, their one writer (through `put` and
        `remove`), to read without the lock: the registry's beliefs are this same table."""
        return self._views

    def get(self, ws: Path) -> View | None:
        with self._lock:
            return self._views.get(ws)

    def find(self, request_id: str) -> list[Path]:
        """Every workspace where question `request_id` is open, sorted."""
        with self._lock:
            return sorted(_holding(self._requests.get(request_id)))

    def closed(self, request_id: str) -> dict[Path, bool]:
        """Where question `request_id` was seen open and is gone: workspace -> expired."""
        with self._lock:
            return dict(self._closed_by_id.get(request_id, {}))

    def views(self) -> list[View]:
        with self._lock:
            return list(self._views.values())

    def questions(
        self, before: tuple[Any, ...] | None = None, *, oldest: bool = False
    ) -> Iterator[Listed]:
        """Open questions newest first, from below the key `before` (a cursor) on; `oldest`:
        oldest first, from above it."""
        with self._lock:
            pick = oldest_first if oldest else newest_first
            views = pick(self._questions, _question_order, before)
        return map(ListedQuestion, views)

    def runs(self, before: tuple[Any, ...] | None = None) -> Iterator[Listed]:
        """Each workspace's latest run, newest first, from below the key `before` on."""
        with self._lock:
            views = newest_first(self._runs, _run_order, before)
        return map(ListedRun, views)

    def run_holders(self, run_id: str) -> list[Path]:
        """Every workspace whose latest run is `run_id`, sorted."""
        with self._lock:
            i = end = bisect.bisect_left(self._runs, (run_id,), key=_run_order)
            while end < len(self._runs) and self._runs[end].run_id == run_id:
                end += 1
            return sorted(e.workspace for e in self._runs[i:end])


def _hold(holders: dict[str, Holders], key: str, ws: Path) -> None:
    held = holders.get(key)
    if held is None:
        holders[key] = ws
    elif isinstance(held, set):
        held.add(ws)
    elif held != ws:
        holders[key] = {held, ws}


def _release(holders: dict[str, Holders], key: str, ws: Path) -> None:
    held = holders.get(key)
    if isinstance(held, set):
        held.discard(ws)
        if len(held) == 1:
            holders[key] = next(iter(held))
    elif held == ws:
        del holders[key]


def _holding(held: Holders | None) -> Iterable[Path]:
    return () if held is None else held if isinstance(held, set) else (held,)


def _where(ws: Path) -> tuple[str | None, int | None]:
    """The workspace's real path (scopes check it too; None when it is its name) and its
    owner's uid (None if gone)."""
    name = str(ws)
    real, owner = _resolved(name) if platform.LINUX else (None, None)
    if real is None:
        try:
            owner = os.stat(ws).st_uid
        except OSError:
            owner = None
        real = os.path.realpath(ws)
    if owner is not None:  # an int per workspace from stat: one per owner instead
        owner = _UIDS.setdefault(owner, owner)
    return (None if real == name else real), owner  # no second string when they agree


_UIDS: dict[int, int] = {}


def _resolved(name: str) -> tuple[str | None, int | None]:
    """The kernel's own resolution of `name` (one open, not an lstat per component as
    `realpath` does: this runs for every workspace at startup), and its owner; (None, None)
    if it cannot tell."""
    try:
        fd = os.open(name, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return None, None
    try:
        real, owner = os.readlink(f"/proc/self/fd/{fd}"), os.fstat(fd).st_uid
    except OSError:
        return None, None
    finally:
        os.close(fd)
    return (None, None) if real.endswith(" (deleted)") else (real, owner)


Subscriber = Callable[[FeedEvent], None]


@dataclass
class Feed:
    """The bounded event buffer (for `Last-Event-ID` replays) and its subscribers."""

    buffer: int = DEFAULT_BUFFER
    index: Index = field(default_factory=Index)
    # While True (the startup reconcile), the index is filled but nothing is announced: a
    # restart must not notify every waiting question again.
    priming: bool = False

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._events: deque[FeedEvent] = deque(maxlen=self.buffer)
        # Ids grow across restarts (microseconds at start, or past the durable log's last),
        # so a client's Last-Event-ID from before a restart is older than anything new.
        self._next_id = time.time_ns() // 1000
        # Events at or below the floor are not kept: a Last-Event-ID below it has a gap
        # (`gap`). Without a durable log, whatever came before this process is gone.
        self._floor = self._next_id
        self._log: EventLog | None = None
        self._announced: Announced | None = None
        self._subscribers: list[Subscriber] = []
        # The question announced as open in a workspace is its view's while that view is
        # waiting (a table of them cost ~50 bytes per waiting workspace); only while a
        # workspace shows a problem is it kept here (a problem announces nothing).
        self._held: dict[Path, str] = {}

    # -- durability (the core side: the feed's producer) -----------------------------------
    def attach(self, state_dir: Path) -> None:
        """Keep the event log and the announced questions in `state_dir/feed/` (feedlog.py):
        load what an earlier daemon left, then write through. Called once, before the first
        reconcile; a feed never attached keeps both in memory only."""
        events, announced = EventLog(state_dir, self.buffer), Announced(state_dir)
        with self._lock:
            kept = events.load(self._next_id)
            announced.load()
            for doc in kept:
                self._events.append(
                    FeedEvent(doc["id"], doc["type"], str(doc.get("at", "")), doc.get("data", {}))
                )
            last = kept[-1]["id"] if kept else events.floor
            self._next_id = max(self._next_id, last)
            self._floor = events.floor
            self._log, self._announced = events, announced

    def sync_due(self) -> None:
        """The loop, at the end of its turn: fsync the records if it is time (feedlog.py)."""
        with self._lock:
            try:
                for record in (self._log, self._announced):
                    if record is not None:
                        record.sync_due()
            except OSError as err:  # a failing disk must not stop the loop
                log.warning("feed_log_write_failed", error=str(err))

    def close(self) -> None:
        with self._lock:
            if self._log is not None:
                self._log.close()
            if self._announced is not None:
                self._announced.close()

    # -- publishing (the loop) -------------------------------------------------------------
    def publish(self, type_: EventType, data: dict[str, Any]) -> FeedEvent:
        with self._lock:
            self._next_id += 1
            event = FeedEvent(self._next_id, type_, iso(utcnow()), data)
            if len(self._events) == self._events.maxlen:
                self._floor = max(self._floor, self._events[0].id)
            self._events.append(event)
            self._record(event)
            subscribers = list(self._subscribers)
        for fn in subscribers:
            fn(event)
        return event

    def _record(self, e: FeedEvent) -> None:
        """Write the event through (under the lock: ids reach the log in order), and what it
        says of the workspace's announced question."""
        try:
            if self._log is not None:
                self._log.append({"id": e.id, "type": e.type, "at": e.at, "data": e.data})
                self._floor = max(self._floor, self._log.floor)
            if self._announced is not None and e.workspace:
                rid = e.data.get("request_id")
                if e.type == "request.created" and isinstance(rid, str):
                    self._announced.put(e.workspace, rid)
                elif (
                    e.type in ("request.answered", "request.expired")
                    and self._announced.open.get(e.workspace) == rid
                ):
                    self._announced.drop(e.workspace)
        except (OSError, ValueError) as err:  # a full disk must not stop the loop
            log.warning("feed_log_write_failed", error=str(err))

    def changed(self, ws: Path, before: View | None, after: View | None) -> None:
        """The registry's hook: update the index, announce what changed."""
        announced = self._announced_in(ws, before)
        if after is None:
            self.index.remove(ws)
            self._held.pop(ws, None)
            self._forget_announced(ws)
            return
        self.index.put(after)
        if after.state == "problem" and announced is not None:
            self._held[ws] = announced
        else:
            self._held.pop(ws, None)
        if not self.priming:
            for type_, data in transitions(before, after, announced):
                self.publish(type_, data)
        else:
            self._primed(after)

    def _primed(self, after: View) -> None:
        """A look before the daemon is live (startup, the reads after READY): announce only a
        question the state dir says was never announced in this workspace (written while the
        daemon was down, or found before the crash that would have announced it); forget a
        question that closed meanwhile. A state dir without the record (the first start with
        it) takes what it finds as announced: an upgrade does not re-announce a fleet."""
        store, ws = self._announced, str(after.workspace)
        if store is None:
            return
        if after.state == "waiting" and after.request_id:
            if store.open.get(ws) == after.request_id:
                return
            if not store.existed:
                with self._lock, contextlib.suppress(OSError):
                    store.put(ws, after.request_id)
                return
            base = {"workspace": ws, "run_id": after.run_id}
            created = {**base, "request_id": after.request_id, "input_type": after.input_type}
            self.publish("request.created", created)
        elif after.run_id is not None and after.state not in ("problem", "answered", "expired"):
            # A run read and found past its question (not a workspace only just found, whose
            # view is a placeholder, nor a question answered but not yet taken).
            self._forget_announced(after.workspace)

    def _forget_announced(self, ws: Path) -> None:
        if self._announced is not None:
            with self._lock, contextlib.suppress(OSError):
                self._announced.drop(str(ws))

    def _announced_in(self, ws: Path, before: View | None) -> str | None:
        """The question announced (or primed) as open in `ws` before this change: the one it
        was waiting on, kept while it shows a problem; `transitions` keeps that true."""
        if before is None:
            return None
        if before.state == "problem":
            return self._held.get(ws)
        return before.request_id if before.state == "waiting" else None

    @property
    def floor(self) -> int:
        """Events at or below it are not kept (`gap`)."""
        with self._lock:
            return self._floor

    def relay_floor(self, floor: int) -> None:
        """A replica's floor, as the core's (its durable log's) at the connection's start."""
        with self._lock:
            self._floor = floor

    def relay(self, event: FeedEvent) -> bool:
        """A replica's intake (the inbox process): an event the core published, under the
        core's id. One already held (the buffer resent after a reconnect) is skipped."""
        with self._lock:
            if self._events and event.id <= self._events[-1].id:
                return False
            self._next_id = event.id
            if len(self._events) == self._events.maxlen:
                self._floor = max(self._floor, self._events[0].id)
            self._events.append(event)
            subscribers = list(self._subscribers)
        for fn in subscribers:
            fn(event)
        return True

    # -- reading (other threads) -------------------------------------------------------------
    def subscribe(self, fn: Subscriber) -> Callable[[], None]:
        with self._lock:
            self._subscribers.append(fn)

        def unsubscribe() -> None:
            with self._lock:
                if fn in self._subscribers:
                    self._subscribers.remove(fn)

        return unsubscribe

    def since(self, last_id: int | None) -> list[FeedEvent]:
        """Buffered events after `last_id` (None: none — a new client starts from now)."""
        if last_id is None:
            return []
        with self._lock:
            return [e for e in self._events if e.id > last_id]

    def gap(self, last_id: int | None) -> bool:
        """Some event after `last_id` is no longer kept (older than the log, or from before a
        restart without one): `since` cannot fill the gap, and the client must list again."""
        if last_id is None:
            return False
        with self._lock:
            return last_id < self._floor

    def last_id(self) -> int:
        with self._lock:
            return self._next_id


def transitions(
    before: View | None, after: View, announced: str | None
) -> list[tuple[EventType, dict[str, Any]]]:
    """What to announce when a workspace's view goes from `before` to `after`, given the
    question already announced as open there. Pure, so the rules are tested in one place."""
    base = {"workspace": str(after.workspace), "run_id": after.run_id}
    out: list[tuple[EventType, dict[str, Any]]] = []
    if announced is not None and after.state != "problem":
        still_open = after.state == "waiting" and after.request_id == announced
        if not still_open:
            expired = after.state == "expired" and after.request_id == announced
            kind: EventType = "request.expired" if expired else "request.answered"
            was = before.input_type if before is not None else None
            out.append((kind, {**base, "request_id": announced, "input_type": was}))
    if after.state == "waiting" and after.request_id and after.request_id != announced:
        created = {**base, "request_id": after.request_id, "input_type": after.input_type}
        out.append(("request.created", created))
    if after.status is not None:
        same_run = before is not None and before.run_id == after.run_id
        was = before.status if same_run and before is not None else None
        if before is not None and same_run and _went_through_running(before, after):
            # A resume shorter than the time between two looks (the daemon's own, which it
            # does not look at while it runs, or a person's): it ran all the same.
            out.append(("run.status", {**base, "from": was, "to": RUNNING}))
            was = RUNNING
        if was != after.status:
            out.append(("run.status", {**base, "from": was, "to": after.status}))
    return out


RUNNING = "RUNNING"
# Statuses a run leaves only by running again, and those it reaches only from RUNNING (the
# protocol's TRANSITIONS): a change from one to the other went through RUNNING.
_RESTING = ("WAITING_FOR_INPUT", "INTERRUPTED", "FAILED")
_ONLY_FROM_RUNNING = ("WAITING_FOR_INPUT", "COMPLETED", "FAILED")


def _went_through_running(before: View, after: View) -> bool:
    if before.status not in _RESTING or after.status not in _ONLY_FROM_RUNNING:
        return False
    if before.status != after.status:
        return True
    # WAITING_FOR_INPUT again, on another question: the run took the answer and asked again
    return bool(before.request_id and after.request_id and before.request_id != after.request_id)
