"""Signed web sessions: the cookie is checked by its MAC and expiry alone (so it survives a
restart), names its token by name and digest prefix (so a revoke ends it), and a logout is
remembered across a restart."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from deltad.core.shared_roots import shared_root_problem
from deltad.http import sessions
from deltad.http.sessions import Claims, Sessions, csrf_for, matches, seal, unseal

KEY = b"k" * 32
CLAIMS = Claims("alice", "0123456789abcdef", 1000, 2000, "sid1")
GOOD = seal(KEY, CLAIMS)


@pytest.mark.parametrize(
    ("cookie", "key", "now", "expected"),
    [
        (GOOD, KEY, 1500.0, CLAIMS),
        (GOOD, KEY, 2000.0, None),  # expired
        (GOOD, b"x" * 32, 1500.0, None),  # another daemon's key
        (GOOD[:-2] + "AA", KEY, 1500.0, None),  # a changed MAC
        ("e30" + GOOD[3:], KEY, 1500.0, None),  # a changed body
        (None, KEY, 1500.0, None),
        ("", KEY, 1500.0, None),
        ("no-dot", KEY, 1500.0, None),
        ("a" * 2000, KEY, 1500.0, None),  # too long to be ours
        (seal(KEY, Claims("a", "b", 1, 2000, "s")).replace(".", ".!"), KEY, 1500.0, None),
    ],
)
def test_a_session_cookie_is_ours_untampered_and_not_expired(
    cookie: str | None, key: bytes, now: float, expected: Claims | None
) -> None:
    assert unseal(key, cookie, now) == expected


def test_a_cookie_with_a_valid_mac_but_a_foreign_shape_is_refused() -> None:
    import base64
    import hmac

    body = base64.urlsafe_b64encode(b'["alice", 1, 2, 3]').rstrip(b"=").decode()
    mac = hmac.new(KEY, b"session\0" + body.encode(), hashlib.sha256).digest()
    forged = body + "." + base64.urlsafe_b64encode(mac).rstrip(b"=").decode()
    assert unseal(KEY, forged, 0) is None


@pytest.mark.parametrize(
    ("digest", "expected"),
    [
        ("0123456789abcdef" + "0" * 48, True),
        ("0123456789abcdee" + "0" * 48, False),  # a re-made token of the same name
        ("", False),
    ],
)
def test_a_session_matches_only_the_token_it_was_opened_with(digest: str, expected: bool) -> None:
    assert matches(CLAIMS, digest) is expected


def test_the_csrf_token_is_bound_to_the_cookie_and_the_key() -> None:
    other = seal(KEY, Claims("alice", "0123456789abcdef", 1000, 2000, "sid2"))
    assert csrf_for(KEY, GOOD) == csrf_for(KEY, GOOD)
    assert csrf_for(KEY, GOOD) != csrf_for(KEY, other)
    assert csrf_for(KEY, GOOD) != csrf_for(b"x" * 32, GOOD)


def test_sessions_and_logouts_outlive_a_restart(tmp_path: Path) -> None:
    key = sessions.load_key(tmp_path)
    assert sessions.load_key(tmp_path) == key
    assert (tmp_path / sessions.KEY_NAME).stat().st_mode & 0o777 == 0o600
    closed = tmp_path / sessions.CLOSED_NAME
    first = Sessions(key, 3600, closed)
    digest = hashlib.sha256(b"token").hexdigest()
    kept, csrf = first.open("alice", digest)
    gone, _ = first.open("alice", digest)
    first.close(gone)
    assert closed.stat().st_mode & 0o777 == 0o600
    again = Sessions(sessions.load_key(tmp_path), 3600, closed)  # a restarted daemon
    claims = again.get(kept)
    assert claims is not None and claims.name == "alice" and matches(claims, digest)
    assert again.csrf(kept) == csrf
    assert again.get(gone) is None


@pytest.mark.parametrize(
    ("path", "mode", "warned"),
    [
        ("/tmp", 0o41777, "shared temporary directory"),
        ("/var/tmp", 0o41777, "shared temporary directory"),
        ("/dev/shm", 0o41777, "shared temporary directory"),
        ("/srv/ws", 0o41777, "every local user (sticky, like /tmp)"),
        ("/srv/ws", 0o40777, "every local user"),
        ("/srv/ws", 0o40775, None),
        ("/srv/ws", 0o40700, None),
        ("/srv/ws", None, None),
        ("/tmp/pytest-of-root/x", 0o40700, None),  # a private directory under /tmp is fine
    ],
)
def test_a_shared_world_writable_root_is_named(
    path: str, mode: int | None, warned: str | None
) -> None:
    problem = shared_root_problem(Path(path), mode)
    assert (problem is None) if warned is None else (problem and warned in problem)
