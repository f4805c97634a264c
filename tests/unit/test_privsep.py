"""The core's side of the split, in-process: the inbox's directory (modes, owners, what an
older deltad left in the state dir), the token file the core trusts, the environment the inbox
gets, the protocol's refusals from a table, and the replica feed."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from pathlib import Path

import pytest

from deltad import wire
from deltad.http import child, sessions
from deltad.inbox.feed import Feed, FeedEvent
from deltad.inbox.tokens import TokenStore
from deltad.privsep import core

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
        (b'{"op": "write_file", "id": 1}', "no such operation"),  # not in the table
        (b'{"op": "history", "id": 1, "token": "a", "args": {"extra": 1}}', "args.extra"),
        (b'{"op": "history", "id": 1, "token": "a", "limit": 50}', "limit"),  # beside `args`
        (b'{"op": "history", "id": 1, "token": "a", "args": []}', "args"),
        (b'{"op": "history", "id": -1, "token": "a"}', "id"),
        (b'{"op": "history", "id": 1, "token": ""}', "token"),
        (b'{"op": "history", "id": 1}', "on behalf of a token"),  # a token's operation
        (b'{"op": "check_link", "id": 1, "token": "a", "args": {"link": "x"}}', "no token"),
        (b'{"op": "history", "id": 1, "token": "a", "args": {"limit": 501}}', "limit"),
        (
            b'{"op": "answer", "id": 1, "token": "a", "args": {"request_id": "r", "body": []}}',
            "body",
        ),
        (b'{"op": "list_runs", "id": 1, "token": "a", "args": {"status": "BOGUS"}}', "status"),
        (  # an answer names the inbox's surface it came through, one of two
            b'{"op": "answer", "id": 1, "token": "a", "args": {"request_id": "r", "body": {}, '
            b'"channel": "email"}}',
            "channel",
        ),
    ],
)
def test_a_frame_that_does_not_fit_is_refused_with_a_reason(raw: bytes, why: str) -> None:
    got = core.decode(raw)
    assert isinstance(got, str) and why in got, got


@pytest.mark.parametrize("raw", [b"[" * 100_000, b'{"a":' * 100_000, b"{" * 100_000])
def test_a_frame_nested_past_any_parser_is_refused_and_names_no_call(raw: bytes) -> None:
    """The monitor reads a refused frame's call id to answer it: json's own parser raises
    RecursionError (not a ValueError) past its depth, which ended the monitor's thread."""
    assert isinstance(core.decode(raw), str)
    assert wire.call_id_of(raw) is None


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
    from deltad.http.child import relayed

    name = os.fsdecode(b"/srv/ws-\xff")
    e = FeedEvent(9, "request.created", "t", {"workspace": name, "request_id": "r"})
    frame = wire.encode(core.event_message(e))
    msg = wire.FROM_CORE.validate_json(frame[wire.HEADER.size :])
    assert isinstance(msg, wire.EventMsg)
    back = relayed(msg)
    assert back is not None and back.data["workspace"] == name and back.id == 9


@pytest.mark.spawns  # a child as the inbox user tries root's directories
def test_the_webhook_outbox_is_roots_with_the_inbox_group_and_its_files_the_inbox_users(
    tmp_path: Path,
) -> None:
    """As root, the core makes the outbox's directories (root:the inbox's group; 1770 where
    the inbox makes files) and hands each delivery to the inbox's uid."""
    _root()
    from deltad.outbound.handoff import Handoff
    from deltad.outbound.notify import new_delivery

    state = tmp_path / "state"
    inbox = core.prepare(state, INBOX)
    url = "http://127.0.0.1:9/hook"
    box = Handoff(inbox, state, [url], [10], (INBOX.uid, INBOX.gid))
    box.put(new_delivery({"id": 1, "type": "run.status"}, url, 1.0))
    box.close()
    outbox, dead = inbox / "outbox", inbox / "dead-letter"
    [target] = outbox.iterdir()
    assert _mode(outbox) == _mode(dead) == (0o750, 0, INBOX.gid)
    assert _mode(target) == _mode(target / "new") == (0o1770, 0, INBOX.gid)
    assert _mode(dead / target.name) == (0o1770, 0, INBOX.gid)
    [file] = (target / "new").iterdir()
    assert _mode(file) == (0o600, INBOX.uid, INBOX.gid)
    # As the inbox's user: it takes the file into its directory, and cannot move or remove a
    # directory of root's (so the descriptors the core holds name what they named).
    pid = os.fork()
    if pid == 0:  # the child: exits 0 only if every check holds
        ok = False
        try:
            os.chdir(inbox)  # as the inbox reaches it: by its own directory, not the path
            os.setgroups([])
            os.setgid(INBOX.gid)
            os.setuid(INBOX.uid)
            here = Path("outbox") / target.name
            os.rename(here / "new" / file.name, here / file.name)
            refused = 0
            for attempt in (
                lambda: os.rename(here / "new", here / "old"),
                lambda: os.rmdir(here / "new"),
                lambda: os.rename(here, "outbox/elsewhere"),
                lambda: os.rename(Path("dead-letter") / target.name, "dead-letter/elsewhere"),
            ):
                try:
                    attempt()
                except PermissionError:
                    refused += 1
            ok = refused == 4
        finally:
            os._exit(0 if ok else 1)
    assert os.waitpid(pid, 0)[1] == 0
    assert (target / file.name).exists() and (target / "new").is_dir()


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (
            b'{"op": "deliveries", "target": "w", "sent": -1, "retry": 0, "dead": 0, "depth": 0}',
            "sent",
        ),
        (b'{"op": "deliveries", "target": "w", "sent": 0, "retry": 0, "dead": 0}', "depth"),
        (
            b'{"op": "deliveries", "target": "w", "sent": 0, "retry": 0, "dead": 0, "depth": 0, '
            b'"x": 1}',
            "x",
        ),
        (
            b'{"op": "deliveries", "target": "w", "sent": 1e300, "retry": 0, "dead": 0, '
            b'"depth": 0}',
            "sent",
        ),
        (b'{"op": "deliveries", "sent": 0, "retry": 0, "dead": 0, "depth": 0}', "target"),
        (b'{"op": "deliveries", "delivered": 0, "retry": 0, "dead": 0, "depth": 0}', "target"),
    ],
)
def test_a_bad_delivery_count_is_refused(raw: bytes, why: str) -> None:
    got = core.decode_message(raw)
    assert isinstance(got, str) and why in got, got


