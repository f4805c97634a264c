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
import time
from collections import deque
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import ClassVar, Protocol

import structlog

from deltad.protocol.layout import (
    ANSWER_FILES,
    INTERACTION_DIR,
    LIVE_FILE,
    REQUEST_FILE,
    RUNS_DIR,
)

from . import events as F
from .discovery import DELTA_DIR, Layout, is_workspace, subdirs
from .hints import HintQueue, Why

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
LIVE = LIVE_FILE  # held open by the driving client (protocol/live.py): its close is its end
MAILBOX = INTERACTION_DIR
RUNS = RUNS_DIR
LATEST = "LATEST"
# Events read and not yet handled wait in order, at most as many as the kernel's own queue holds
# by default: past that the daemon is as far behind as an overflow, and takes it as one.
BACKLOG_MAX = 16_384
EVENTS_SLICE = 0.05  # seconds of waiting events handled per loop turn
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


@dataclass(slots=True)
class _Dir:
    """A watched plain directory, and how many levels below it may still hold a workspace."""

    path: Path
    levels: int = field(default=0, compare=False)  # one directory, one watch: by path


@dataclass(frozen=True, slots=True)
class _Sub:
    """A workspace's `.delta/` or `.delta/runs/` watch (its mailbox's is the workspace's own
    path: the one almost every workspace has, at no cost beyond the table's entry)."""

    kind: Kind
    owner: Path


# Who holds a descriptor: a plain directory, a workspace (its mailbox), or a workspace's
# `.delta/` or `runs/`. No `Path` of a watched directory inside a workspace is kept: its string
# is made for the system call only (a mailbox's `Path` cost 200 bytes per workspace).
Holder = _Dir | Path | _Sub


@dataclass(slots=True)
class _Marks:
    """The descriptors of a workspace whose watches are not just its mailbox's (no
    `interaction/` yet, fanotify's three, or none: refused)."""

    delta: int | None = None
    interaction: int | None = None
    runs: int | None = None

    def get(self, kind: Kind) -> int | None:
        if kind is Kind.DELTA:
            return self.delta
        return self.runs if kind is Kind.RUNS else self.interaction

    def put(self, kind: Kind, wd: int | None) -> None:
        if kind is Kind.DELTA:
            self.delta = wd
        elif kind is Kind.RUNS:
            self.runs = wd
        else:
            self.interaction = wd


# What the table keeps per workspace: the mailbox's descriptor alone (the common case), or
# its `_Marks`.
Marks = int | _Marks


class WatchLimit(Exception):
    """The inotify watch budget is spent."""


class OwnerCap(WatchLimit):
    """One owner's share of the watches (`max_watches_per_owner`) is spent: that owner's
    further directories are polled, like what does not fit under the watch limit."""


# Never capped: root's and the daemon's own directories are the admin's.
UNCAPPED = frozenset({0, os.geteuid()})


