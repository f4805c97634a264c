"""A watch tree without a kernel: the test double of an event backend, for tests of what the
tree keeps and does (`WatchTree` decides; this only hands out descriptors and notes removals).
Events are fed with `tree._event(wd, mask, name)` as a backend's reader would."""

from __future__ import annotations

import itertools
from pathlib import Path

from deltad.watch.hints import HintQueue
from deltad.watch.tree import Kind, WatchTree


class NoFallback:
    """The polling fallback of a tree that must never reach the watch limit."""

    def adopt_workspace(self, ws: Path) -> None:
        raise AssertionError("no watch limit here")

    def adopt_dir(self, path: Path, levels: int) -> None:
        raise AssertionError("no watch limit here")

    def release_dir(self, path: Path) -> None:
        pass  # told of every directory that goes: nothing was handed over


class FakeKernelTree(WatchTree):
    """A descriptor per watch and nothing else kept for it (so a memory budget counts only the
    tree's own tables); `removed` lists the descriptors given back."""

    def __init__(self, queue: HintQueue | None = None) -> None:
        super().__init__(queue if queue is not None else HintQueue(), NoFallback(), None)
        self._wds = itertools.count(1)
        self.removed: list[int] = []

    def _add_watch(self, path: str, kind: Kind) -> int:
        return next(self._wds)

    def _rm_watch(self, wd: int) -> None:
        self.removed.append(wd)
