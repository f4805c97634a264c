"""A root in a shared, world-writable directory (`/tmp`, `/var/tmp`, `/dev/shm`, or any
directory with o+w) lets any local user plant a workspace the daemon would resume: warned
about at `deltad serve` and `deltad check` (the README says never to do this)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from deltad.protocol.printable import show_path

SHARED = (Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"))


def shared_root_problem(path: Path, mode: int | None) -> str | None:
    """Why this root (with this st_mode, None if it cannot be read) is shared, or None."""
    if path in SHARED:
        return f"root {show_path(path)} is a shared temporary directory"
    if mode is not None and mode & stat.S_IWOTH:
        sticky = " (sticky, like /tmp)" if mode & stat.S_ISVTX else ""
        return f"root {show_path(path)} is writable by every local user{sticky}"
    return None


def shared_root_warnings(roots: list[Path]) -> list[str]:
    out = []
    for root in roots:
        try:
            mode: int | None = os.stat(root).st_mode
        except OSError:
            mode = None  # a missing root is reported elsewhere
        problem = shared_root_problem(Path(os.path.normpath(root)), mode)
        if problem:
            out.append(f"{problem}: any user could plant a workspace there; use a private root")
    return out
