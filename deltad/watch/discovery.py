"""Finding workspaces: directories up to `depth` levels under a root (the root itself is level 0)
that contain a `.delta/` directory.

The walk never enters a workspace: what is inside belongs to its agent, and watching it would
make the daemon's cost grow with the agent's files. So nested workspaces are not discovered.
Symlinked directories are not followed (a link loop or a link to `/` must not be walked).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from deltad.protocol.layout import ANSWER_FILES, INTERACTION_DIR, REQUEST_FILE
from deltad.protocol.layout import DELTA_DIR as DELTA_DIR


@dataclass
class Layout:
    """What a walk found: workspaces, and the non-workspace dirs that a watcher must watch to
    see new workspaces appear (mapped to how many levels below them may still hold one)."""

    workspaces: set[Path] = field(default_factory=set)
    dirs: dict[Path, int] = field(default_factory=dict)
    problems: list[tuple[Path, str]] = field(default_factory=list)

    def merge(self, other: Layout) -> None:
        self.workspaces |= other.workspaces
        self.dirs.update(other.dirs)
        self.problems.extend(other.problems)


def is_workspace(path: Path) -> bool:
    try:  # a string join: this runs for every workspace in every full reconcile
        return stat.S_ISDIR(os.lstat(f"{path}/{DELTA_DIR}").st_mode)
    except OSError:
        return False


def subdirs(path: Path) -> list[Path]:
    # `path / name` parses the name only, not each child's whole path again.
    with os.scandir(path) as it:
        return [
            path / e.name for e in it if e.name != DELTA_DIR and e.is_dir(follow_symlinks=False)
        ]


def walk(top: Path, levels_left: int, layout: Layout | None = None) -> Layout:
    """Walk `top` (which may itself be a workspace) down `levels_left` more levels."""
    layout = layout if layout is not None else Layout()
    if is_workspace(top):
        layout.workspaces.add(top)
        return layout
    try:
        if not stat.S_ISDIR(os.lstat(top).st_mode):
            return layout
        children = subdirs(top) if levels_left > 0 else []
    except FileNotFoundError:
        return layout  # deleted while we looked: nothing to watch
    except OSError as e:
        layout.problems.append((top, e.strerror or str(e)))
        return layout
    layout.dirs[top] = levels_left
    for child in children:
        walk(child, levels_left - 1, layout)
    return layout


def mailbox_names(ws: Path) -> frozenset[str] | None:
    """The names in a workspace's `.delta/interaction/` (one listing, no stat, no read), or
    None if there is none or it cannot be listed. A plain listing: no DirEntry objects, no
    generator (whose two resumptions per call a profile counts as two calls)."""
    try:
        return frozenset(os.listdir(f"{ws}/{DELTA_DIR}/{INTERACTION_DIR}"))
    except OSError:
        return None


def unanswered(names: frozenset[str] | None) -> bool:
    """A question is posted and no answer file is there: nothing in the workspace needs the
    daemon until an answer arrives (an event says so) or the question's deadline passes
    (found when `request.json` is read, lazily). Anything else is looked at in full."""
    return names is not None and REQUEST_FILE in names and names.isdisjoint(ANSWER_FILES)
