"""Watch backend on watchdog's native observer (inotify on Linux, FSEvents on macOS, kqueue on
BSD, ReadDirectoryChangesW on Windows): the default off Linux, and opt-in per root.

Same directories as the inotify backend (`WatchTree` decides them): one NON-recursive
`schedule()` per root/discovery dir, per workspace `.delta/`, `.delta/interaction/` and
`.delta/runs/` — never the agents' working files, so the cost stays O(workspaces).

Threads: the handler runs on watchdog's observer thread and only appends `(wd, mask, name)` to
a locked inbox and wakes the main loop; the main loop turns the inbox into hints and does every
schedule/unschedule itself, so the watch bookkeeping is never shared between threads. Events
are hints; reconcile decides from disk.

Cost: watchdog 7.x starts one emitter thread per `schedule()` (research §1.8: 5,000 schedules
→ 5,001 threads, +93 MiB RSS). That is exactly why it is not the Linux default, where the
single-fd `InotifyBackend` does the same with no thread at all.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import threading

import structlog
from watchdog.events import (
    EVENT_TYPE_CLOSED,
    EVENT_TYPE_CREATED,
    EVENT_TYPE_DELETED,
    EVENT_TYPE_MODIFIED,
    EVENT_TYPE_MOVED,
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver, ObservedWatch

from deltad import platform

from . import events as F
from .hints import HintQueue, Waker
from .tree import Kind, PollingLike, WatchTree

log = structlog.get_logger("deltad.wdog")

OVERFLOW_LOGGER = "watchdog.observers.inotify_c"  # watchdog only *logs* a queue overflow

_DIR_EVENTS: list[type[FileSystemEvent]] = [DirCreatedEvent, DirDeletedEvent, DirMovedEvent]
# An unpaired MOVED_TO (mv in from elsewhere) arrives as a Created event.
_FILE_EVENTS: list[type[FileSystemEvent]] = [
    FileClosedEvent,
    FileMovedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
]
if not platform.LINUX:
    # Only watchdog's inotify emitter reports a close; elsewhere a write is only a Modified
    # (a plain look: reconcile's settle rule decides when the writer is done).
    _FILE_EVENTS.append(FileModifiedEvent)

# DirDeletedEvent everywhere: it is how a watched directory reports its own deletion.
FILTERS: dict[Kind, list[type[FileSystemEvent]]] = {
    Kind.DIR: _DIR_EVENTS,
    Kind.DELTA: _DIR_EVENTS,
    Kind.INTERACTION: [*_FILE_EVENTS, DirDeletedEvent],
    Kind.RUNS: [*_FILE_EVENTS, DirDeletedEvent],
}

_MASKS = {
    EVENT_TYPE_CREATED: F.CREATE,
    EVENT_TYPE_DELETED: F.DELETE,
    EVENT_TYPE_CLOSED: F.CLOSE_WRITE,
    EVENT_TYPE_MODIFIED: F.MODIFY,
}

RawEvent = tuple[int, int, str]  # (wd, inotify-style mask, name in the watched directory)


def translate(event: FileSystemEvent, watched: str) -> list[tuple[int, str]]:
    """A watchdog event on the non-recursive watch of `watched` as inotify-style (mask, name)s."""
    isdir = F.ISDIR if event.is_directory else 0
    src = os.fsdecode(event.src_path)
    if event.event_type == EVENT_TYPE_MOVED:
        dest = os.fsdecode(event.dest_path)
        out = []
        if src and os.path.dirname(src) == watched:
            out.append((F.MOVED_FROM | isdir, os.path.basename(src)))
        if dest and os.path.dirname(dest) == watched:
            out.append((F.MOVED_TO | isdir, os.path.basename(dest)))
        return out
    if src == watched:
        # The directory itself went away (watchdog then stops its emitter): as inotify says it.
        gone = event.event_type == EVENT_TYPE_DELETED
        return [(F.DELETE_SELF, ""), (F.IGNORED, "")] if gone else []
    mask = _MASKS.get(event.event_type)
    if mask is None or os.path.dirname(src) != watched:
        return []
    return [(mask | isdir, os.path.basename(src))]


class _Inbox:
    """Raw events from the observer thread to the main loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[RawEvent] = []
        self.waker = Waker()

    def put(self, items: list[RawEvent]) -> None:
        with self._lock:
            self._items.extend(items)
        self.waker.wake()

    def take(self) -> list[RawEvent]:
        self.waker.clear()
        with self._lock:
            items, self._items = self._items, []
        return items


