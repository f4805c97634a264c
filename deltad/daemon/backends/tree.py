"""Watch backends: turn filesystem changes into hints. Three implementations, one interface.

`WatchTree` decides *which* directories are watched, the same for every event-driven backend:
per workspace one non-recursive watch (`.delta/interaction/`, or `.delta/` while there is no
`interaction/` to watch), plus one per non-workspace directory down to the discovery depth.
Never a watch inside an agent's working files, so 100,000 files in a workspace cost nothing.
Its subclasses only add and remove one directory watch and feed events back as inotify-style
masks:

- `InotifyBackend` (`backends/inotify.py`; Linux default): one inotify fd, read by the main
  loop. The only module that imports the Linux-only `inotify_simple`.
- `WatchdogBackend` (`backends/watchdog_observer.py`; non-Linux default, opt-in per root):
  watchdog's native observer. Not the Linux default: 7.x starts a thread per `schedule()` (5,000
  workspaces → 5,001 threads, +93 MiB), and its recursive mode watches every working dir and
  can loop on queue overflow (research §1.6).
- `PollingBackend` (`backends/polling.py`): stat-based, for roots where no events arrive
  (NFS), and for what no longer fits under the inotify watch limit.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import ClassVar, Protocol

import structlog

from deltad.protocol.layout import ANSWER_FILES, INTERACTION_DIR, REQUEST_FILE, RUNS_DIR

from ..discovery import DELTA_DIR, Layout, is_workspace, subdirs
from ..queue import HintQueue, Why
from . import events as F

log = structlog.get_logger("deltad.watch")

# Never through a symlink (IN_DONT_FOLLOW): a link to another workspace's directory would get
# that directory's own watch descriptor back from the kernel.
_BASE = F.ONLYDIR | F.DONT_FOLLOW | F.EXCL_UNLINK | F.DELETE_SELF | F.MOVE_SELF
# Discovery dirs: only directory births and deaths matter (file events are filtered below).
DIR_MASK = _BASE | F.CREATE | F.MOVED_TO | F.DELETE | F.MOVED_FROM
DELTA_MASK = DIR_MASK
# No IN_OPEN / IN_MODIFY: an open is not an answer, and our own reads would echo back.
INTERACTION_MASK = _BASE | F.CLOSE_WRITE | F.MOVED_TO | F.CREATE | F.DELETE | F.MOVED_FROM
RUNS_MASK = _BASE | F.CLOSE_WRITE | F.MOVED_TO

ANSWERS = ANSWER_FILES  # the protocol's two answer files
REQUEST = REQUEST_FILE
MAILBOX = INTERACTION_DIR
RUNS = RUNS_DIR
LATEST = "LATEST"
SYSCTL_HINT = (
    "raise it with: sysctl fs.inotify.max_user_watches=524288 "
    "(persist in /etc/sysctl.d/90-deltad.conf)"
)


# A full walk in steps: yields each workspace as it is reached (None for a plain directory),
# returns the whole layout. The main loop runs a bounded number of steps per turn.
SyncSteps = Generator[Path | None, None, Layout]


class Backend(Protocol):
    name: str

    def fileno(self) -> int | None: ...
    def add_root(self, root: Path, depth: int) -> None: ...
    def sync(self, force: bool = False) -> Layout: ...
    def sync_steps(self, force: bool = False) -> SyncSteps: ...
    def process(self) -> None: ...
    def forget(self, workspace: Path) -> None: ...
    def watch_count(self) -> int: ...
    def healthy(self) -> bool: ...
    def close(self) -> None: ...


class Kind(Enum):
    DIR = "dir"
    DELTA = "delta"
    INTERACTION = "interaction"
    RUNS = "runs"  # only where watches are free (fanotify): `LATEST` changes


@dataclass(slots=True)  # two or three per workspace: no per-instance dict
class _Watch:
    path: Path
    kind: Kind
    owner: Path  # the workspace (or, for DIR, the dir itself)
    levels: int = 0  # DIR: levels below it that may still hold a workspace


class WatchLimit(Exception):
    """The inotify watch budget is spent."""


class WatchTree:
    """The watched directories of some roots, and what their events mean. Subclasses provide
    `_add_watch`/`_rm_watch` for one directory and call `_event(wd, mask, name)` from the main
    thread (masks use inotify's bits whatever the source)."""

    name = "tree"
    # A watch costs nothing (fanotify's handle table): keep `.delta/` and `.delta/runs/` as
    # well, so that a run started by hand is known at once. Else one watch per workspace.
    FREE_WATCHES: ClassVar[bool] = False

    def __init__(self, queue: HintQueue, fallback: PollingLike, max_watches: int | None) -> None:
        self._queue = queue
        self._fallback = fallback
        self._max = max_watches
        # The kernel keeps one watch per inode: two paths reaching one directory (a bind mount,
        # a directory moved while watched) share its descriptor, so a descriptor maps to every
        # path using it, and its kernel watch ends only with the last of them. Almost always
        # one path: that watch itself, a dict by path only while several share it (a dict per
        # workspace was a third of the watch table's memory).
        self._by_wd: dict[int, _Watch | dict[Path, _Watch]] = {}
        self._by_path: dict[Path, int] = {}
        self._refused: set[Path] = set()  # workspaces whose refused watch is logged already
        self._roots: dict[Path, int] = {}
        self._ws_levels: dict[Path, int] = {}
        # parent -> watched dirs and workspaces directly below it: what is at or below a
        # removed directory is found by walking this, not by scanning every watch.
        self._kids: dict[Path, set[Path]] = {}
        self._sweeping: Layout | None = None  # the layout of a sync in progress
        self._limit_logged = False
        self._failed = False

    # -- what a subclass provides ------------------------------------------------------------
    def _add_watch(self, path: Path, kind: Kind) -> int:
        """Watch one directory (non-recursively); return its descriptor. Raises OSError."""
        raise NotImplementedError

    def _rm_watch(self, wd: int) -> None:
        """Stop watching; may raise OSError if the watch is already gone."""
        raise NotImplementedError

    def _is_root(self, path: Path) -> bool:
        """A configured root may be a symlink (the admin's choice); nothing below one is
        followed."""
        return path in self._roots

    def _released(self, wd: int) -> None:
        """The watch ended by itself (its directory went away): free what is left of it."""

    # -- interface ------------------------------------------------------------------------
    def add_root(self, root: Path, depth: int) -> None:
        self._roots[root] = depth

    def sync(self, force: bool = False) -> Layout:
        """Walk every root and make the watches match; `force` re-adds existing ones (after an
        overflow, IN_IGNORED events may have been lost with the rest)."""
        return _exhaust(self.sync_steps(force))

    def sync_steps(self, force: bool = False) -> SyncSteps:
        """`sync`, one directory or workspace per step. Events handled between steps keep the
        layout true: what they add is added to it, what they remove is taken out, so the
        stale-watch cleanup at the end drops only what the walk and the events both missed."""
        layout = Layout()
        self._sweeping = layout
        try:
            for root, depth in list(self._roots.items()):
                if not root.is_dir():
                    layout.problems.append((root, "root directory does not exist"))
                    continue
                yield from self._walk(root, depth, layout, force=force, announce=False)
            self._drop_stale(layout)
        finally:
            if self._sweeping is layout:
                self._sweeping = None
        return layout

    def forget(self, workspace: Path) -> None:
        """The daemon found `workspace` gone. If only its `.delta/` went, the directory is
        watched again as a plain one, so that a new `.delta/` there is seen."""
        if workspace not in self._ws_levels:
            return
        levels = self._ws_levels[workspace]
        self._unwatch_workspace(workspace)
        self._gone_from_sweep(workspace)
        if workspace.is_dir():
            self._discover(workspace, levels, Layout())

    def _unwatch_workspace(self, workspace: Path) -> None:
        delta = workspace / DELTA_DIR
        for path in (delta, _mailbox(delta), delta / RUNS):
            self._rm(path)
        self._ws_levels.pop(workspace, None)
        self._refused.discard(workspace)
        self._reindex(workspace)

    def _gone_from_sweep(self, workspace: Path) -> None:
        """A workspace removed while a sync is in progress is not part of its layout (one that
        only fell back to polling still is)."""
        if self._sweeping is not None:
            self._sweeping.workspaces.discard(workspace)

    def watch_count(self) -> int:
        return len(self._by_wd)

    # -- adding watches ---------------------------------------------------------------------
    def _discover(
        self, top: Path, levels: int, layout: Layout, *, force: bool = False, announce: bool = True
    ) -> None:
        _exhaust(self._walk(top, levels, layout, force=force, announce=announce))

    def _walk(
        self, top: Path, levels: int, layout: Layout, *, force: bool, announce: bool
    ) -> Iterator[Path | None]:
        """Watch-then-look, recursively: whatever appears after a watch is in place is reported
        by it, whatever appeared before is found by the look. One step per directory."""
        if not is_workspace(top):
            if not self._watch_dir(top, levels, force):
                return
            if not is_workspace(top):  # a `.delta/` made meanwhile is caught by one or the other
                layout.dirs[top] = levels
                if self._sweeping is not None:
                    self._sweeping.dirs[top] = levels
                yield None
                for child in self._children(top, levels, layout):
                    yield from self._walk(child, levels - 1, layout, force=force, announce=announce)
                return
            self._rm(top)
        layout.workspaces.add(top)
        if self._watch_workspace(top, levels, force) and announce:
            self._queue.put(top, Why.DISCOVERED)
        yield top

    @staticmethod
    def _children(top: Path, levels: int, layout: Layout) -> list[Path]:
        if levels <= 0:
            return []
        try:
            return subdirs(top)
        except FileNotFoundError:
            return []
        except OSError as e:
            layout.problems.append((top, e.strerror or str(e)))
            return []

    def _watch_dir(self, path: Path, levels: int, force: bool) -> bool:
        if path in self._by_path and not force:
            return True
        try:
            return self._add(_Watch(path, Kind.DIR, path, levels))
        except WatchLimit:
            self._fallback.adopt_dir(path, levels)
            return False

    def _watch_workspace(self, ws: Path, levels: int, force: bool) -> bool:
        """One watch: `.delta/interaction/`, or `.delta/` while there is none (to see it made).
        `.delta/` is watched first, then `interaction/` looked for: one made in between is
        seen by the one or the other; the `.delta/` watch is dropped once `interaction/` has
        its own. Returns False if it was watched."""
        self._ws_levels[ws] = levels
        self._reindex(ws)
        if self._sweeping is not None:
            self._sweeping.workspaces.add(ws)
        delta = ws / DELTA_DIR
        mailbox = _mailbox(delta)
        if (delta in self._by_path or mailbox in self._by_path) and not force:
            return False
        try:
            # Usually `interaction/` is there: watch it at once (half the system calls of
            # watching `.delta/` first; startup pays them per workspace). Else as below.
            if not self.FREE_WATCHES and self._add(_Watch(mailbox, Kind.INTERACTION, ws)):
                return True
            self._add(_Watch(delta, Kind.DELTA, ws))
            self._watch_mailbox(ws)
        except WatchLimit:
            self._unwatch_workspace(ws)
            self._fallback.adopt_workspace(ws)
        return True

    def _watch_mailbox(self, ws: Path) -> None:
        """Watch `interaction/` if it is there (a symlink too: refused, and said so), and then
        no longer `.delta/`. Raises WatchLimit."""
        delta = ws / DELTA_DIR
        mailbox = _mailbox(delta)
        watched = os.path.lexists(mailbox) and self._add(_Watch(mailbox, Kind.INTERACTION, ws))
        if not self.FREE_WATCHES:
            if watched:
                self._rm(delta)
        elif os.path.lexists(runs := delta / RUNS):
            self._add(_Watch(runs, Kind.RUNS, ws))

    def _add(self, watch: _Watch) -> bool:
        path = watch.path
        if self._max is not None and len(self._by_wd) >= self._max and path not in self._by_path:
            self._limit_reached(f"max_inotify_watches={self._max} (deltad configuration)")
        try:
            wd = self._add_watch(path, watch.kind)
        except OSError as e:
            if e.errno == errno.ENOSPC:
                self._limit_reached("fs.inotify.max_user_watches")
            if e.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                log.warning("watch_failed", path=str(path), error=e.strerror)
            self._real_dirs(watch)  # a symlink or a file in the way is said; else it is gone
            return False
        self._bind(wd, watch)
        # The kernel follows symlinks above the last component: one swapped in between the
        # look and the watch is caught here, and the path dropped (any other path on that
        # descriptor keeps it).
        if not self._real_dirs(watch):
            self._rm(path)
            return False
        return True

    def holders(self, wd: int) -> dict[Path, _Watch]:
        """Every path using descriptor `wd`, with its watch (a copy when there is one)."""
        entry = self._by_wd.get(wd)
        if entry is None:
            return {}
        return {entry.path: entry} if isinstance(entry, _Watch) else entry

    def _watch_at(self, path: Path) -> _Watch | None:
        wd = self._by_path.get(path)
        return None if wd is None else self.holders(wd).get(path)

    def _bind(self, wd: int, watch: _Watch) -> None:
        path = watch.path
        old = self._by_path.get(path)
        if old is not None and old != wd:  # replaced (the directory was made anew)
            self._unbind(path, old)
        sharing = self.holders(wd)
        if sharing and path not in sharing:
            log.info("watch_shared", path=str(path), others=sorted(str(p) for p in sharing))
        self._by_wd[wd] = (
            watch if not sharing or set(sharing) == {path} else {**sharing, path: watch}
        )
        self._by_path[path] = wd
        self._reindex(path)

    def _real_dirs(self, watch: _Watch) -> bool:
        """Are the watch's directory, and for a workspace's watch its parent too, real
        directories (not symlinks)? A workspace's refusal is logged once."""
        for path in _must_be_real(watch):
            if self._is_root(path):
                continue
            try:
                reason = refusal(os.lstat(unkept(path)).st_mode)
            except OSError:
                continue  # gone: the events of its parent say so
            if reason is not None:
                if watch.kind is not Kind.DIR:
                    self._refuse(watch.owner, path, reason)
                return False
        return True

    def _refuse(self, ws: Path, path: Path, reason: str) -> None:
        if ws in self._refused:
            return
        self._refused.add(ws)
        log.warning(
            "watch_refused", workspace=str(ws), path=str(path), reason=f"{path} is {reason}"
        )

    def _limit_reached(self, which: str) -> None:
        if not self._limit_logged:
            self._limit_logged = True
            log.error(
                "watch_limit_reached",
                limit=which,
                watches=len(self._by_wd),
                fallback="polling",
                hint=SYSCTL_HINT,
            )
        raise WatchLimit

    # -- removing watches -------------------------------------------------------------------
    def _rm(self, path: Path) -> None:
        wd = self._by_path.pop(path, None)
        if wd is None:
            return
        self._unbind(path, wd)
        self._reindex(path)
        if self._sweeping is not None:
            self._sweeping.dirs.pop(path, None)

    def _unbind(self, path: Path, wd: int) -> None:
        """`path` no longer uses `wd`; the kernel watch ends when no other path does."""
        sharing = self.holders(wd)
        if path not in sharing:
            return
        rest = [w for p, w in sharing.items() if p != path]
        if len(rest) > 1:
            self._by_wd[wd] = {w.path: w for w in rest}
            return
        if rest:
            self._by_wd[wd] = rest[0]
            return
        del self._by_wd[wd]
        with contextlib.suppress(OSError):  # already gone with its directory
            self._rm_watch(wd)

    def _rm_under(self, top: Path) -> list[Path]:
        """Drop every watch at or below `top`; return the workspaces that were there. Costs
        what is below `top`, not the number of watches: removing 1,000 of 10,000 workspaces
        is 1,000 small steps, not 1,000 scans of 30,000 watches."""
        below = self._subtree(top)
        gone = [ws for ws in below if ws in self._ws_levels]
        for ws in gone:
            self._unwatch_workspace(ws)
            self._gone_from_sweep(ws)
        for path in below:
            self._rm(path)
        return gone

    # -- the index of watched dirs and workspaces by parent ----------------------------------
    def _indexed(self, path: Path) -> bool:
        if path in self._ws_levels:
            return True
        watch = self._watch_at(path)
        return watch is not None and watch.kind is Kind.DIR

    def _reindex(self, path: Path) -> None:
        """Bring `path`'s entry in the index in line with what is watched now."""
        if self._indexed(path):
            self._kids.setdefault(path.parent, set()).add(path)
            return
        kids = self._kids.get(path.parent)
        if kids is not None:
            kids.discard(path)
            if not kids:
                del self._kids[path.parent]

    def _subtree(self, top: Path) -> list[Path]:
        """`top` and every indexed path below it (dirs are watched down to each workspace, so
        the index has no gaps between a watched directory and what is watched below it)."""
        out, stack = [], [top]
        while stack:
            path = stack.pop()
            out.append(path)
            stack.extend(self._kids.get(path, ()))
        return out

    def _drop_stale(self, layout: Layout) -> None:
        wanted_ws = layout.workspaces
        for ws in [w for w in self._ws_levels if w not in wanted_ws]:
            self._unwatch_workspace(ws)
            self._queue.put(ws)
        for path in [p for p, wd in self._by_path.items() if self.holders(wd)[p].kind is Kind.DIR]:
            if path not in layout.dirs:
                self._rm(path)

    # -- events -----------------------------------------------------------------------------
    def _event(self, wd: int, mask: int, name: str) -> None:
        if mask & F.Q_OVERFLOW:
            log.warning("inotify_overflow", action="full_reconcile")
            self._queue.request_rescan()
            return
        sharing = self.holders(wd)
        if not sharing:
            return
        if mask & F.IGNORED:
            self._forget_wd(wd, sharing)
            return
        for watch in list(sharing.values()):  # every path that reaches this directory
            if self._by_path.get(watch.path) == wd:  # not dropped by the one before
                self._route(watch, mask, name)

    def _route(self, watch: _Watch, mask: int, name: str) -> None:
        if mask & (F.DELETE_SELF | F.MOVE_SELF):
            self._self_gone(watch)
            return
        handler = {
            Kind.DIR: self._dir_event,
            Kind.DELTA: self._delta_event,
            Kind.INTERACTION: self._interaction_event,
            Kind.RUNS: self._runs_event,
        }[watch.kind]
        handler(watch, mask, name)

    def _forget_wd(self, wd: int, sharing: dict[Path, _Watch]) -> None:
        del self._by_wd[wd]
        for path in sharing:
            if self._by_path.get(path) == wd:
                del self._by_path[path]
                self._reindex(path)
        self._released(wd)

    def _self_gone(self, watch: _Watch) -> None:
        if watch.kind is Kind.DIR:
            for ws in self._rm_under(watch.path):
                self._queue.put(ws)
            if watch.path in self._roots:
                log.warning("root_gone", path=str(watch.path), action="rescan_will_retry")
        elif watch.kind is Kind.DELTA:
            self._workspace_gone(watch.owner)
        else:  # `interaction/` removed or moved away: back to watching `.delta/` for a new one
            self._rm(watch.path)
            self._rewatch(watch.owner)
            self._queue.put(watch.owner)

    def _rewatch(self, ws: Path) -> None:
        levels = self._ws_levels.get(ws)
        if levels is None:
            return
        try:
            self._add(_Watch(ws / DELTA_DIR, Kind.DELTA, ws))
            self._watch_mailbox(ws)
        except WatchLimit:
            self._unwatch_workspace(ws)
            self._fallback.adopt_workspace(ws)

    def _workspace_gone(self, ws: Path) -> None:
        self.forget(ws)
        self._queue.put(ws)

    def _dir_event(self, watch: _Watch, mask: int, name: str) -> None:
        if not mask & F.ISDIR:
            return
        child = watch.path / name
        if mask & (F.CREATE | F.MOVED_TO):
            if name == DELTA_DIR:
                self._became_workspace(watch)
            elif watch.levels > 0:
                self._discover(child, watch.levels - 1, Layout())
        elif mask & (F.DELETE | F.MOVED_FROM):
            for ws in self._rm_under(child):
                self._queue.put(ws)

    def _became_workspace(self, watch: _Watch) -> None:
        # Its own dir watch would report every file the agent creates: drop it.
        self._rm_under(watch.path)
        if self._watch_workspace(watch.path, watch.levels, force=True):
            self._queue.put(watch.path, Why.DISCOVERED)

    def _delta_event(self, watch: _Watch, mask: int, name: str) -> None:
        """`interaction/` (or, with free watches, `runs/`) made, moved or removed. Without
        free watches `.delta/` is watched only while it has no `interaction/`."""
        if not mask & F.ISDIR or name not in (MAILBOX, RUNS):
            return
        if mask & (F.CREATE | F.MOVED_TO):
            try:
                self._watch_mailbox(watch.owner)
            except WatchLimit:
                self._unwatch_workspace(watch.owner)
                self._fallback.adopt_workspace(watch.owner)
        elif mask & (F.DELETE | F.MOVED_FROM):
            # A watch follows its directory, not the path: moved into another workspace, it
            # must not keep reporting to this one. Said before the move's MOVED_TO.
            self._rm(watch.path / name)
        self._queue.put(watch.owner)

    def _runs_event(self, watch: _Watch, mask: int, name: str) -> None:
        if name == LATEST:
            self._queue.put(watch.owner)

    def _interaction_event(self, watch: _Watch, mask: int, name: str) -> None:
        if name in ANSWERS:
            if mask & (F.CLOSE_WRITE | F.MOVED_TO):
                self._queue.put(watch.owner, Why.ANSWER_CLOSED)
            elif mask & F.CREATE:
                self._queue.put(watch.owner, Why.ANSWER_CREATED)
            else:
                self._queue.put(watch.owner)
        elif name == REQUEST:
            self._queue.put(watch.owner)


class PollingLike(Protocol):
    def adopt_workspace(self, ws: Path) -> None: ...
    def adopt_dir(self, path: Path, levels: int) -> None: ...


def _exhaust(steps: Generator[Path | None, None, Layout] | Iterator[Path | None]) -> Layout:
    """Run a stepped walk to its end; its layout (or an empty one for a plain walk)."""
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value if isinstance(stop.value, Layout) else Layout()


def refusal(mode: int) -> str | None:
    """Why a directory of this (lstat) mode is not watched, or None: a real directory."""
    if stat.S_ISLNK(mode):
        return "a symlink"
    if not stat.S_ISDIR(mode):
        return "not a directory"
    return None


def _must_be_real(watch: _Watch) -> tuple[Path, ...]:
    """What must be a real directory for `watch` to watch its own path: the directory, and
    for a workspace's watch its parent (`.delta/`, or the workspace for `.delta/` itself)."""
    if watch.kind is Kind.DIR:
        return (watch.path,)
    return (watch.path.parent, watch.path)


def _mailbox(delta: Path) -> Path:
    """The one watched child of a workspace's `.delta/` directory."""
    return delta / MAILBOX


def unkept(path: Path) -> str:
    """The path as a string, not cached on the Path: a `Path` keeps its string once made, and
    a mailbox's (watched, never shown) would cost 100 bytes per workspace for the one system
    call that needs it."""
    return os.path.join(str(path.parent), path.name)
