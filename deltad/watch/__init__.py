"""How changes in workspaces reach the daemon: one `Backend` interface, three kinds.

`tree` decides which directories are watched for the event backends; `fanotify` (Linux, root),
`inotify` (Linux) and
`watchdog_observer` (everywhere else) watch them; `polling` stats them. Backends are imported
where built, so a platform without inotify never imports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .polling import PollingBackend
from .tree import Backend, PollingLike

if TYPE_CHECKING:
    from .hints import HintQueue

__all__ = ["Backend", "PollingBackend", "PollingLike", "event_backend"]


def event_backend(
    kind: str,
    queue: HintQueue,
    fallback: PollingLike,
    max_watches: int | None,
    max_per_owner: int | None = None,
) -> Backend:
    """A backend of `kind` ("fanotify", "inotify" or "watchdog") over the shared polling
    fallback; `max_per_owner`: the watches one owner's directories may take (not fanotify's:
    it has no watch per directory)."""
    if kind == "fanotify":
        from .fanotify import FanotifyBackend

        return FanotifyBackend(queue, fallback)
    if kind == "inotify":
        from .inotify import InotifyBackend

        return InotifyBackend(queue, fallback, max_watches, max_per_owner)
    from .watchdog_observer import WatchdogBackend

    return WatchdogBackend(queue, fallback, max_watches, max_per_owner)