class _Handler(FileSystemEventHandler):
    """One per schedule, so every event knows its watch. Runs on the observer thread."""

    def __init__(self, inbox: _Inbox, wd: int, watched: str) -> None:
        self._inbox, self._wd, self._watched = inbox, wd, watched

    def dispatch(self, event: FileSystemEvent) -> None:
        if raw := translate(event, self._watched):
            self._inbox.put([(self._wd, mask, name) for mask, name in raw])


class _OverflowHook(logging.Handler):
    """watchdog tells no handler about an inotify queue overflow; it logs a warning. Turn that
    record into the full reconcile the daemon does after any lost events."""

    def __init__(self, queue: HintQueue) -> None:
        super().__init__(logging.WARNING)
        self._queue = queue

    def emit(self, record: logging.LogRecord) -> None:
        if "overflow" in record.getMessage().lower():
            log.warning("inotify_overflow", backend="watchdog", action="full_reconcile")
            self._queue.request_rescan()


class WatchdogBackend(WatchTree):
    name = "watchdog"

    def __init__(
        self,
        queue: HintQueue,
        fallback: PollingLike,
        max_watches: int | None = None,
        max_per_owner: int | None = None,
    ) -> None:
        super().__init__(queue, fallback, max_watches, max_per_owner)
        self._inbox = _Inbox()
        self._observer: BaseObserver = Observer()
        self._observer.start()
        self._scheduled: dict[int, tuple[ObservedWatch, tuple[int, int]]] = {}
        self._wd_of: dict[str, int] = {}
        self._next_wd = 1
        self._hook = _OverflowHook(queue)
        overflow_log = logging.getLogger(OVERFLOW_LOGGER)
        overflow_log.addHandler(self._hook)
        if overflow_log.getEffectiveLevel() > logging.WARNING:
            overflow_log.setLevel(logging.WARNING)  # the hook must see it at any log_level

    # -- interface --------------------------------------------------------------------------
    def fileno(self) -> int | None:
        return self._inbox.waker.fileno()

    def process(self) -> None:
        for wd, mask, name in self._inbox.take():
            self._event(wd, mask, name)

    def healthy(self) -> bool:
        return self._observer.is_alive()

    def close(self) -> None:
        logging.getLogger(OVERFLOW_LOGGER).removeHandler(self._hook)
        self._observer.stop()
        self._observer.join(timeout=5)
        self._inbox.waker.close()

    # -- one directory ------------------------------------------------------------------------
    def _add_watch(self, path: str, kind: Kind) -> int:
        root = self._is_root(path)
        ident = _identity(path, follow=root)
        old = self._wd_of.get(path)
        if old is not None:
            if self._scheduled[old][1] == ident:
                return old  # the same directory, still watched (a forced re-sync)
            self._rm_watch(old)  # made anew: watchdog would reuse the stale emitter
        wd, self._next_wd = self._next_wd, self._next_wd + 1
        handler = _Handler(self._inbox, wd, str(path))
        watch = self._observer.schedule(
            handler, str(path), event_filter=FILTERS[kind], follow_symlink=root
        )
        self._scheduled[wd] = (watch, ident)
        self._wd_of[path] = wd
        return wd

    def _rm_watch(self, wd: int) -> None:
        entry = self._scheduled.pop(wd, None)
        if entry is None:
            return
        watch = entry[0]
        if self._wd_of.get(watch.path) == wd:
            del self._wd_of[watch.path]
        with contextlib.suppress(KeyError):  # already unscheduled
            self._observer.unschedule(watch)

    def _released(self, wd: int) -> None:
        self._rm_watch(wd)  # the emitter stopped itself; the observer still holds it


def _identity(path: str, follow: bool) -> tuple[int, int]:
    """Raises like a failed add_watch would: FileNotFoundError when gone, ENOTDIR for a
    symlink (never followed below a root: not every platform's observer can be told so)."""
    st = os.stat(path) if follow else os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(path))
    return (st.st_dev, st.st_ino)