def test_delivery_counts_are_no_call_and_only_what_grew_is_counted(tmp_path: Path) -> None:
    from deltad.metrics import CoreMetrics
    from deltad.outbound.handoff import Handoff

    raw = (
        b'{"op": "deliveries", "target": "webhook0", "sent": 5, "retry": 2, "dead": 1, "depth": 3}'
    )
    assert isinstance(core.decode(raw), str)  # never answered as a call
    counts = core.decode_message(raw)
    assert isinstance(counts, wire.Deliveries)
    counted = CoreMetrics().deliveries
    (tmp_path / "inbox").mkdir()
    box = Handoff(tmp_path / "inbox", tmp_path, ["http://127.0.0.1:1/"], [10], None, counted)
    box.report(counts)
    box.report(counts.model_copy(update={"sent": 1, "dead": 4, "depth": 0}))  # 5 → 1: kept
    box.connected()  # a new inbox counts from zero
    box.report(counts.model_copy(update={"sent": 2, "retry": 0, "dead": 0}))
    box.close()
    by = {
        (s.labels["target"], s.labels["kind"], s.labels["result"]): s.value
        for s in counted.collect()[0].samples
        if "_total" in s.name
    }
    assert by == {
        ("webhook0", "webhook", "sent"): 7.0,
        ("webhook0", "webhook", "retry"): 2.0,
        ("webhook0", "webhook", "dead"): 4.0,
    }
    assert box.depth == 3 and box.channel_depth == {}


class _Core:
    """What `connect_waiting` meets: no socket yet, then one nobody accepts on, then the core
    listening; each pause moves the clock and the core one step on."""

    def __init__(self, path: Path, steps: list[str]) -> None:
        self.path, self.steps, self.now, self.pauses = path, steps, 0.0, 0
        self.listening: socket.socket | None = None

    def clock(self) -> float:
        return self.now

    def pause(self, seconds: float) -> None:
        self.now += seconds
        self.pauses += 1
        step = self.steps.pop(0) if self.steps else "stay"
        if step in ("refusing", "listening"):
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(str(self.path))
            if step == "listening":
                sock.listen(1)
                self.listening = sock
            else:
                sock.close()  # the file stays, nobody accepts: ECONNREFUSED


def test_the_inbox_waits_for_the_cores_socket_until_it_accepts(tmp_path: Path) -> None:
    core_ = _Core(tmp_path / "inbox.sock", ["stay", "refusing", "stay", "listening"])
    sock = child.connect_waiting(core_.path, 120, core_.clock, core_.pause)
    with sock, core_.listening or contextlib.nullcontext():
        assert core_.pauses == 4 and sock.getpeername() == str(core_.path)


@pytest.mark.parametrize(("wait", "pauses"), [(0, 0), (1, 5)])
def test_the_inbox_gives_up_on_a_missing_core_after_its_wait(
    tmp_path: Path, wait: float, pauses: int
) -> None:
    core_ = _Core(tmp_path / "inbox.sock", [])
    with pytest.raises(FileNotFoundError):
        child.connect_waiting(core_.path, wait, core_.clock, core_.pause)
    assert core_.pauses == pauses  # every CONNECT_PAUSE (0.2 s) until the wait is over


@pytest.mark.parametrize("wait", ["-1", "nan", "1e9", "soon"])
def test_a_wait_that_is_no_number_of_seconds_is_refused(
    wait: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        child.parser().parse_args(["--connect", "/nonexistent/inbox.sock", "--wait", wait])
    assert e.value.code == 2
    assert "--wait" in capsys.readouterr().err
