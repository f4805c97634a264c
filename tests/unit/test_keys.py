"""The daemon's HMAC keys (deltad/keys.py): made once (0600, atomically, never through a
symlink), read back in the form each file has always had, and what they sign verifies and
refuses tampering. A key file and a signature made the way the code did before keys.py still
work: a daemon upgraded in place accepts the links, sessions, reply addresses and job tags it
signed before."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import stat
from pathlib import Path

import pytest

from deltad import keys
from deltad.executors.remote import tag, tag_ok
from deltad.http import sessions
from deltad.inbox import links
from deltad.outbound import grants

KINDS = [keys.LINKS, keys.SESSIONS, keys.REPLIES, keys.EXECUTORS]


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_a_key_is_made_once_owner_only_and_read_back(tmp_path: Path, kind: keys.KeyFile) -> None:
    key = keys.load(tmp_path, kind)
    assert len(key) == keys.SIZE and keys.load(tmp_path, kind) == key
    st = os.lstat(tmp_path / kind.name)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    assert st.st_uid == os.geteuid()
    assert os.listdir(tmp_path) == [kind.name]  # nothing left aside
    raw = (tmp_path / kind.name).read_bytes()
    assert raw == (key if kind.raw else key.hex().encode())  # the form it always had


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_a_key_file_that_is_a_symlink_is_neither_followed_nor_replaced(
    tmp_path: Path, kind: keys.KeyFile
) -> None:
    (tmp_path / "elsewhere").write_bytes(b"ab" * 32)
    (tmp_path / kind.name).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError):
        keys.load(tmp_path, kind)
    assert (tmp_path / kind.name).is_symlink()


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_a_key_that_is_not_a_file_is_refused_not_waited_on(
    tmp_path: Path, kind: keys.KeyFile
) -> None:
    os.mkfifo(tmp_path / kind.name, 0o600)  # opening it for reading would block
    with pytest.raises(keys.KeyUnusable):
        keys.load(tmp_path, kind)


def test_a_shared_directory_s_key_must_be_this_user_s_own_and_private(tmp_path: Path) -> None:
    keys.load(tmp_path, keys.EXECUTORS)
    (tmp_path / keys.EXECUTORS.name).chmod(0o640)
    with pytest.raises(keys.KeyUnusable, match="mode 0600"):
        keys.load(tmp_path, keys.EXECUTORS)
    (tmp_path / keys.EXECUTORS.name).write_bytes(b"short")
    (tmp_path / keys.EXECUTORS.name).chmod(0o600)
    with pytest.raises(keys.KeyUnusable, match="too short"):
        keys.load(tmp_path, keys.EXECUTORS)


def test_a_hex_key_that_is_not_hex_is_refused(tmp_path: Path) -> None:
    (tmp_path / keys.LINKS.name).write_text("not a key")
    with pytest.raises(keys.KeyUnusable, match="hex"):
        keys.load(tmp_path, keys.LINKS)


def test_a_key_made_before_keys_py_is_read_as_it_was(tmp_path: Path) -> None:
    """The old makers wrote the hex text in place (links, sessions, reply addresses) or the raw
    bytes (executor tags): the same files are read to the same keys."""
    key = secrets.token_bytes(32)
    for kind in (keys.LINKS, keys.SESSIONS, keys.REPLIES):
        (tmp_path / kind.name).write_bytes(key.hex().encode())
        assert keys.load(tmp_path, kind) == key
    (tmp_path / keys.EXECUTORS.name).write_bytes(key)
    (tmp_path / keys.EXECUTORS.name).chmod(0o600)
    assert keys.load(tmp_path, keys.EXECUTORS) == key


KEY = bytes(range(32))


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def test_signatures_made_before_keys_py_still_verify() -> None:
    """Each kind's signature as the code computed it before (hmac.new over its own message):
    what the daemon handed out then is accepted now, and what it signs now is the same."""
    # an answer link: the body, no purpose
    body = _b64(json.dumps(["q1", 2_000_000_000, "/w"], separators=(",", ":")).encode())
    old_link = f"{body}.{_b64(hmac.new(KEY, body.encode(), hashlib.sha256).digest())}"
    assert links.verify(KEY, old_link, now=0).request_id == "q1"
    assert links.sign(KEY, "q1", "/w", 2_000_000_000, now=0) == old_link
    # a session cookie and its CSRF token: purpose NUL body
    claims = sessions.Claims("alice", "0123456789abcdef", 1000, 2_000_000_000, "sid")
    cookie = sessions.seal(KEY, claims)
    cbody = cookie.partition(".")[0]
    old_mac = hmac.new(KEY, b"session\0" + cbody.encode(), hashlib.sha256).digest()
    assert cookie == f"{cbody}.{_b64(old_mac)}"
    assert sessions.unseal(KEY, cookie, 0) == claims
    old_csrf = _b64(hmac.new(KEY, b"csrf\0" + cookie.encode(), hashlib.sha256).digest())
    assert sessions.csrf_for(KEY, cookie) == old_csrf
    # a reply address: the grant's JSON, no purpose, 80 bits in hex
    g = grants.Grant("0123456789abcdef", "q1", "/w", "a@example.org", 2e9)
    old_tok = g.id + hmac.new(KEY, g.signed(), hashlib.sha256).hexdigest()[:20]
    assert grants.token(KEY, g) == old_tok
    assert grants.check(KEY, g, old_tok, 0) == g
    # an executor tag: the parts joined by NUL, 128 bits in hex
    old_tag = hmac.new(KEY, b"deltad\0d1\x001000\0p", hashlib.sha256).hexdigest()[:32]
    assert tag(KEY, "deltad", "d1", "1000", "p") == old_tag
    assert tag_ok(KEY, old_tag, "deltad", "d1", "1000", "p")


@pytest.mark.parametrize("purpose", [None, "session"])
def test_sign_and_verify_refuse_any_change(purpose: str | None) -> None:
    mac = keys.sign(KEY, purpose, "a", b"b")
    assert keys.verify(KEY, mac, purpose, "a", b"b")
    assert not keys.verify(KEY, mac, purpose, "a", b"c")  # other data
    assert not keys.verify(KEY, mac, "csrf", "a", b"b")  # another purpose
    assert not keys.verify(bytes(32), mac, purpose, "a", b"b")  # another key
    assert not keys.verify(KEY, bytes([mac[0] ^ 1]) + mac[1:], purpose, "a", b"b")
    assert not keys.verify(KEY, mac[:16], purpose, "a", b"b")  # cut: not taken
    assert keys.verify(KEY, mac[:10], purpose, "a", b"b", size=10)
    assert not keys.verify(KEY, mac[:9], purpose, "a", b"b", size=10)


def test_tampered_tokens_are_refused() -> None:
    link = links.sign(KEY, "q1", "/w", 60, now=0)
    body, _, mac = link.partition(".")
    other = _b64(json.dumps(["q2", 60, "/w"], separators=(",", ":")).encode())
    for bad in (f"{other}.{mac}", f"{body}.{mac[:-2]}", f"{body}.", "junk", f"{body}.{mac}!"):
        with pytest.raises(links.BadLink):
            links.verify(KEY, bad, now=0)
    cookie = sessions.seal(KEY, sessions.Claims("alice", "0" * 16, 0, 60, "sid"))
    forged = sessions.seal(KEY, sessions.Claims("mallory", "0" * 16, 0, 60, "sid"))
    assert sessions.unseal(KEY, cookie, 0) is not None
    assert sessions.unseal(KEY, f"{forged.partition('.')[0]}.{cookie.partition('.')[2]}", 0) is None
    assert sessions.unseal(bytes(32), cookie, 0) is None
    g = grants.Grant("0123456789abcdef", "q1", "/w", "a@example.org", 60)
    tok = grants.token(KEY, g)
    for bad in (tok[:-1] + ("0" if tok[-1] != "0" else "1"), tok.upper(), tok[:-2]):
        with pytest.raises(grants.Unknown):
            grants.check(KEY, g, bad, 0)
    t = tag(KEY, "kubernetes", "ns", "job")
    assert not tag_ok(KEY, t.upper(), "kubernetes", "ns", "job")
    assert not tag_ok(KEY, t[:-1], "kubernetes", "ns", "job")
    assert not tag_ok(KEY, t, "kubernetes", "ns", "other")


def test_unhex_takes_only_what_hexdigest_writes() -> None:
    assert keys.unhex("00ff") == b"\x00\xff"
    assert [keys.unhex(t) for t in ("0", "00FF", "00 ff", "zz", "٠٠")] == [None] * 5
