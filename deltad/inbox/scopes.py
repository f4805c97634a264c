"""Scopes: globs over workspace paths. `*` and `?` stop at `/`, `**` crosses it, and a scope
also covers everything below what it matches (`/srv/ws/alice` is all of alice's workspaces).

A glob is matched by simulating its automaton over the path, one character at a time, with the
set of live pattern positions held as the bits of one integer (shift-and): the work is
O(len(path)) steps of O(len(glob)/64) words each, whatever the pattern. A backtracking regex
took minutes on `"**" * 10 + "\\x01"` and held the GIL, stalling the daemon's loop with it.
Paths are plain str (undecodable bytes arrive surrogate-escaped); the matcher never decodes.

A workspace is in scope only if both the path the daemon discovered it at and its real path
match, so a symlink or `..` never carries a token outside its scope."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

ALL = "/**"
MAX_GLOB_CHARS = 1024
MAX_GLOBSTARS = 16


class GlobError(ValueError):
    """One line: why a glob is refused."""


@dataclass(frozen=True)
class Glob:
    """A compiled glob. Bit i of a state set: the first i tokens have matched so far."""

    prefix: str  # the literal start: a cheap first refusal
    literal: dict[str, int]  # char → positions whose token is that char
    any_char: int  # positions of `?`
    star: int  # positions of `*` (loops on anything but `/`)
    globstar: int  # positions of `**` (loops on anything)
    accept: int  # the bit of the last position

    @property
    def skippable(self) -> int:  # a star may match nothing
        return self.star | self.globstar

    def run(self, path: str) -> bool:
        if not path.startswith(self.prefix):
            return False
        # The literal start is matched: go on from the position after it (a list filter runs
        # this over every workspace; most of a path is its root).
        live = self._closure(1 << len(self.prefix))
        for c in path[len(self.prefix) :]:
            if c == "/" and live & self.accept:
                return True  # a scope covers everything below what it matches
            step = self.literal.get(c, 0)
            loops = self.globstar
            if c != "/":
                step |= self.any_char
                loops |= self.star
            live = self._closure(((live & step) << 1) | (live & loops))
            if not live:
                return False
        return bool(live & self.accept)

    def _closure(self, live: int) -> int:
        # Stars are never adjacent after `compile_glob`, so one skip reaches every position.
        return live | ((live & self.skippable) << 1)


def check(glob: str) -> None:
    """Refuse a glob too long or with too many `**`, with a one-line reason."""
    if len(glob) > MAX_GLOB_CHARS:
        raise GlobError(f"a workspace glob is at most {MAX_GLOB_CHARS} characters")
    if glob.count("**") > MAX_GLOBSTARS:
        raise GlobError(f"a workspace glob has at most {MAX_GLOBSTARS} '**'")


@functools.lru_cache(maxsize=1024)
def compile_glob(glob: str) -> Glob:
    check(glob)
    tokens = _tokens(glob)
    literal: dict[str, int] = {}
    any_char = star = globstar = 0
    for i, t in enumerate(tokens):
        if t == "**":
            globstar |= 1 << i
        elif t == "*":
            star |= 1 << i
        elif t == "?":
            any_char |= 1 << i
        else:
            literal[t[1]] = literal.get(t[1], 0) | 1 << i
    prefix = "".join(t[1] for t in _literal_start(tokens))
    return Glob(prefix, literal, any_char, star, globstar, 1 << len(tokens))


def _tokens(glob: str) -> list[str]:
    """`**`, `*`, `?`, or `=c` for a literal c; a run of stars is one token (`**` if any
    pair in it: `***` is `**` followed by `*`, which matches what `**` alone matches)."""
    out: list[str] = []
    i = 0
    while i < len(glob):
        if glob[i] == "*":
            j = i
            while j < len(glob) and glob[j] == "*":
                j += 1
            out.append("**" if j - i >= 2 else "*")
            i = j
            continue
        out.append("?" if glob[i] == "?" else "=" + glob[i])
        i += 1
    return out


def _literal_start(tokens: list[str]) -> list[str]:
    start = []
    for t in tokens:
        if not t.startswith("="):
            break
        start.append(t)
    return start


def normal(path: str) -> str | None:
    """An absolute path with no `.`/`..` parts, or None (never guessed at)."""
    if not path.startswith("/") or "\0" in path:
        return None
    parts = [p for p in path.split("/") if p]
    if any(p in (".", "..") for p in parts):
        return None
    return "/" + "/".join(parts)


def matches(glob: str, path: str) -> bool:
    """Whether `path` is `glob` or below it; GlobError for a refused glob."""
    if glob in ("/", ALL):
        return True
    return compile_glob(glob.rstrip("/") or "/").run(path)


def allows(scopes: list[str], path: str) -> bool:
    return allows_at(tuple(scopes), path, os.path.realpath(path))


@functools.lru_cache(maxsize=65536)
def allows_at(scopes: tuple[str, ...], path: str, real: str) -> bool:
    """`allows`, given the real path (pure, so cached: a listing checks each item once per
    token, not once per request)."""
    usable = [g for g in scopes if _usable(g)]  # a refused scope grants nothing
    return any(matches(g, path) for g in usable) and any(matches(g, real) for g in usable)


def _usable(glob: str) -> bool:
    try:
        check(glob)
    except GlobError:
        return False
    return True