class WatchTree:
    """The watched directories of some roots, and what their events mean. Subclasses provide
    `_add_watch`/`_rm_watch` for one directory and call `_event(wd, mask, name)` from the main
    thread (masks use inotify's bits whatever the source)."""

    name = "tree"
    # A watch costs nothing (fanotify's handle table): keep `.delta/` and `.delta/runs/` as
    # well, so that a run started by hand is known at once. Else one watch per workspace.
    FREE_WATCHES: ClassVar[bool] = False
    # `_add_watch` itself refuses a symlink or a non-directory as the last component (inotify's
    # IN_DONT_FOLLOW | IN_ONLYDIR): after a watch only its parent needs a look.
    REFUSES_LINKS: ClassVar[bool] = False

    def __init__(
        self,
        queue: HintQueue,
        fallback: PollingLike,
        max_watches: int | None,
        max_per_owner: int | None = None,
    ) -> None:
        self._queue = queue
        self._fallback = fallback
        self._max = max_watches
        # A tenant's directories each cost root a watch: at most this many per owning uid
        # (root's and the daemon's own are not counted). Only descriptors of capped owners are
        # kept here, so a table of root's workspaces pays nothing for it.
        self._per_owner_max = None if self.FREE_WATCHES else max_per_owner
        self._uid_of: dict[int, int] = {}  # descriptor -> its directory's owner (capped ones)
        self._per_owner: dict[int, int] = {}  # owner -> descriptors counted
        self._capped: dict[int, set[str]] = {}  # owner -> directories polled for the cap
        # The kernel keeps one watch per inode: two paths reaching one directory (a bind mount,
        # a directory moved while watched) share its descriptor, so a descriptor maps to every
        # holder using it, and its kernel watch ends only with the last of them. Almost always
        # one holder: that holder itself, a list only while several share it.
        self._by_wd: dict[int, Holder | list[Holder]] = {}
        # Watched plain directories, and below each parent the watched plain directories
        # (few: only those down to the discovery depth that are not workspaces).
        self._dirs: dict[Path, int] = {}
        self._subdirs: dict[Path, set[Path]] = {}
        # parent -> workspace -> its descriptors: the workspace table and the index of what is
        # below a removed directory in one (one entry per workspace, keyed by the workspace's
        # own `Path`, the one the registry keeps too).
        self._spaces: dict[Path, dict[Path, Marks]] = {}
        self._refused: set[Path] = set()  # workspaces whose refused watch is logged already
        self._roots: dict[Path, int] = {}
        self._root_names: set[str] = set()
        self._sweeping: Layout | None = None  # the layout of a sync in progress
        self._backlog: deque[RawEvent] = deque()  # read, not yet handled (`take`, `handle`)
        self._limit_logged = False
        self._failed = False

    # -- what a subclass provides ------------------------------------------------------------
    def _add_watch(self, path: str, kind: Kind) -> int:
        """Watch one directory (non-recursively); return its descriptor. Raises OSError."""
        raise NotImplementedError

    def _rm_watch(self, wd: int) -> None:
        """Stop watching; may raise OSError if the watch is already gone."""
        raise NotImplementedError

    def _is_root(self, path: str) -> bool:
        """A configured root may be a symlink (the admin's choice); nothing below one is
        followed."""
        return path in self._root_names

    def _released(self, wd: int) -> None:
        """The watch ended by itself (its directory went away): free what is left of it."""

    # -- interface ------------------------------------------------------------------------
    def add_root(self, root: Path, depth: int) -> None:
        self._roots[root] = depth
        self._root_names.add(str(root))

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
                yield from self._walk(root, root.parent, depth, layout, force=force, announce=False)
            self._drop_stale(layout)
        finally:
            if self._sweeping is layout:
                self._sweeping = None
        return layout

    def forget(self, workspace: Path) -> None:
        """The daemon found `workspace` gone. If only its `.delta/` went, the directory is
        watched again as a plain one, so that a new `.delta/` there is seen."""
        parent = workspace.parent
        if workspace not in self._spaces.get(parent, ()):
            return
        levels = self._levels(workspace, parent)
        self._unwatch_workspace(workspace, parent)
        self._gone_from_sweep(workspace)
        if workspace.is_dir():
            self._discover(workspace, parent, levels, Layout())

    def _unwatch_workspace(self, ws: Path, parent: Path) -> None:
        box = self._spaces.get(parent, {})
        marks = box.get(ws)
        if marks is None:
            return
        for kind in (Kind.DELTA, Kind.INTERACTION, Kind.RUNS):
            if _get(marks, kind) is not None:
                self._rm(_holder(ws, kind))
        del box[ws]
        if not box:
            del self._spaces[parent]
        self._refused.discard(ws)

    def _gone_from_sweep(self, workspace: Path) -> None:
        """A workspace removed while a sync is in progress is not part of its layout (one that
        only fell back to polling still is)."""
        if self._sweeping is not None:
            self._sweeping.workspaces.discard(workspace)

    def watch_count(self) -> int:
        return len(self._by_wd)

    def behind(self) -> bool:
        """Are events read and not yet handled waiting (`handle` at the next turn)?"""
        return bool(self._backlog)

    # -- what is watched (built on demand: for tests and diagnostics) ------------------------
    def paths(self) -> dict[Path, int]:
        """Every watched directory's path and its descriptor."""
        return {_path(h): wd for wd in self._by_wd for h in self._holders(wd)}

    def holders(self, wd: int) -> set[Path]:
        """Every path using descriptor `wd`."""
        return {_path(h) for h in self._holders(wd)}

    def workspaces(self) -> list[Path]:
        return [ws for box in self._spaces.values() for ws in box]

    def _holders(self, wd: int) -> list[Holder]:
        entry = self._by_wd.get(wd)
        if entry is None:
            return []
        return list(entry) if isinstance(entry, list) else [entry]

    # -- adding watches ---------------------------------------------------------------------
    def _discover(
        self,
        top: Path,
        parent: Path,
        levels: int,
        layout: Layout,
        *,
        force: bool = False,
        announce: bool = True,
    ) -> None:
        _exhaust(self._walk(top, parent, levels, layout, force=force, announce=announce))

    def _walk(
        self, top: Path, parent: Path, levels: int, layout: Layout, *, force: bool, announce: bool
    ) -> Iterator[Path | None]:
        """Watch-then-look, recursively: whatever appears after a watch is in place is reported
        by it, whatever appeared before is found by the look. One step per directory."""
        if not is_workspace(top):
            if not self._watch_dir(top, levels, force):
                yield None  # a step all the same: 60,000 polled directories are not one
                return
            if not is_workspace(top):  # a `.delta/` made meanwhile is caught by one or the other
                layout.dirs[top] = levels
                if self._sweeping is not None:
                    self._sweeping.dirs[top] = levels
                yield None
                for child in self._children(top, levels, layout):
                    yield from self._walk(
                        child, top, levels - 1, layout, force=force, announce=announce
                    )
                return
            self._rm(_Dir(top))
        layout.workspaces.add(top)
        if self._watch_workspace(top, parent, force) and announce:
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
        if path in self._dirs and not force:
            return True
        try:
            return self._add(_Dir(path, levels))
        except WatchLimit:
            self._fallback.adopt_dir(path, levels)
            return False

    def _watch_workspace(self, ws: Path, parent: Path, force: bool) -> bool:
        """One watch: `.delta/interaction/`, or `.delta/` while there is none (to see it made).
        `.delta/` is watched first, then `interaction/` looked for: one made in between is
        seen by the one or the other; the `.delta/` watch is dropped once `interaction/` has
        its own. Returns False if it was watched."""
        if self._sweeping is not None:
            self._sweeping.workspaces.add(ws)
        box = self._spaces.get(parent)
        if box is None:
            self._spaces[parent] = box = {}
        marks = box.get(ws)
        if marks is not None and _watched(marks) and not force:
            return False
        if marks is None:
            box[ws] = _Marks()
        try:
            # Usually `interaction/` is there: watch it at once (half the system calls of
            # watching `.delta/` first; startup pays them per workspace). Else as below.
            if not self.FREE_WATCHES and self._add(ws, parent):
                return True
            self._add(_Sub(Kind.DELTA, ws), parent)
            self._watch_mailbox(ws, parent)
        except WatchLimit:
            self._unwatch_workspace(ws, parent)
            self._fallback.adopt_workspace(ws)
        return True

    def _watch_mailbox(self, ws: Path, parent: Path) -> None:
        """Watch `interaction/` if it is there (a symlink too: refused, and said so), and then
        no longer `.delta/`. Raises WatchLimit."""
        watched = os.path.lexists(_where(ws)) and self._add(ws, parent)
        if not self.FREE_WATCHES:
            if watched:
                self._rm(_Sub(Kind.DELTA, ws))
        elif os.path.lexists(_where(runs := _Sub(Kind.RUNS, ws))):
            self._add(runs, parent)

    def _add(self, holder: Holder, parent: Path | None = None) -> bool:
        if (
            self._max is not None
            and len(self._by_wd) >= self._max
            and self._wd_held(holder, parent) is None
        ):
            self._limit_reached(f"max_inotify_watches={self._max} (deltad configuration)")
        kind = _kind(holder)
        where = f"{_owner(holder)}{_SUFFIX[kind]}"
        uid = self._counted_uid(holder, parent, where)
        try:
            wd = self._add_watch(where, kind)
        except OSError as e:
            if e.errno == errno.ENOSPC:
                self._limit_reached("fs.inotify.max_user_watches")
            if e.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                log.warning("watch_failed", path=where, error=e.strerror)
            self._real_dirs(holder, where, itself=True)  # a symlink or a file in the way is said
            return False
        if uid is not None and wd not in self._by_wd:  # a new kernel watch, a capped owner's
            self._uid_of[wd] = uid
            self._per_owner[uid] = self._per_owner.get(uid, 0) + 1
        self._bind(wd, holder, parent)
        # The kernel follows symlinks above the last component: one swapped in between the
        # look and the watch is caught here, and the holder dropped (any other holder of that
        # descriptor keeps it).
        if not self._real_dirs(holder, where, itself=not self.REFUSES_LINKS):
            self._rm(holder)
            return False
        return True

    def _counted_uid(self, holder: Holder, parent: Path | None, where: str) -> int | None:
        """The owner a new watch of `where` counts against, or None (no cap, already watched,
        an uncapped owner). Raises OwnerCap when that owner has its share."""
        cap = self._per_owner_max
        if cap is None or self._wd_held(holder, parent) is not None:
            return None
        try:
            uid = os.lstat(where).st_uid
        except OSError:
            return None  # the watch fails too, and says why
        if uid in UNCAPPED:
            return None
        if self._per_owner.get(uid, 0) >= cap:
            polled = self._capped.setdefault(uid, set())
            if not polled:
                log.warning(
                    "watch_owner_cap",
                    uid=uid,
                    max_watches_per_owner=cap,
                    path=where,
                    fallback="polling",
                    detail="this owner's further directories are polled",
                )
            polled.add(where)
            raise OwnerCap
        return uid

    def _disown(self, wd: int) -> None:
        """A kernel watch ended: its owner's count goes down."""
        uid = self._uid_of.pop(wd, None)
        if uid is not None:
            left = self._per_owner[uid] - 1
            if left:
                self._per_owner[uid] = left
            else:
                del self._per_owner[uid]

    def capped_owners(self) -> dict[int, dict[str, int]]:
        """Each owner that reached `max_watches_per_owner`: its watches, and how many of its
        directories are polled instead (for `deltad status`)."""
        return {
            uid: {"watches": self._per_owner.get(uid, 0), "polled": len(polled)}
            for uid, polled in self._capped.items()
        }

    def _bind(self, wd: int, holder: Holder, parent: Path | None) -> None:
        old = self._wd_held(holder, parent)
        if old is not None and old != wd:  # replaced (the directory was made anew)
            self._unbind(holder, old)
        entry = self._by_wd.get(wd)
        if entry is None or entry == holder:
            self._by_wd[wd] = holder
        else:
            sharing = entry if isinstance(entry, list) else [entry]
            if holder not in sharing:
                log.info(
                    "watch_shared",
                    path=_where(holder),
                    others=sorted(_where(h) for h in sharing),
                )
                self._by_wd[wd] = [*sharing, holder]
        self._record(holder, wd, parent)

    def _real_dirs(self, holder: Holder, where: str, *, itself: bool) -> bool:
        """Are the watched directory (if `itself`), and for a workspace's watch its parent,
        real directories (not symlinks)? A workspace's refusal is logged once."""
        for path in _must_be_real(holder, where, itself):
            if self._is_root(path):
                continue
            try:
                reason = refusal(os.lstat(path).st_mode)
            except OSError:
                continue  # gone: the events of its parent say so
            if reason is not None:
                if not isinstance(holder, _Dir):
                    self._refuse(_owner(holder), path, reason)
                return False
        return True

    def _refuse(self, ws: Path, path: str, reason: str) -> None:
        if ws in self._refused:
            return
        self._refused.add(ws)
        log.warning("watch_refused", workspace=str(ws), path=path, reason=f"{path} is {reason}")

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

    # -- the tables by holder ----------------------------------------------------------------
    def _marks(self, ws: Path, parent: Path | None) -> Marks | None:
        box = self._spaces.get(ws.parent if parent is None else parent)
        return None if box is None else box.get(ws)

    def _wd_held(self, holder: Holder, parent: Path | None = None) -> int | None:
        if isinstance(holder, _Dir):
            return self._dirs.get(holder.path)
        marks = self._marks(_owner(holder), parent)
        return None if marks is None else _get(marks, _kind(holder))

    def _record(self, holder: Holder, wd: int | None, parent: Path | None) -> None:
        """Say in the tables that `holder` uses `wd` (None: no longer watched)."""
        if isinstance(holder, _Dir):
            self._record_dir(holder.path, wd)
            return
        ws = _owner(holder)
        box = self._spaces.get(ws.parent if parent is None else parent)
        if box is None or ws not in box:
            return  # no longer a workspace of the table
        box[ws] = _put(box[ws], _kind(holder), wd)

    def _record_dir(self, path: Path, wd: int | None) -> None:
        kids = self._subdirs.get(path.parent)
        if wd is not None:
            self._dirs[path] = wd
            if kids is None:
                self._subdirs[path.parent] = kids = set()
            kids.add(path)
            return
        self._dirs.pop(path, None)
        if kids is not None:
            kids.discard(path)
            if not kids:
                del self._subdirs[path.parent]

    def _levels(self, ws: Path, parent: Path) -> int:
        """How many levels below `ws` may hold a workspace: a root's depth, else one less
        than its parent directory's."""
        if ws in self._roots:
            return self._roots[ws]
        wd = self._dirs.get(parent)
        for h in self._holders(wd) if wd is not None else ():
            if isinstance(h, _Dir) and h.path == parent:
                return h.levels - 1
        return 0

    # -- removing watches -------------------------------------------------------------------
    def _rm(self, holder: Holder) -> None:
        wd = self._wd_held(holder)
        if wd is None:
            return
        self._record(holder, None, None)
        self._unbind(holder, wd)
        if isinstance(holder, _Dir) and self._sweeping is not None:
            self._sweeping.dirs.pop(holder.path, None)

    def _unbind(self, holder: Holder, wd: int) -> None:
        """`holder` no longer uses `wd`; the kernel watch ends when no other holder does."""
        sharing = self._holders(wd)
        if holder not in sharing:
            return
        rest = [h for h in sharing if h != holder]
        if len(rest) > 1:
            self._by_wd[wd] = rest
            return
        if rest:
            self._by_wd[wd] = rest[0]
            return
        del self._by_wd[wd]
        self._disown(wd)
        with contextlib.suppress(OSError):  # already gone with its directory
            self._rm_watch(wd)

    def _rm_under(self, top: Path) -> list[Path]:
        """Drop every watch at or below `top`; return the workspaces that were there. Costs
        what is below `top`, not the number of watches: removing 1,000 of 10,000 workspaces
        is 1,000 small steps, not 1,000 scans of 30,000 watches."""
        dirs = self._dir_subtree(top)
        gone = self._spaces_below(top, dirs)
        for ws in gone:
            self._unwatch_workspace(ws, ws.parent)
            self._gone_from_sweep(ws)
        for path in dirs:
            self._rm(_Dir(path))
        return gone

    def _dir_subtree(self, top: Path) -> list[Path]:
        """`top` and every watched plain directory below it (dirs are watched down to each
        workspace, so the index has no gaps between a watched directory and what is below)."""
        out, stack = [], [top]
        while stack:
            path = stack.pop()
            out.append(path)
            stack.extend(self._subdirs.get(path, ()))
        return out

    def _spaces_below(self, top: Path, dirs: list[Path]) -> list[Path]:
        own = [top] if top in self._spaces.get(top.parent, ()) else []
        return own + [ws for d in dirs for ws in self._spaces.get(d, ())]

    def _subtree(self, top: Path) -> list[Path]:
        """`top` and every watched directory and workspace below it."""
        dirs = self._dir_subtree(top)
        return dirs + [ws for ws in self._spaces_below(top, dirs) if ws != top]

    def _drop_stale(self, layout: Layout) -> None:
        wanted_ws = layout.workspaces
        for parent, box in list(self._spaces.items()):
            for ws in [w for w in box if w not in wanted_ws]:
                self._unwatch_workspace(ws, parent)
                self._queue.put(ws)
        for path in [p for p in self._dirs if p not in layout.dirs]:
            self._rm(_Dir(path))

    # -- events -----------------------------------------------------------------------------
    def take(self, events: Iterable[RawEvent]) -> None:
        """Events just read. Those of a mailbox are handled at once (`at_once`: all they do is
        ask for a look, so an answer is not held up by a storm's events read before it); the
        rest wait, in order, for `handle`. An overflow, or more waiting than the kernel's
        queue holds, gives up what waits: lost like the events the kernel dropped, a full
        reconcile catches up (only IN_IGNORED is still handled: the kernel's watch is gone)."""
        rest: list[RawEvent] = []
        overflow = False
        by_wd = self._by_wd
        for ev in events:
            wd, mask, name = ev
            if mask & F.Q_OVERFLOW:
                overflow = True
            elif isinstance(holder := by_wd.get(wd), Path) and at_once(holder, mask):
                self._interaction_event(holder, mask, name)
            else:
                rest.append(ev)
        waiting = len(self._backlog) + len(rest)
        if not given_up(waiting, overflow, BACKLOG_MAX):
            self._backlog.extend(rest)
            return
        for wd, mask, name in (*self._backlog, *rest):
            if mask & F.IGNORED:
                self._event(wd, mask, name)
        self._backlog.clear()
        log.warning(
            "inotify_overflow",
            action="full_reconcile",
            lost="kernel" if overflow else "backlog",
            skipped=waiting,
        )
        self._queue.request_rescan()

    def handle(self, slice_s: float = EVENTS_SLICE) -> None:
        """Handle waiting events in order for at most `slice_s` seconds (the loop's other
        work, an overflow's recheck among it, goes on between the slices of a storm)."""
        backlog = self._backlog
        until = time.monotonic() + slice_s
        while backlog:
            for _ in range(min(len(backlog), 64)):
                self._event(*backlog.popleft())
            if time.monotonic() >= until:
                return

    def _event(self, wd: int, mask: int, name: str) -> None:
        if mask & F.Q_OVERFLOW:
            log.warning("inotify_overflow", action="full_reconcile")
            self._queue.request_rescan()
            return
        sharing = self._holders(wd)
        if not sharing:
            return
        if mask & F.IGNORED:
            self._forget_wd(wd, sharing)
            return
        for holder in sharing:  # every path that reaches this directory
            if self._wd_held(holder) == wd:  # not dropped by the one before
                self._route(holder, mask, name)

    def _route(self, holder: Holder, mask: int, name: str) -> None:
        if mask & (F.DELETE_SELF | F.MOVE_SELF):
            self._self_gone(holder)
        elif isinstance(holder, _Dir):
            self._dir_event(holder, mask, name)
        elif isinstance(holder, Path):
            self._interaction_event(holder, mask, name)
        elif holder.kind is Kind.DELTA:
            self._delta_event(holder.owner, mask, name)
        elif name == LATEST:  # `runs/`
            self._queue.put(holder.owner)

    def _forget_wd(self, wd: int, sharing: list[Holder]) -> None:
        del self._by_wd[wd]
        self._disown(wd)
        for holder in sharing:
            if self._wd_held(holder) == wd:
                self._record(holder, None, None)
        self._released(wd)

    def _self_gone(self, holder: Holder) -> None:
        if isinstance(holder, _Dir):
            for ws in self._rm_under(holder.path):
                self._queue.put(ws)
            if holder.path in self._roots:
                log.warning("root_gone", path=str(holder.path), action="rescan_will_retry")
        elif _kind(holder) is Kind.DELTA:
            self._workspace_gone(_owner(holder))
        else:  # `interaction/` removed or moved away: back to watching `.delta/` for a new one
            ws = _owner(holder)
            self._rm(holder)
            self._rewatch(ws)
            self._queue.put(ws)

    def _rewatch(self, ws: Path) -> None:
        parent = ws.parent
        if ws not in self._spaces.get(parent, ()):
            return
        try:
            self._add(_Sub(Kind.DELTA, ws), parent)
            self._watch_mailbox(ws, parent)
        except WatchLimit:
            self._unwatch_workspace(ws, parent)
            self._fallback.adopt_workspace(ws)

    def _workspace_gone(self, ws: Path) -> None:
        self.forget(ws)
        self._queue.put(ws)

    def _dir_event(self, d: _Dir, mask: int, name: str) -> None:
        if not mask & F.ISDIR:
            return
        child = d.path / name
        if mask & (F.CREATE | F.MOVED_TO):
            if name == DELTA_DIR:
                self._became_workspace(d)
            elif d.levels > 0:
                self._discover(child, d.path, d.levels - 1, Layout())
        elif mask & (F.DELETE | F.MOVED_FROM):
            for ws in self._rm_under(child):
                self._queue.put(ws)
            self._unpolled(child)

    def _unpolled(self, path: Path) -> None:
        """A directory went: if it was polled (past a watch limit or an owner's cap), no
        longer (a storm of renames told of 100,000 names, kept and walked for ever)."""
        self._fallback.release_dir(path)
        if self._capped:
            where = str(path)
            for polled in self._capped.values():
                polled.discard(where)

    def _became_workspace(self, d: _Dir) -> None:
        # Its own dir watch would report every file the agent creates: drop it.
        self._rm_under(d.path)
        if self._watch_workspace(d.path, d.path.parent, force=True):
            self._queue.put(d.path, Why.DISCOVERED)

    def _delta_event(self, ws: Path, mask: int, name: str) -> None:
        """`interaction/` (or, with free watches, `runs/`) made, moved or removed. Without
        free watches `.delta/` is watched only while it has no `interaction/`."""
        if not mask & F.ISDIR or name not in (MAILBOX, RUNS):
            return
        if mask & (F.CREATE | F.MOVED_TO):
            try:
                self._watch_mailbox(ws, ws.parent)
            except WatchLimit:
                self._unwatch_workspace(ws, ws.parent)
                self._fallback.adopt_workspace(ws)
        elif mask & (F.DELETE | F.MOVED_FROM):
            # A watch follows its directory, not the path: moved into another workspace, it
            # must not keep reporting to this one. Said before the move's MOVED_TO.
            self._rm(ws if name == MAILBOX else _Sub(Kind.RUNS, ws))
        self._queue.put(ws)

    def _interaction_event(self, ws: Path, mask: int, name: str) -> None:
        if name in ANSWERS:
            if mask & (F.CLOSE_WRITE | F.MOVED_TO):
                self._queue.put(ws, Why.ANSWER_CLOSED)
            elif mask & F.CREATE:
                self._queue.put(ws, Why.ANSWER_CREATED)
            else:
                self._queue.put(ws)
        elif name in (REQUEST, LIVE):  # LIVE: a client started (CREATE) or ended (its close)
            self._queue.put(ws)


