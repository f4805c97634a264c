"""The core's side of the split, in-process: the inbox's directory (modes, owners, what an
older deltad left in the state dir), the token file the core trusts, the environment the inbox
gets, the protocol's refusals from a table, and the replica feed."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from deltad.api import sessions
from deltad.api.tokens import TokenStore
from deltad.inbox.feed import Feed, FeedEvent
from deltad.privsep import core, wire

INBOX = core.Account("deltad-inbox-test", 4242, 4343)  # ids nobody has: chown takes them


def _root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: files are handed to another uid")


def _mode(p: Path) -> tuple[int, int, int]:
    st = os.lstat(p)
    return stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid


def test_the_inbox_directory_is_roots_shared_with_the_inbox_group_and_sticky(
    tmp_path: Path,
) -> None:
    _root()
    state = tmp_path / "state"
    state.mkdir()
    old = TokenStore(state)  # an older deltad: tokens.json in the state dir itself
    old.add("alice", [], "answerer")
    (state / sessions.KEY_NAME).write_text("ab" * 32)
    os.chmod(state / sessions.KEY_NAME, 0o600)
    d = core.prepare(state, INBOX)
    assert d == state / "inbox"
    assert _mode(d) == (0o1770, 0, INBOX.gid)
    assert _mode(d / "tokens.json") == (0o640, 0, INBOX.gid)
    assert _mode(d / sessions.KEY_NAME) == (0o600, INBOX.uid, INBOX.gid)
    assert not (state / "tokens.json").exists() and not (state / sessions.KEY_NAME).exists()
    # The core trusts the moved file; the inbox's reads of it see alice too.
    assert TokenStore(d, owner=0).by_name("alice") is not None
    # `deltad token add` afterwards: root's 0640, group the inbox's, at once.
    TokenStore(d).add("bob", [], "reader")
    assert _mode(d / "tokens.json") == (0o640, 0, INBOX.gid)
    assert core.prepare(state, INBOX) == d  # again: nothing changes


def test_what_the_inbox_planted_is_never_chowned_or_followed(tmp_path: Path) -> None:
    _root()
    state = tmp_path / "state"
    d = core.prepare(state, INBOX)
    secret = tmp_path / "shadow"
    secret.write_text("root's")
    os.chmod(secret, 0o600)
    os.symlink(secret, d / "tokens.json")
    os.link(secret, d / sessions.CLOSED_NAME)  # a hard link to a file of root's
    core.prepare(state, INBOX)
    assert _mode(secret) == (0o600, 0, 0)


def test_the_core_refuses_a_token_file_it_does_not_own(tmp_path: Path) -> None:
    _root()
    d = core.prepare(tmp_path / "state", INBOX)
    TokenStore(d).add("alice", [], "admin")
    os.chown(d / "tokens.json", INBOX.uid, INBOX.gid)  # as if the inbox had made it
    # refused in one log line, and nobody is let in by it (no good table was ever read)
    assert TokenStore(d, owner=0).by_name("alice") is None
    assert TokenStore(d).by_name("alice") is not None  # an owner-blind reader would take it


def test_not_root_the_directory_is_the_daemons_own(tmp_path: Path) -> None:
    d = core.prepare(tmp_path / "state", None)
    assert _mode(d) == (0o700, os.geteuid(), os.getegid())


def test_the_inbox_gets_an_allowlisted_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.setenv("DELTA_API_KEY", "secret")
    monkeypatch.setenv("LANG", "en_GB.UTF-8")
    monkeypatch.delenv(core.TEST_HOOK_ENV, raising=False)
    env = core.child_env()
    assert env["LANG"] == "en_GB.UTF-8" and "PATH" in env
    assert set(env) <= {"PATH", "LANG", *core.ENV_KEPT}
    assert not any("secret" in v for v in env.values())


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"", "(frame)"),
        (b"[]", "(frame)"),
        (b'{"op": "hello", "version": 1}', "hello again"),
        (b'{"op": "write_file", "id": 1}', "does not match any of the expected tags"),
        (b'{"op": "history", "id": 1, "token": "a", "extra": 1}', "extra"),
        (b'{"op": "history", "id": -1, "token": "a"}', "id"),
        (b'{"op": "history", "id": 1, "token": ""}', "token"),
        (b'{"op": "history", "id": 1, "token": "a", "limit": 501}', "limit"),
        (b'{"op": "answer", "id": 1, "token": "a", "request_id": "r", "body": []}', "body"),
        (b'{"op": "list_runs", "id": 1, "token": "a", "status": "BOGUS"}', "status"),
        (  # an answer names the inbox's surface it came through, one of two
            b'{"op": "answer", "id": 1, "token": "a", "request_id": "r", "body": {}, '
            b'"channel": "email"}',
            "channel",
        ),
    ],
)
def test_a_frame_that_does_not_fit_is_refused_with_a_reason(raw: bytes, why: str) -> None:
    got = core.decode(raw)
    assert isinstance(got, str) and why in got, got


def test_the_replica_feed_takes_the_cores_ids_once_each() -> None:
    feed = Feed(buffer=10)
    seen: list[int] = []
    feed.subscribe(lambda e: seen.append(e.id))
    events = [FeedEvent(i, "run.status", "t", {"workspace": "/w"}) for i in (5, 6, 7)]
    assert [feed.relay(e) for e in events] == [True, True, True]
    assert [feed.relay(e) for e in events[1:]] == [False, False]  # the buffer sent again
    assert seen == [5, 6, 7] and [e.id for e in feed.since(5)] == [6, 7]
    assert feed.last_id() == 7


def test_an_event_crosses_with_its_workspace_name_in_bytes() -> None:
    from deltad.privsep.child import relayed

    name = os.fsdecode(b"/srv/ws-\xff")
    e = FeedEvent(9, "request.created", "t", {"workspace": name, "request_id": "r"})
    frame = wire.encode(core.event_message(e))
    msg = wire.FROM_CORE.validate_json(frame[wire.HEADER.size :])
    assert isinstance(msg, wire.EventMsg)
    back = relayed(msg)
    assert back is not None and back.data["workspace"] == name and back.id == 9
