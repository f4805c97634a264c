"""Put first on a bench daemon's PYTHONPATH (`bench/inbox_bench.py`) to run it with the inbox's
index off: the registry's change hook only keeps the view in the table (the registry's
beliefs, which the index shares), so the feed keeps nothing else per workspace (no listed
questions or runs, no request-id lookup, no events). Everything else — the HTTP server, the
registry, the watches — is the same as a normal daemon's, so the RSS difference between the
two over the same workspaces is what the index costs. Bench only."""

from pathlib import Path
from typing import Any

from deltad.inbox.feed import Feed


def _changed(self: Feed, ws: Path, before: Any, after: Any) -> None:
    if after is None:
        self.index.table.pop(ws, None)
    else:
        self.index.table[ws] = after


Feed.changed = _changed  # type: ignore[method-assign]
