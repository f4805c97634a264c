"""What a tenant sends exhausts nothing shared, in-process: the `?workspace=` probe, a broken
or oversized tokens.json, logouts that cannot be evicted and a TTL that applies to sessions
already issued (ASGI in-process client, real workspace and state files)."""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from structlog.testing import capture_logs

from deltad.http import sessions
from deltad.http.app import create_app
from deltad.http.sessions import Sessions
from deltad.inbox.config import HttpConfig
from deltad.inbox.feed import Feed, View
from deltad.inbox.handlers import Context
from deltad.inbox.tokens import TokenStore
from deltad.protocol import InteractionRequest, Mailbox, Workspace
from deltad.testing.stub import paused_workspace


@dataclass
class Api:
    http: TestClient
    feed: Feed
    store: TokenStore
    root: Path

    def ask(self, name: str) -> tuple[Path, str, str]:
        """A question waiting in workspace `name`, known to the index: (ws, run id, request id)."""
        ws = self.root / name
        run_id = paused_workspace(ws)
        (ws / ".delta" / "interaction" / "request.json").unlink()
        req = InteractionRequest(run_id=run_id, action_id="act_1", prompt="?")
        Mailbox(Workspace.at(ws)).post(req)
        self.feed.index.put(View(ws, "waiting", run_id, "WAITING_FOR_INPUT", req.request_id))
        return ws, run_id, req.request_id


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    feed, store = Feed(), TokenStore(tmp_path / "state")
    ctx = Context(feed, store, HttpConfig(), os.urandom(32), base_url="http://127.0.0.1:1")
    with TestClient(create_app(ctx)) as http:
        yield Api(http, feed, store, tmp_path / "root")


# -- the probe ---------------------------------------------------------------------------------
def test_a_workspace_outside_the_scope_answers_as_one_that_is_none(api: Api) -> None:
    theirs, run_id, request_id = api.ask("bob/ws")
    token = api.store.add("alice", [str(api.root / "alice" / "**")], "answerer")
    auth = {"Authorization": f"Bearer {token}"}
    nowhere = api.root / "bob" / "nothing"
    for path in (
        f"/v1/requests/{request_id}?workspace={{}}",
        f"/v1/runs/{run_id}?workspace={{}}",
    ):
        out_of_scope = api.http.get(path.format(theirs), headers=auth)
        missing = api.http.get(path.format(nowhere), headers=auth)
        assert out_of_scope.status_code == missing.status_code == 404, path
        assert out_of_scope.json()["code"] == missing.json()["code"] == "unknown_workspace"
        # The message names the path as the caller gave it: the same words otherwise.
        assert out_of_scope.json()["error"].replace(str(theirs), "P") == missing.json()[
            "error"
        ].replace(str(nowhere), "P")
    answer = api.http.post(
        f"/v1/requests/{request_id}/answer?workspace={theirs}",
        json={"answer": "x"},
        headers={**auth, "Idempotency-Key": "k1"},
    )
    assert answer.status_code == 404 and answer.json()["code"] == "unknown_workspace"
    # The owner's own token still reaches it.
    own = api.store.add("bob", [str(api.root / "bob" / "**")], "answerer")
    mine = api.http.get(
        f"/v1/runs/{run_id}?workspace={theirs}", headers={"Authorization": f"Bearer {own}"}
    )
    assert mine.status_code == 200


# -- tokens.json -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b"[1, 2]",
        b'{"alice": {"role": "admin"}}',  # no digest
        b'{"alice": {"sha256": "ab", "role": "admin", "scopes": "/srv/**"}}',
        b" " * (4 * 1024 * 1024) + b"{}",  # over 4 MiB
    ],
    ids=["not-json", "a-list", "no-digest", "scopes-a-string", "over-4-MiB"],
)
def test_a_broken_tokens_json_is_refused_in_one_line_and_the_last_good_one_serves(
    api: Api, content: bytes
) -> None:
    token = api.store.add("alice", [], "reader")
    auth = {"Authorization": f"Bearer {token}"}
    assert api.http.get("/v1/requests", headers=auth).status_code == 200
    api.store.path.write_bytes(content)
    with capture_logs() as logs:
        for _ in range(3):
            assert api.http.get("/v1/requests", headers=auth).status_code == 200
            bad = api.http.get("/v1/requests", headers={"Authorization": "Bearer x"})
            assert bad.status_code == 401
    refused = [e for e in logs if e["event"] == "tokens_refused"]
    assert len(refused) == 1, logs  # once per change, not per request
    assert "tokens.json" in refused[0]["error"] and "\n" not in refused[0]["error"]
    # The commands refuse it in one line too.
    from deltad.inbox.tokens import TokenError

    for command in (api.store.list, lambda: api.store.revoke("alice")):
        with pytest.raises(TokenError, match=r"tokens\.json"):
            command()
    # Fixed: the new file counts at once.
    api.store.path.write_text("{}")
    assert api.http.get("/v1/requests", headers=auth).status_code == 401


