"""What bounds a run: model calls (`max_iterations`) and, in a pipeline, node visits (`max_steps`).

Both are counted from the journal (THOUGHT events, NODE_START events), so a resumed process
continues the count the paused one left. Each check says, before the next call or visit, why
the run must stop there (one line, for `delta status`, stderr and the RUN_END), or None.
"""

from __future__ import annotations


def over_iterations(used: int, limit: int) -> str | None:
    """Why one more model call is refused, after `used` of `limit`."""
    if used < limit:
        return None
    return f"stopped after max_iterations ({limit}): the run made {used} model calls"


def over_steps(taken: int, limit: int) -> str | None:
    """Why one more node visit is refused, after `taken` of `limit`."""
    if taken < limit:
        return None
    return f"stopped after max_steps ({limit}): the pipeline made {taken} node visits"
