"""The inbox's rules in-process: which events a registry change announces, scopes, tokens,
signed links, and the API's answers (ASGI in-process client, real workspace files)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from deltad.http.app import create_app
from deltad.inbox import handlers, links, scopes
from deltad.inbox.config import HttpConfig
from deltad.inbox.feed import Feed, FeedEvent, Index, View, transitions
from deltad.inbox.handlers import ApiError, Context, holder
from deltad.inbox.tokens import TokenError, TokenStore
from deltad.protocol import InteractionRequest, Mailbox, Workspace, utcnow
from deltad.protocol.models import Option
from deltad.testing.stub import paused_workspace


# -- what a change announces -----------------------------------------------------------------------
def v(
    state: str, request_id: str | None = None, status: str | None = None, run: str = "r1"
) -> View:
    return View(Path("/ws"), state, run, status, request_id)


@pytest.mark.parametrize(
    ("before", "after", "announced", "expected"),
    [
        (None, v("waiting", "q1", "WAITING_FOR_INPUT"), None, ["request.created", "run.status"]),
        (
            v("waiting", "q1", "WAITING_FOR_INPUT"),
            v("waiting", "q1", "WAITING_FOR_INPUT"),
            "q1",
            [],
        ),
        (
            v("waiting", "q1", "WAITING_FOR_INPUT"),
            v("answered", "q1", "WAITING_FOR_INPUT"),
            "q1",
            ["request.answered"],
        ),
        (
            v("waiting", "q1", "WAITING_FOR_INPUT"),
            v("expired", "q1", "WAITING_FOR_INPUT"),
            "q1",
            ["request.expired"],
        ),
        (
            v("waiting", "q1", "WAITING_FOR_INPUT"),
            v("waiting", "q2", "WAITING_FOR_INPUT"),
            "q1",
            # the answer was taken and the run asked again: it ran in between
            ["request.answered", "request.created", "run.status", "run.status"],
        ),
        (
            v("waiting", "q1", "WAITING_FOR_INPUT"),
            v("problem", None, "WAITING_FOR_INPUT"),
            "q1",
            [],
        ),
        (v("running", None, "RUNNING"), v("done", None, "COMPLETED"), None, ["run.status"]),
    ],
)
def test_transitions(
    before: View | None, after: View, announced: str | None, expected: list[str]
) -> None:
    assert [t for t, _ in transitions(before, after, announced)] == expected


@pytest.mark.parametrize(
    ("before", "after", "statuses"),
    [
        (
            v("waiting", "q1", "WAITING_FOR_INPUT"),
            v("done", None, "COMPLETED"),
            ["RUNNING", "COMPLETED"],
        ),
        (
            v("answered", "q1", "WAITING_FOR_INPUT"),
            v("waiting", "q2", "WAITING_FOR_INPUT"),
            ["RUNNING", "WAITING_FOR_INPUT"],
        ),
        (v("interrupted", None, "INTERRUPTED"), v("done", None, "FAILED"), ["RUNNING", "FAILED"]),
        (v("waiting", "q1", "WAITING_FOR_INPUT"), v("running", None, "RUNNING"), ["RUNNING"]),
        # superseded or canceled while waiting: no run in between
        (
            v("waiting", "q1", "WAITING_FOR_INPUT"),
            v("interrupted", None, "INTERRUPTED"),
            ["INTERRUPTED"],
        ),
        (v("waiting", "q1", "WAITING_FOR_INPUT"), v("done", None, "CANCELED"), ["CANCELED"]),
        (v("waiting", "q1", "WAITING_FOR_INPUT"), v("problem", None, "WAITING_FOR_INPUT"), []),
    ],
)
def test_a_resume_between_two_looks_is_told_as_running_then_its_end(
    before: View, after: View, statuses: list[str]
) -> None:
    said = [d for t, d in transitions(before, after, None) if t == "run.status"]
    assert [d["to"] for d in said] == statuses
    assert [d["from"] for d in said] == ([before.status, *statuses[:-1]] if statuses else [])


def test_run_status_says_from_and_to_and_a_new_run_comes_from_nothing() -> None:
    [(_, data)] = transitions(v("running", status="RUNNING"), v("done", status="COMPLETED"), None)
    assert (data["from"], data["to"]) == ("RUNNING", "COMPLETED")
    other = View(Path("/ws"), "done", "r2", "COMPLETED")
    [(_, data)] = transitions(v("done", status="COMPLETED"), other, None)
    assert data["from"] is None


def test_the_feed_is_quiet_while_priming_and_replays_after_an_id() -> None:
    feed = Feed(buffer=10)
    seen: list[str] = []
    feed.subscribe(lambda e: seen.append(e.type))
    feed.priming = True
    feed.changed(Path("/ws"), None, v("waiting", "q1", "WAITING_FOR_INPUT"))
    assert seen == [] and feed.index.find("q1") == [Path("/ws")]
    feed.priming = False
    mark = feed.last_id()
    feed.changed(Path("/ws"), v("waiting", "q1"), v("answered", "q1", "WAITING_FOR_INPUT"))
    assert seen == ["request.answered", "run.status"]
    assert [e.type for e in feed.since(mark)] == seen and feed.since(None) == []
    feed.changed(Path("/ws"), v("answered", "q1"), v("done", None, "COMPLETED"))
    assert feed.index.find("q1") == [] and feed.index.closed("q1") == {Path("/ws"): False}


def test_the_index_keeps_every_workspace_holding_a_request_id() -> None:
    index = Index()
    a, b = Path("/ws/a"), Path("/ws/b")
    index.put(View(a, "waiting", "r1", "WAITING_FOR_INPUT", "q1"))
    index.put(View(b, "waiting", "r2", "WAITING_FOR_INPUT", "q1"))  # a copy: not a takeover
    assert index.find("q1") == [a, b]
    index.put(View(b, "expired", "r2", "WAITING_FOR_INPUT", "q1"))
    index.put(View(b, "running", "r2", "RUNNING"))
    assert index.find("q1") == [a] and index.closed("q1") == {b: True}
    index.remove(a)
    assert index.find("q1") == [] and index.closed("q1") == {a: False, b: True}
    index.put(View(b, "waiting", "r2", "WAITING_FOR_INPUT", "q1"))  # posted again
    assert index.find("q1") == [b] and index.closed("q1") == {a: False}


# -- scopes ----------------------------------------------------------------------------------------
def test_scopes_are_path_globs(tmp_path: Path) -> None:
    assert scopes.matches("/srv/ws/*", "/srv/ws/alice")
    assert scopes.matches("/srv/ws/alice", "/srv/ws/alice/project")  # everything below
    assert not scopes.matches("/srv/ws/a*", "/srv/ws/bob/a")
    assert scopes.matches("/srv/**/x", "/srv/ws/deep/x")
    assert not scopes.matches("/srv/ws/alice", "/srv/ws/alice2")
    assert scopes.normal("/srv/ws/../etc") is None and scopes.normal("/srv//ws/") == "/srv/ws"
    mine, theirs = tmp_path / "alice", tmp_path / "bob"
    mine.mkdir()
    theirs.mkdir()
    (mine / "sneaky").symlink_to(theirs)
    assert scopes.allows([str(mine)], str(mine))
    assert not scopes.allows([str(mine)], str(mine / "sneaky"))  # its real path is bob's


# -- tokens and links ------------------------------------------------------------------------------
def test_tokens_are_stored_as_hashes_in_a_private_file(tmp_path: Path) -> None:
    store = TokenStore(tmp_path)
    token = store.add("alice", ["/srv/ws/alice"], "answerer")
    text = store.path.read_text()
    assert token not in text and store.path.stat().st_mode & 0o777 == 0o600
    who = store.verify(token)
    assert who is not None and (who.name, who.role) == ("alice", "answerer")
    assert store.verify(token + "x") is None
    assert [t["name"] for t in store.list()] == ["alice"] and "sha256" not in store.list()[0]
    with pytest.raises(TokenError, match="exists"):
        store.add("alice", [], "reader")
    with pytest.raises(TokenError, match="name"):
        store.add("bad name", [], "reader")
    store.revoke("alice")
    assert store.verify(token) is None
    store.path.chmod(0o644)
    with pytest.raises(TokenError, match="chmod 600"):
        store.list()


def test_a_token_names_the_person_who_holds_it(tmp_path: Path) -> None:
    store = TokenStore(tmp_path)
    laptop = store.add("alice-laptop", [], "answerer", person="alice")
    plain = store.add("bob", [], "answerer")
    a, b = store.verify(laptop), store.verify(plain)
    assert a is not None and (a.name, a.voter) == ("alice-laptop", "alice")
    assert b is not None and (b.name, b.voter) == ("bob", "bob")  # by default, its name
    assert [t["person"] for t in store.list()] == ["alice", "bob"]
    with pytest.raises(TokenError, match="name"):
        store.add("carol", [], "answerer", person="not a name")


def test_signed_links_bind_a_request_in_its_workspace_and_expire() -> None:
    key = os.urandom(32)
    token = links.sign(key, "q1", "/srv/ws/bob", ttl=60, now=1000)
    link = links.verify(key, token, now=1059)
    assert (link.request_id, link.workspace) == ("q1", "/srv/ws/bob")
    with pytest.raises(links.LinkExpired):
        links.verify(key, token, now=1060)
    with pytest.raises(links.BadLink):
        links.verify(os.urandom(32), token, now=1000)
    _, mac = token.split(".")
    other = links.sign(key, "q1", "/srv/ws/mallory", ttl=60, now=1000).split(".")[0]
    with pytest.raises(links.BadLink):
        links.verify(key, f"{other}.{mac}", now=1000)
    # A link without a workspace (the old form) does not answer any copy of its id.
    old = base64.urlsafe_b64encode(json.dumps(["q1", 2000]).encode()).rstrip(b"=")
    old_mac = base64.urlsafe_b64encode(hmac.new(key, old, hashlib.sha256).digest()).rstrip(b"=")
    with pytest.raises(links.BadLink):
        links.verify(key, f"{old.decode()}.{old_mac.decode()}", now=1000)


# -- which workspace a request id means ------------------------------------------------------------
A, B = Path("/srv/ws/bob"), Path("/srv/ws/mallory")


@pytest.mark.parametrize(
    ("mine", "gone", "expected"),
    [
        ([A], {}, A),  # a scoped caller sees only its own copy (B's never counts)
        ([A, B], {}, (409, "ambiguous_request")),
        ([], {A: False}, (409, "already_answered")),
        ([], {A: True}, (410, "expired")),
        ([], {A: True, B: False}, (409, "already_answered")),
        ([], {}, (404, "unknown_request")),  # open nowhere, or only outside the scope
    ],
)
def test_a_request_id_is_served_only_where_it_is_unambiguous(
    mine: list[Path], gone: dict[Path, bool], expected: object
) -> None:
    got = holder(mine, gone, "q1")
    if isinstance(got, ApiError):
        assert (got.http, got.code) == expected
    else:
        assert got == expected


# -- the API in-process ----------------------------------------------------------------------------
@pytest.fixture
def api(tmp_path: Path) -> tuple[TestClient, Feed, TokenStore, Path]:
    feed = Feed()
    store = TokenStore(tmp_path / "state")
    ctx = Context(feed, store, HttpConfig(), os.urandom(32), base_url="http://127.0.0.1:1")
    return TestClient(create_app(ctx)), feed, store, tmp_path / "root"


def _question(ws: Path, feed: Feed, *, index: bool = True, **fields: object) -> str:
    run_id = paused_workspace(ws)
    w = Workspace.at(ws)
    mailbox = Mailbox(w)
    (ws / ".delta" / "interaction" / "request.json").unlink()
    req = InteractionRequest(run_id=run_id, action_id="act_1", **fields)  # type: ignore[arg-type]
    mailbox.post(req)
    if index:
        feed.index.put(View(ws, "waiting", run_id, "WAITING_FOR_INPUT", req.request_id))
    return req.request_id


def test_api_answers_with_the_codes_a_client_can_act_on(
    api: tuple[TestClient, Feed, TokenStore, Path],
) -> None:
    http, feed, store, root = api
    choice = _question(
        root / "a",
        feed,
        prompt="Pick",
        input_type="choice",
        options=[Option(key="R", label="Red"), Option(key="B", label="Blue")],
    )
    past = utcnow() - timedelta(seconds=5)
    late = _question(root / "b", feed, prompt="Too late?", expires_at=past)
    token = store.add("alice", [str(root)], "answerer")
    auth = {"Authorization": f"Bearer {token}"}
    assert http.get("/v1/requests").status_code == 401
    assert http.get("/v1/requests", headers={"Authorization": "Basic x"}).status_code == 401
    listed = http.get("/v1/requests", headers=auth).json()["requests"]
    assert [r["request_id"] for r in listed] == [choice]  # the expired one is not pending
    r = http.post(f"/v1/requests/{late}/answer", json={"answer": "x"}, headers=auth)
    assert r.status_code == 410 and r.json()["code"] == "expired"
    r = http.post(f"/v1/requests/{choice}/answer", json={"answer": "green"}, headers=auth)
    assert r.status_code == 422 and "is not one of the options" in r.json()["error"]
    r = http.post(f"/v1/requests/{choice}/answer", json={"answer": "b", "x": 1}, headers=auth)
    assert r.status_code == 422
    r = http.post(f"/v1/requests/{choice}/answer", json={"answer": "b"}, headers=auth)
    assert r.status_code == 202 and r.json()["answered_by"] == "alice"
    written = json.loads((root / "a" / ".delta" / "interaction" / "response.json").read_text())
    assert written["channel"] == "http" and written["answered_by"] == "alice"
    r = http.post(f"/v1/requests/{choice}/answer", json={"answer": "r"}, headers=auth)
    assert r.status_code == 409 and r.json()["code"] == "answer_waiting"
    # no server path and no command-line hint in an API's refusal
    assert "--force" not in r.json()["detail"] and str(root) not in r.json()["detail"]
    assert "/v1/requests/{request_id}/answer" in http.get("/openapi.json").json()["paths"]


def test_a_web_session_needs_its_csrf_token_and_ends_with_its_token(
    api: tuple[TestClient, Feed, TokenStore, Path],
) -> None:
    http, feed, store, root = api
    rid = _question(root / "a", feed, prompt="Name?")
    token = store.add("alice", [], "answerer")
    assert http.post("/v1/session", json={"token": "nope"}).status_code == 401
    login = http.post("/v1/session", json={"token": token})
    assert login.status_code == 200
    assert "httponly" in login.headers["set-cookie"].lower()
    assert "samesite=strict" in login.headers["set-cookie"].lower()
    csrf = login.json()["csrf"]
    assert http.get("/v1/requests").status_code == 200  # the cookie is enough to read
    r = http.post(f"/v1/requests/{rid}/answer", json={"answer": "Ada"})
    assert r.status_code == 403 and r.json()["code"] == "csrf"
    r = http.post(
        f"/v1/requests/{rid}/answer", json={"answer": "Ada"}, headers={"X-CSRF-Token": csrf}
    )
    assert r.status_code == 202
    store.revoke("alice")
    assert http.get("/v1/requests").status_code == 401


def test_notifications_skip_quiet_roots_excluded_globs_and_other_events(tmp_path: Path) -> None:
    from deltad.inbox.config import NotifyConfig
    from deltad.outbound.handoff import Handoff
    from deltad.outbound.notify import Notifier
    from deltad.outbound.outbox import load_capped, target_key

    config = NotifyConfig.model_validate(
        {
            "commands": [
                {"argv": ["true"], "events": ["request.created"], "exclude": ["/srv/ws/ci-*"]}
            ]
        }
    )
    feed = Feed()
    (tmp_path / "inbox").mkdir()
    box = Handoff(tmp_path / "inbox", tmp_path, [], [], None, channels=[("command0", 10)])
    notifier = Notifier(config, [Path("/srv/quiet")], None, box)
    wanted: list[FeedEvent] = []  # what the intake would queue: no thread started
    feed.subscribe(lambda e: wanted.extend([e] if notifier.wants(e) else []))
    for ws in ("/srv/ws/alice", "/srv/ws/ci-7", "/srv/quiet/bob"):
        feed.publish("request.created", {"workspace": ws, "request_id": "q"})
    feed.publish("run.status", {"workspace": "/srv/ws/alice", "to": "COMPLETED"})
    for e in wanted:  # the intake thread's work, done here
        notifier.take(e)
    new = tmp_path / "inbox" / "outbox" / target_key("command0") / "new"
    queued = []
    for path in sorted(new.iterdir()):  # handed to the inbox process, which runs the command
        doc = json.loads(load_capped(path).body)
        queued.append((doc["type"], doc["workspace"]))
    assert queued == [("request.created", "/srv/ws/alice")]
    box.close()


def test_a_copied_request_id_is_served_only_where_the_caller_means_it(
    api: tuple[TestClient, Feed, TokenStore, Path],
) -> None:
    http, feed, store, root = api
    bob, mallory = root / "bob", root / "mallory"
    rid = _question(bob, feed, prompt="Bob's password?")
    _question(mallory, feed, prompt="Mallory's copy", request_id=rid)
    bobs = {"Authorization": f"Bearer {store.add('bob', [str(bob)], 'answerer')}"}
    admin = {"Authorization": f"Bearer {store.add('ops', [str(root)], 'answerer')}"}
    assert http.get(f"/v1/requests/{rid}", headers=bobs).json()["prompt"] == "Bob's password?"
    r = http.post(f"/v1/requests/{rid}/answer", json={"answer": "x"}, headers=admin)
    assert r.status_code == 409 and r.json()["code"] == "ambiguous_request"
    assert r.json()["workspaces"] == sorted([str(bob), str(mallory)])
    listed = http.get("/v1/requests", headers=admin).json()["requests"]
    assert sorted(q["workspace"] for q in listed) == sorted([str(bob), str(mallory)])
    q = http.get(f"/v1/requests/{rid}", params={"workspace": str(mallory)}, headers=admin)
    assert q.json()["prompt"] == "Mallory's copy"
    r = http.post(f"/v1/requests/{rid}/answer", json={"answer": "s3cret"}, headers=bobs)
    assert r.status_code == 202 and r.json()["workspace"] == str(bob)
    assert (bob / ".delta" / "interaction" / "response.json").exists()
    assert not (mallory / ".delta" / "interaction" / "response.json").exists()


def test_an_idempotency_key_belongs_to_one_question(
    api: tuple[TestClient, Feed, TokenStore, Path],
) -> None:
    http, feed, store, root = api
    first, second = (
        _question(root / "a", feed, prompt="1?"),
        _question(root / "b", feed, prompt="2?"),
    )
    auth = {"Authorization": f"Bearer {store.add('alice', [], 'answerer')}", "Idempotency-Key": "k"}
    one = http.post(f"/v1/requests/{first}/answer", json={"answer": "Ada"}, headers=auth)
    two = http.post(f"/v1/requests/{second}/answer", json={"answer": "Ada"}, headers=auth)
    assert (one.status_code, two.status_code) == (202, 202)
    assert (one.json()["request_id"], two.json()["request_id"]) == (first, second)
    assert (root / "b" / ".delta" / "interaction" / "response.json").exists()
    again = http.post(f"/v1/requests/{first}/answer", json={"answer": "Ada"}, headers=auth)
    assert again.json() == one.json()


def test_an_answer_the_resume_would_refuse_is_not_accepted(
    api: tuple[TestClient, Feed, TokenStore, Path],
) -> None:
    http, feed, store, root = api
    rid = _question(root / "a", feed, prompt="Name?")
    auth = {"Authorization": f"Bearer {store.add('alice', [], 'answerer')}"}
    path = f"/v1/requests/{rid}/answer"
    r = http.post(path, json={"answer": "Ada", "comment": "c" * (1024 * 1024)}, headers=auth)
    assert r.status_code == 413 and r.json()["code"] == "too_large"
    r = http.post(path, json={"answer": '"' * (600 * 1024)}, headers=auth)  # escaped: > 1 MiB
    assert r.status_code == 413
    assert not (root / "a" / ".delta" / "interaction" / "response.json").exists()
    assert http.post(path, json={"answer": "Ada"}, headers=auth).status_code == 202


def test_a_question_on_disk_is_served_before_the_index_has_it(
    api: tuple[TestClient, Feed, TokenStore, Path],
) -> None:
    http, feed, store, root = api
    ws = root / "a"
    run_id = paused_workspace(ws)
    feed.index.put(View(ws, "running", run_id, "RUNNING"))  # the loop's last word
    rid = _question(ws, feed, index=False, prompt="New?")
    auth = {"Authorization": f"Bearer {store.add('alice', [], 'answerer')}"}
    assert http.get(f"/v1/requests/{rid}", headers=auth).json()["prompt"] == "New?"
    elsewhere = {"Authorization": f"Bearer {store.add('eve', ['/nowhere'], 'answerer')}"}
    assert http.get(f"/v1/requests/{rid}", headers=elsewhere).status_code == 404
    # The list is the index's: it shows the question once the loop has seen it.
    assert http.get("/v1/requests", headers=auth).json() == {"requests": [], "next": None}
    feed.index.put(View(ws, "waiting", run_id, "WAITING_FOR_INPUT", rid))
    listed = http.get("/v1/requests", headers=auth).json()["requests"]
    assert [q["request_id"] for q in listed] == [rid]
    r = http.post(f"/v1/requests/{rid}/answer", json={"answer": "yes"}, headers=auth)
    assert r.status_code == 202


def test_an_expired_question_is_410_not_answered(
    api: tuple[TestClient, Feed, TokenStore, Path],
) -> None:
    http, feed, store, root = api
    past = utcnow() - timedelta(seconds=5)
    rid = _question(root / "a", feed, prompt="Too late?", expires_at=past)
    auth = {"Authorization": f"Bearer {store.add('alice', [], 'answerer')}"}
    r = http.get(f"/v1/requests/{rid}", headers=auth)
    assert r.status_code == 410 and r.json()["code"] == "expired"
    view = feed.index.get(root / "a")
    assert view is not None
    feed.index.put(View(view.workspace, "expired", view.run_id, view.status, rid))
    feed.index.put(View(view.workspace, "running", view.run_id, "RUNNING"))  # resumed
    r = http.post(f"/v1/requests/{rid}/answer", json={"answer": "x"}, headers=auth)
    assert r.status_code == 410 and r.json()["code"] == "expired"
    # A link to it, made while it was open, says the same once the run moved on.
    ctx = http.app.state.ctx  # type: ignore[attr-defined]
    token = handlers.link_for(ctx, rid, str(root / "a")).rsplit("/", 1)[1]
    (root / "a" / ".delta" / "interaction" / "request.json").unlink()
    assert http.get(f"/v1/links/{token}").status_code == 410
    assert http.post(f"/v1/links/{token}/answer", json={"answer": "x"}).status_code == 410


def test_a_question_announced_stays_announced_while_its_workspace_shows_a_problem() -> None:
    """The announced question is the view's while it waits, and is held across a problem:
    waiting again on it says nothing; its answer after the problem is said once."""
    feed = Feed(buffer=10)
    seen: list[str] = []
    feed.subscribe(
        lambda e: (
            seen.append(f"{e.type} {e.data['request_id']}") if e.type != "run.status" else None
        )
    )
    ws, waiting = Path("/ws"), v("waiting", "q1", "WAITING_FOR_INPUT")
    broken = v("problem", "q1", "WAITING_FOR_INPUT")
    feed.changed(ws, None, waiting)
    feed.changed(ws, waiting, broken)
    feed.changed(ws, broken, broken)
    feed.changed(ws, broken, waiting)  # fixed: the same question, not a new one
    feed.changed(ws, waiting, broken)
    feed.changed(ws, broken, v("answered", "q1", "WAITING_FOR_INPUT"))
    assert seen == ["request.created q1", "request.answered q1"]
    feed.changed(ws, v("answered", "q1"), broken)  # nothing was open: nothing to hold
    feed.changed(ws, broken, v("waiting", "q2", "WAITING_FOR_INPUT"))
    assert seen[2:] == ["request.created q2"]
