"""The resumes in flight, kept in the state dir so that the next daemon adopts them.

A resume runs in its own session and outlives a daemon restart. The file lets the next daemon
watch it to its exit (so the workspace is looked at the moment it ends, and never resumed twice
meanwhile). It is advisory: without it a restarted daemon still finds the run RUNNING with a
live owner, as before; so it is replaced atomically but not fsynced.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterable
from pathlib import Path

from .base import Child, Orphan

NAME = "resumes.json"
MAX_BYTES = 4 * 1024 * 1024


def save(state_dir: Path, children: Iterable[Child]) -> None:
    to_wall = time.time() - time.monotonic()
    rows = [
        {
            "workspace": str(c.workspace),
            "run_id": c.run_id,
            "pid": c.pid,
            "start_ticks": c.ticks,
            "spawned_at": c.spawned_at,
            "deadline_wall": c.deadline + to_wall,
        }
        for c in children
        if c.ticks is not None
    ]
    path = state_dir / NAME
    tmp = path.with_name(f".{NAME}.{os.getpid()}")
    with contextlib.suppress(OSError):
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(rows, f)
        os.replace(tmp, path)


def load(state_dir: Path) -> list[Orphan]:
    """What the previous daemon left; anything unreadable counts as nothing."""
    try:
        fd = os.open(state_dir / NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            rows = json.loads(f.read(MAX_BYTES))
        return [
            Orphan(
                Path(r["workspace"]),
                r["run_id"],
                int(r["pid"]),
                int(r["start_ticks"]),
                float(r["spawned_at"]),
                float(r["deadline_wall"]),
            )
            for r in rows
        ]
    except (OSError, ValueError, TypeError, KeyError):
        return []
