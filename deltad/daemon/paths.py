"""A workspace whose paths are computed once.

`deltad.protocol.Workspace` derives every path on each access (a handful of pathlib joins
each). A full reconcile reads about twenty of them per workspace; at 10,000 workspaces the
joins alone cost seconds of the time to READY. Same values, cached on the instance.
"""

from __future__ import annotations

from functools import cached_property

from deltad.protocol import Workspace


def _cached(prop: property) -> cached_property:
    assert prop.fget is not None
    return cached_property(prop.fget)


class CachedWorkspace(Workspace):
    # cached_property writes the instance __dict__ directly, which a frozen dataclass allows.
    delta_dir = _cached(Workspace.delta_dir)  # type: ignore[assignment]
    runs_dir = _cached(Workspace.runs_dir)  # type: ignore[assignment]
    latest_file = _cached(Workspace.latest_file)  # type: ignore[assignment]
    lock_file = _cached(Workspace.lock_file)  # type: ignore[assignment]
    interaction_dir = _cached(Workspace.interaction_dir)  # type: ignore[assignment]
    request_file = _cached(Workspace.request_file)  # type: ignore[assignment]
    response_file = _cached(Workspace.response_file)  # type: ignore[assignment]
