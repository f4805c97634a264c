"""The workspace glob matcher (token scopes and every `?workspace=` filter): tables, a property
against the regex translation it replaced (on inputs small enough for a regex), and the
adversarial patterns that used to freeze the daemon."""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deltad.api import scopes


@pytest.mark.parametrize(
    ("glob", "path", "expected"),
    [
        ("/srv/ws/*", "/srv/ws/alice", True),
        ("/srv/ws/*", "/srv/ws/alice/deep", True),  # everything below what it matches
        ("/srv/ws/*", "/srv/ws", False),
        ("/srv/ws/a*", "/srv/ws/bob/a", False),  # `*` stops at `/`
        ("/srv/ws/a?", "/srv/ws/ab", True),
        ("/srv/ws/a?", "/srv/ws/a/", False),  # `?` stops at `/`
        ("/srv/**/x", "/srv/ws/deep/x", True),  # `**` crosses it
        ("/srv/**/x", "/srv/x", False),  # `**` is characters, not a path part
        ("/srv/a**z", "/srv/ab/cz", True),
        ("/srv/ws/alice", "/srv/ws/alice2", False),
        ("/srv/ws/alice/", "/srv/ws/alice/p", True),  # a trailing `/` is the same scope
        ("/srv/ws/***", "/srv/ws/a/b", True),
        ("/srv/*/*/x", "/srv/a/b/x/y", True),
        ("/", "/anything", True),
        ("/**", "/anything/at/all", True),
        ("/srv/\udcff*", "/srv/\udcffname", True),  # undecodable bytes, surrogate-escaped
        ("/srv/ws\nx", "/srv/ws\nx", True),
    ],
)
def test_glob_table(glob: str, path: str, expected: bool) -> None:
    assert scopes.matches(glob, path) is expected


@pytest.mark.parametrize(
    ("glob", "reason"),
    [
        ("/" + "a" * scopes.MAX_GLOB_CHARS, "at most 1024 characters"),
        ("/" + "**/" * (scopes.MAX_GLOBSTARS + 1), "at most 16 '[*][*]'"),
    ],
)
def test_a_glob_too_long_or_with_too_many_globstars_is_refused(glob: str, reason: str) -> None:
    with pytest.raises(scopes.GlobError, match=reason):
        scopes.matches(glob, "/srv")
    assert not scopes.allows([glob], "/srv")  # a refused scope grants nothing


def _old_regex(glob: str) -> re.Pattern[str]:
    """The translation the matcher replaced: right, but exponential on runs of `**`."""
    out = []
    i = 0
    while i < len(glob):
        if glob.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        out.append({"*": "[^/]*", "?": "[^/]"}.get(glob[i], re.escape(glob[i])))
        i += 1
    return re.compile("".join(out) + "(?:/.*)?", re.DOTALL)


def _reference(glob: str, path: str) -> bool:
    if glob in ("/", scopes.ALL):
        return True
    return _old_regex(glob.rstrip("/") or "/").fullmatch(path) is not None


@settings(max_examples=600, deadline=None)
@given(
    glob=st.text(alphabet="/ab*?\udcff", min_size=1, max_size=9).map(lambda s: "/" + s),
    path=st.text(alphabet="/ab\udcff", max_size=10).map(lambda s: "/" + s),
)
def test_the_matcher_agrees_with_the_regex_it_replaced(glob: str, path: str) -> None:
    assert scopes.matches(glob, path) is _reference(glob, path)


@pytest.mark.parametrize(
    "glob",
    [
        "**" * 10 + "\x01",  # the query: minutes under a backtracking regex
        "/" + "**/" * scopes.MAX_GLOBSTARS + "\x01",
        "/" + "*a" * 400 + "\x01",
        "/" + "?" * 1000 + "\x01",
    ],
)
def test_adversarial_globs_finish_at_once(glob: str) -> None:
    path = "/srv/" + "a/" * 1500 + "a" * 1000
    started = time.process_time()
    for _ in range(20):
        assert not scopes.matches(glob, path)
    # Far more than it takes (milliseconds); the old regex took minutes on the first one.
    assert time.process_time() - started < 20
