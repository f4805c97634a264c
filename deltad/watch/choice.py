"""Which watch backend `backend: auto` takes for each root (docs/daemon.md, "Backends").

inotify when the watches a root needs fit what is left of the kernel's per-user budget with a
quarter to spare (measured at 100,000 workspaces it beats the fanotify mark on READY, memory
and idle CPU: the mark sees every write on the whole filesystem); the fanotify filesystem mark
(root, Linux >= 5.9) when they do not; else inotify, polling what does not fit.

`choose_backend` is the decision, pure; the rest gathers its facts cheaply (READY is timed):
one `scandir` of each level down to the discovery depth, looking into at most `SAMPLE`
directories of a level and scaling (one `scandir` of 100,000 workspaces: ~40 ms).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from deltad.protocol.layout import DELTA_DIR

Choice = Literal["fanotify", "inotify", "watchdog"]
SAMPLE = 32  # directories of one level looked into; the rest counted like them
MAX_LOOKS = 4096  # directories looked into per root, whatever the depth
MAX_USER_WATCHES = Path("/proc/sys/fs/inotify/max_user_watches")


@dataclass(frozen=True)
class RootFacts:
    """What the choice for one root depends on."""

    linux: bool
    watches_needed: int  # inotify watches this root would take (an estimate)
    watches_left: int | None  # of the budget, after the roots before it; None: unknown
    fanotify_problem: str | None  # why a filesystem mark cannot watch it; None: it can


def fits(needed: int, left: int) -> bool:
    """With a quarter to spare: the fleet may grow before the rest has to be polled."""
    return needed + needed // 4 <= left


def choose_backend(facts: RootFacts) -> tuple[Choice, str]:
    """The backend for one `auto` root, and why (one line, for the log and `deltad check`)."""
    if not facts.linux:
        return "watchdog", "not Linux: watchdog's native observer"
    need, left = facts.watches_needed, facts.watches_left
    if left is None:
        return "inotify", f"~{need} inotify watches needed; the kernel's limit is unknown"
    if fits(need, left):
        return "inotify", f"~{need} inotify watches fit the {left} left with a quarter to spare"
    short = f"~{need} inotify watches do not fit the {left} left with a quarter to spare"
    if facts.fanotify_problem is None:
        return "fanotify", f"{short}: one fanotify filesystem mark instead"
    return "inotify", f"{short}, and no fanotify ({facts.fanotify_problem}): the rest is polled"


def scaled(count: int, looked: list[int]) -> int:
    """`count` directories of one level, of which those `looked` into need these watches."""
    if not looked:
        return count
    if len(looked) == count:
        return sum(looked)
    return (count * sum(looked) + len(looked) - 1) // len(looked)  # rounded up


def estimate_watches(root: Path, depth: int) -> int:
    """The inotify watches `root` needs, as the watch tree takes them: one per workspace and
    one per other directory down to `depth`. Looks into at most `SAMPLE` directories of a
    level (evenly spread) and `MAX_LOOKS` in all; a missing root needs none yet."""
    looks = [MAX_LOOKS]

    def count(path: str, levels_left: int) -> int:
        if _is_workspace(path) or levels_left == 0 or looks[0] <= 0:
            return 1
        looks[0] -= 1
        try:
            with os.scandir(path) as it:
                kids = [
                    e.path for e in it if e.name != DELTA_DIR and e.is_dir(follow_symlinks=False)
                ]
        except OSError:
            return 1
        step = max(1, len(kids) // SAMPLE)
        return 1 + scaled(len(kids), [count(k, levels_left - 1) for k in kids[::step][:SAMPLE]])

    return count(str(root), depth) if root.is_dir() else 0


def _is_workspace(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(f"{path}/{DELTA_DIR}").st_mode)
    except OSError:
        return False


def watch_limit() -> int | None:
    """fs.inotify.max_user_watches, or None where there is none to read."""
    try:
        return int(MAX_USER_WATCHES.read_text())
    except (OSError, ValueError):
        return None


def inotify_watches_in_use(uid: int, skip_pid: int | None = None) -> int:
    """The inotify watches of `uid`'s processes (but `skip_pid`'s): one `inotify wd:` line each
    in the fdinfo of their inotify descriptors (only those are read). Processes we cannot see
    count 0."""
    total = 0
    for pid in (p for p in os.listdir("/proc") if p.isdigit() and p != str(skip_pid)):
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") != "anon_inode:inotify":
                    continue
                with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                    total += sum(line.startswith("inotify wd:") for line in f)
            except OSError:
                continue
    return total


def watch_budget(own_cap: int | None) -> int | None:
    """The inotify watches this daemon may still take: the kernel's per-user limit less what
    this user's other processes hold (a reload's own watches are about to be released), and
    no more than the config's `max_inotify_watches`. None: no limit known."""
    limit = watch_limit()
    if limit is not None:
        limit -= inotify_watches_in_use(os.geteuid(), skip_pid=os.getpid())
    if own_cap is not None:
        limit = own_cap if limit is None else min(limit, own_cap)
    return limit


@dataclass(frozen=True)
class PlannedRoot:
    path: Path
    backend: str  # as configured: "auto" or a backend's name


def plan(
    roots: list[PlannedRoot],
    depth: int,
    own_cap: int | None,
    linux: bool,
    probe: Callable[[Path], str | None],
) -> list[tuple[str, str, int]]:
    """(backend, why, inotify watches needed) per root, in order. The roots share the budget:
    those configured to spend inotify watches take theirs first, then each `auto` root in
    turn. A root not `auto` keeps its backend ("configured")."""
    if not any(r.backend == "auto" for r in roots):
        return [(r.backend, "configured", 0) for r in roots]
    spends = ("inotify", "watchdog") if linux else ()
    left = watch_budget(own_cap) if linux else None
    counted = ("auto", *spends) if linux else ()  # off Linux: watchdog, no count needed
    needs = [estimate_watches(r.path, depth) if r.backend in counted else 0 for r in roots]
    for r, need in zip(roots, needs, strict=True):
        if left is not None and r.backend in spends:
            left -= need
    out: list[tuple[str, str, int]] = []
    for r, need in zip(roots, needs, strict=True):
        if r.backend != "auto":
            out.append((r.backend, "configured", need))
            continue
        problem = probe(r.path) if linux else "not Linux"
        name, why = choose_backend(RootFacts(linux, need, left, problem))
        if left is not None and name == "inotify":
            left -= need
        out.append((name, why, need))
    return out
