"""Scopes: globs over workspace paths. `*` and `?` stop at `/`, `**` crosses it, and a scope
also covers everything below what it matches (`/srv/ws/alice` is all of alice's workspaces).

A workspace is in scope only if both the path the daemon discovered it at and its real path
match, so a symlink or `..` never carries a token outside its scope."""

from __future__ import annotations

import functools
import os
import re

ALL = "/**"


@functools.lru_cache(maxsize=1024)
def _compile(glob: str) -> re.Pattern[str]:
    out, i = [], 0
    while i < len(glob):
        if glob.startswith("**", i):
            out.append(".*")
            i += 2
        elif glob[i] == "*":
            out.append("[^/]*")
            i += 1
        elif glob[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(glob[i]))
            i += 1
    return re.compile("".join(out) + "(?:/.*)?", re.DOTALL)


def normal(path: str) -> str | None:
    """An absolute path with no `.`/`..` parts, or None (never guessed at)."""
    if not path.startswith("/") or "\0" in path:
        return None
    parts = [p for p in path.split("/") if p]
    if any(p in (".", "..") for p in parts):
        return None
    return "/" + "/".join(parts)


def matches(glob: str, path: str) -> bool:
    return _compile(glob.rstrip("/") or "/").fullmatch(path) is not None or glob in ("/", ALL)


def allows(scopes: list[str], path: str) -> bool:
    real = os.path.realpath(path)
    return any(matches(g, path) for g in scopes) and any(matches(g, real) for g in scopes)
