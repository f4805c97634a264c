"""What a run's metadata says about it, decided once for both programs.

`delta` (under the workspace lock) and `deltad` (watching) must agree on what a run is: a
RUNNING run whose owner process is dead is an interrupted run, whoever notices first, and both
write the same INTERRUPTED with the same wording (`mark_owner_dead`).
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

from .metadata import transition
from .models import RunMetadata
from .process import owner_alive
from .states import RunStatus


class RunFact(StrEnum):
    WAITING = "waiting"  # a question is out
    RUNNING = "running"  # its owner is alive
    ELSEWHERE = "elsewhere"  # RUNNING on another host: not decidable here
    OWNER_DEAD = "owner_dead"  # RUNNING, but nobody runs it: to be marked INTERRUPTED
    INTERRUPTED = "interrupted"
    FINISHED = "finished"  # completed, failed or canceled


def judge(meta: RunMetadata, *, locked: bool = False) -> RunFact:
    """`locked`: the caller holds the workspace lock, so no live client can be driving the
    run and RUNNING means its owner died (whatever /proc says of a recycled pid)."""
    match meta.status:
        case RunStatus.WAITING_FOR_INPUT:
            return RunFact.WAITING
        case RunStatus.INTERRUPTED:
            return RunFact.INTERRUPTED
        case RunStatus.RUNNING if locked:
            return RunFact.OWNER_DEAD
        case RunStatus.RUNNING:
            alive = owner_alive(meta.owner)
            if alive is None:
                return RunFact.ELSEWHERE
            return RunFact.RUNNING if alive else RunFact.OWNER_DEAD
        case _:
            return RunFact.FINISHED


def owner_gone(meta: RunMetadata) -> str:
    """The one wording of a dead owner (metadata `error`, the client's journal line)."""
    who = f"process {meta.owner.pid}" if meta.owner else "its process"
    return f"{who} stopped without finishing (crash or kill -9)"


def mark_owner_dead(path: Path, meta: RunMetadata, workspace: Path) -> RunMetadata:
    """RUNNING → INTERRUPTED for a dead owner; the caller holds the workspace lock."""
    return transition(
        path, meta, RunStatus.INTERRUPTED, workspace=str(workspace), error=owner_gone(meta)
    )
