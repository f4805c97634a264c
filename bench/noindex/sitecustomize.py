"""Put first on a bench daemon's PYTHONPATH (`bench/inbox_bench.py`) to run it with the inbox's
index off: the registry's change hook does nothing, so the feed keeps nothing per workspace
(no views, no listed questions or runs, no open-question map). Everything else — the HTTP
server, the registry, the watches — is the same as a normal daemon's, so the RSS difference
between the two over the same workspaces is what the index costs. Bench only."""

from pathlib import Path
from typing import Any

from deltad.daemon.feed import Feed


def _changed(self: Feed, ws: Path, before: Any, after: Any) -> None:
    return None


Feed.changed = _changed  # type: ignore[method-assign]