class PollingLike(Protocol):
    def adopt_workspace(self, ws: Path) -> None: ...
    def adopt_dir(self, path: Path, levels: int) -> None: ...
    def release_dir(self, path: Path) -> None: ...


# One event as read: descriptor, mask, name.
RawEvent = tuple[int, int, str]


def at_once(holder: Holder | list[Holder] | None, mask: int) -> bool:
    """Is an event handled as soon as it is read, ahead of the events read before it? Yes if
    all it can do is ask for a look at one workspace: an event in a mailbox watched by that
    workspace alone (an answer, a question, a client come or gone), not the mailbox's own end
    (which changes what is watched, as every other event may: those are handled in order)."""
    return isinstance(holder, Path) and not mask & (
        F.DELETE_SELF | F.MOVE_SELF | F.IGNORED | F.Q_OVERFLOW
    )


def given_up(waiting: int, overflow: bool, limit: int = BACKLOG_MAX) -> bool:
    """Are the `waiting` events given up for a full reconcile? When the kernel lost some (an
    overflow: what waits is no better than what it dropped) or more wait than `limit`."""
    return overflow or waiting > limit


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


# -- holders: pure ---------------------------------------------------------------------------
def _holder(ws: Path, kind: Kind) -> Holder:
    return ws if kind is Kind.INTERACTION else _Sub(kind, ws)


