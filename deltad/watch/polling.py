"""Stat-based polling backend, behind the same interface as the inotify one.

Used for roots with `backend: polling` (NFS and some container mounts deliver no events), and
for workspaces that no longer fit under the inotify watch limit.
Each round stats five paths per workspace (never the agents' files), so a round costs
O(workspaces); new workspaces are found by re-walking the polled trees every few rounds.
watchdog's PollingObserver is not used: it snapshots whole trees recursively (cost grows with
the agents' files) and runs one thread per scheduled directory.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Generator
from pathlib import Path

import structlog

from deltad.protocol.layout import Workspace

from .discovery import Layout, walk
from .hints import HintQueue, Why

log = structlog.get_logger("deltad.poll")

Signature = tuple[tuple[int, int, int] | None, ...]
REWALK_EVERY = 5  # rounds between discovery walks


def _stat_sig(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def signature(ws: Path) -> Signature:
    w = Workspace(ws)
    return tuple(
        _stat_sig(p)
        for p in (w.response_file, w.response_json, w.request_file, w.latest_file, w.delta_dir)
    )


class PollingBackend:
    name = "polling"

    def __init__(self, queue: HintQueue, interval: float) -> None:
        self._queue = queue
        self._interval = interval
        self._lock = threading.Lock()
        self._tops: dict[Path, int] = {}  # walked every few rounds: roots, adopted dirs
        self._roots: set[Path] = set()
        self._sigs: dict[Path, Signature] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._round = 0

    # -- interface ------------------------------------------------------------------------
    def fileno(self) -> int | None:
        return None  # pushes hints from its own thread

    def add_root(self, root: Path, depth: int) -> None:
        with self._lock:
            self._tops[root] = depth
            self._roots.add(root)

    def adopt_dir(self, path: Path, levels: int) -> None:
        """A discovery dir inotify could not watch: walk it every few rounds instead."""
        with self._lock:
            self._tops[path] = levels
        self._start()

    def release_dir(self, path: Path) -> None:
        """A directory handed over by `adopt_dir` went (the event tree saw it go)."""
        with self._lock:
            if path not in self._roots:
                self._tops.pop(path, None)

    def adopt_workspace(self, ws: Path) -> None:
        with self._lock:
            self._sigs.setdefault(ws, signature(ws))
        self._start()

    def sync(self, force: bool = False) -> Layout:
        return _exhaust(self._sync_walk())

    def sync_steps(self, force: bool = False) -> Generator[Path | None, None, Layout]:
        """A step per tree walked (a root, or a directory handed over by an event tree: 60,000
        of a storming tenant's), then one per workspace, so that reconciling them is spread
        over loop turns like the event backends' are."""
        layout = yield from self._sync_walk()
        yield from list(layout.workspaces)
        return layout

    def _sync_walk(self) -> Generator[None, None, Layout]:
        layout = yield from self._walk_steps()
        with self._lock:
            for ws in layout.workspaces:
                self._sigs.setdefault(ws, signature(ws))
        if self._tops:
            self._start()
        return layout

    def process(self) -> None:
        pass

    def forget(self, workspace: Path) -> None:
        with self._lock:
            self._sigs.pop(workspace, None)

    def watch_count(self) -> int:
        with self._lock:
            return len(self._sigs)

    def healthy(self) -> bool:
        return self._thread is None or self._thread.is_alive() or self._stop.is_set()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # -- the polling thread -----------------------------------------------------------------
    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="deltad-poll", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._poll_once()
            except Exception as e:  # keep polling; one bad round must not stop detection
                log.error("poll_round_failed", error=str(e))

    def _poll_once(self) -> None:
        self._round += 1
        if self._round % REWALK_EVERY == 0:
            for ws in self._walk().workspaces:
                self._found(ws)
        with self._lock:
            snapshot = list(self._sigs.items())
        for ws, old in snapshot:
            new = signature(ws)
            if new != old:
                with self._lock:
                    if ws in self._sigs:
                        self._sigs[ws] = new
                # Polling never sees a close: the answer may be mid-write (reconcile checks).
                answered = new[:2] != old[:2]
                self._queue.put(ws, Why.ANSWER_CREATED if answered else Why.CHECK)

    def _found(self, ws: Path) -> None:
        with self._lock:
            if ws in self._sigs:
                return
            self._sigs[ws] = signature(ws)
        self._queue.put(ws, Why.DISCOVERED)

    def _walk(self) -> Layout:
        return _exhaust(self._walk_steps())

    def _walk_steps(self) -> Generator[None, None, Layout]:
        """Walk the tops, a step each; an adopted directory that is no longer there is dropped
        (one whose going no event told of: the events were lost, or it was never watched).
        Looked at under the lock, so that one made again and adopted meanwhile stays."""
        with self._lock:
            tops = dict(self._tops)
        layout = Layout()
        for top, depth in tops.items():
            yield None
            if top not in self._roots:
                with self._lock:
                    if not _is_dir(top):
                        self._tops.pop(top, None)
                        continue
            walk(top, depth, layout)
        return layout


def _exhaust(steps: Generator[None, None, Layout]) -> Layout:
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]


def _is_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False
