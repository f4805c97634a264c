"""The workspace glob matcher (token scopes and every `?workspace=` filter): tables and the
adversarial patterns that used to freeze the daemon. Its property against the regex translation
it replaced is a fuzz test (tests/fuzz/test_scopes_fuzz.py: deeper with the `fuzz` profile)."""

from __future__ import annotations

import time

import pytest

from deltad.inbox import scopes


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