def test_a_broken_tokens_json_at_startup_lets_no_one_in(api: Api) -> None:
    api.store.path.parent.mkdir(parents=True, exist_ok=True)
    api.store.path.write_bytes(b"{")
    api.store.path.chmod(0o600)
    r = api.http.get("/v1/requests", headers={"Authorization": "Bearer x"})
    assert r.status_code == 401 and r.json()["code"] == "unauthorized"


# -- sessions ----------------------------------------------------------------------------------
def pairs(s: Sessions, name: str, n: int, start: int) -> None:
    """`n` login/logout pairs by the holder of token `name`, 100 a second from `start`."""
    digest = hashlib.sha256(b"token").hexdigest()
    for i in range(n):
        cookie, _ = s.open(name, digest, now=start + i // 100)
        s.close(cookie, now=start + i // 100)


def test_what_logouts_keep_is_small_and_outlives_a_restart(tmp_path: Path) -> None:
    closed = tmp_path / sessions.CLOSED_NAME
    s = Sessions(sessions.load_key(tmp_path), 3600, closed)
    digest = hashlib.sha256(b"token").hexdigest()
    t = int(time.time())  # the file is read back at the real time
    stolen, _ = s.open("alice", digest, now=t)
    s.close(stolen, now=t)
    other, _ = s.open("bob", digest, now=t)
    pairs(s, "alice", 3 * sessions.CLOSED_PER_TOKEN, t + 1)
    doc = json.loads(closed.read_bytes())
    assert len(doc["ids"]) == sessions.CLOSED_PER_TOKEN  # at most that many per token
    cut, until = doc["before"]["alice"]  # the rest folded into one cut-off
    assert cut >= t and until >= t + 3600
    again = Sessions(sessions.load_key(tmp_path), 3600, closed)  # a restarted daemon
    assert again.get(stolen, now=t + 10) is None
    assert again.get(other, now=t + 10) is not None


def test_a_logout_outlives_a_lowered_then_raised_ttl(tmp_path: Path) -> None:
    key = sessions.load_key(tmp_path)
    closed = tmp_path / sessions.CLOSED_NAME
    digest = hashlib.sha256(b"token").hexdigest()
    t = int(time.time())
    cookie, _ = Sessions(key, 43200, closed).open("alice", digest, now=t)  # expires t + 12 h
    low = Sessions(key, 3600, closed)  # restarted with 1 h
    low.close(cookie, now=t)
    low.close(low.open("alice", digest, now=t + 7200)[0], now=t + 7200)  # prunes what expired
    high = Sessions(key, 43200, closed)  # and with 12 h again
    assert high.get(cookie, now=t + 7201) is None


def test_a_lower_ttl_shortens_sessions_already_issued(tmp_path: Path) -> None:
    key = sessions.load_key(tmp_path)
    digest = hashlib.sha256(b"token").hexdigest()
    cookie, _ = Sessions(key, 43200, None).open("alice", digest, now=1000)
    assert Sessions(key, 43200, None).get(cookie, now=1000 + 3601) is not None
    shorter = Sessions(key, 3600, None)  # restarted with session_ttl_seconds: 3600
    assert shorter.get(cookie, now=1000 + 3599) is not None
    assert shorter.get(cookie, now=1000 + 3601) is None
    # A higher TTL does not lengthen it past its own expiry.
    assert Sessions(key, 10**6, None).get(cookie, now=1000 + 43201) is None


def test_the_old_logout_file_is_still_honoured(tmp_path: Path) -> None:
    key = sessions.load_key(tmp_path)
    digest = hashlib.sha256(b"token").hexdigest()
    now = int(time.time())
    cookie, _ = Sessions(key, 3600, None).open("alice", digest, now=now)
    sid = sessions.unseal(key, cookie, now)
    assert sid is not None
    closed = tmp_path / sessions.CLOSED_NAME
    closed.write_text(json.dumps({sid.sid: now + 3600}))  # as the previous release wrote it
    s = Sessions(key, 3600, closed)
    assert s.get(cookie) is None
    other, _ = s.open("alice", digest)
    s.close(other)
    assert s.get(cookie) is None