def _kind(holder: Holder) -> Kind:
    if isinstance(holder, _Dir):
        return Kind.DIR
    return Kind.INTERACTION if isinstance(holder, Path) else holder.kind


def _owner(holder: Holder) -> Path:
    """The workspace of a workspace's watch (the directory itself for a plain one)."""
    if isinstance(holder, _Dir):
        return holder.path
    return holder if isinstance(holder, Path) else holder.owner


_SUFFIX = {
    Kind.DIR: "",
    Kind.DELTA: f"/{DELTA_DIR}",
    Kind.INTERACTION: f"/{DELTA_DIR}/{MAILBOX}",
    Kind.RUNS: f"/{DELTA_DIR}/{RUNS}",
}


def _where(holder: Holder) -> str:
    """The watched directory's path, as a string made for the system call and not kept."""
    return f"{_owner(holder)}{_SUFFIX[_kind(holder)]}"


def _path(holder: Holder) -> Path:
    return Path(_where(holder))


def _must_be_real(holder: Holder, where: str, itself: bool) -> tuple[str, ...]:
    """What must be a real directory for `holder` to watch `where`, its own path: the
    directory (if asked), and for a workspace's watch its parent (`.delta/`, or the
    workspace)."""
    if isinstance(holder, _Dir):
        return (where,) if itself else ()
    above = where.rpartition("/")[0]
    return (above, where) if itself else (above,)


def _get(marks: Marks, kind: Kind) -> int | None:
    if isinstance(marks, int):
        return marks if kind is Kind.INTERACTION else None
    return marks.get(kind)


def _put(marks: Marks, kind: Kind, wd: int | None) -> Marks:
    """`marks` with `kind` now on `wd` (None: not watched), as compact as it can be."""
    if isinstance(marks, int):
        if kind is Kind.INTERACTION and wd is not None:
            return wd
        marks = _Marks(interaction=marks)
    marks.put(kind, wd)
    if marks.interaction is not None and marks.delta is None and marks.runs is None:
        return marks.interaction
    return marks


def _watched(marks: Marks) -> bool:
    """Is the workspace watched: its mailbox, or its `.delta/` waiting for one?"""
    return isinstance(marks, int) or marks.interaction is not None or marks.delta is not None
