"""Nothing a listener misses, through real daemon restarts on one state dir: a question written
while the daemon was down is announced once after it (webhook and event stream), and never
again; `Last-Event-ID` replays across a restart; a gap it cannot fill is a `reset` event; a
resume shorter than the time between two looks is still told as RUNNING, then its end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support.daemon import Daemon, answer, paused_workspace, wait_for
from tests.support.inbox import EventReader, client, http_url, make_token
from tests.support.webhooks import Receiver


def _created(receiver: Receiver) -> list[str]:
    """The workspaces of the request.created webhooks delivered so far, in order."""
    out = []
    for call in receiver.delivered():
        doc = json.loads(call.body)
        if doc["type"] == "request.created":
            out.append(Path(doc["workspace"]).name)
    return out


def _daemon(tmp: Path, root: Path, receiver: Receiver) -> Daemon:
    hook = {"url": receiver.url, "events": ["request.created"], "backoff_seconds": 0.1}
    return Daemon(tmp, [root], http={"listen": "127.0.0.1:0"}, notify={"webhooks": [hook]})


def _ids(reader: EventReader) -> list[int]:
    return [int(e["id"]) for e in reader.events]


def test_announced_once_across_restarts_and_the_stream_replays_across_them(
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    paused_workspace(root / "before")  # there before the first start ever: not announced
    with Receiver() as receiver:
        d = _daemon(tmp_path, root, receiver).start()
        token = make_token(d.state_dir, "ann")
        try:
            events = EventReader(http_url(d), token)
            paused_workspace(root / "live")
            first = events.wait(lambda e: e["type"] == "request.created", "live's question")
            wait_for(lambda: _created(receiver) == ["live"], "live's webhook")
            events.close()
        finally:
            d.stop()
        paused_workspace(root / "down")  # written while the daemon is down
        d = _daemon(tmp_path, root, receiver).start()
        try:
            url = http_url(d)
            wait_for(lambda: _created(receiver) == ["live", "down"], "down's webhook")
            # Last-Event-ID from before the restart: the events since, old and new, in order
            replay = EventReader(url, token, last_event_id=int(first["id"]) - 1)
            created = replay.wait(
                lambda e: e["type"] == "request.created" and e["workspace"].endswith("/down"),
                "down's question replayed",
            )
            kinds = [(e["type"], Path(e["workspace"]).name) for e in replay.events]
            assert kinds[0] == ("request.created", "live") and "reset" not in str(kinds)
            assert _ids(replay) == sorted(set(_ids(replay)))  # monotonic, once each
            assert int(created["id"]) > int(first["id"])
            replay.close()
            # An id older than anything kept: said with a reset, never skipped silently
            old = EventReader(url, token, last_event_id=1)
            reset = old.wait(lambda e: e["type"] == "reset", "a reset event")
            assert old.events[0] is reset and reset["last_event_id"] == 1
            old.close()
        finally:
            d.stop()
        d = _daemon(tmp_path, root, receiver).start()
        try:
            paused_workspace(root / "after")  # a fresh question: the webhook's marker
            wait_for(lambda: "after" in _created(receiver), "after's webhook")
            assert _created(receiver) == ["live", "down", "after"]  # nothing announced twice
        finally:
            d.stop()


def test_a_short_resume_is_told_as_running_then_its_end(tmp_path: Path) -> None:
    root = tmp_path / "root"
    ws = root / "ws1"
    paused_workspace(ws)
    d = Daemon(tmp_path, [root], http={"listen": "127.0.0.1:0"}).start()
    try:
        events = EventReader(http_url(d), make_token(d.state_dir, "ann"), type="run.status")
        answer(ws, "go")  # the stub's resume: RUNNING and COMPLETED between two looks
        events.wait(lambda e: e["to"] == "COMPLETED", "the run's end")
        said: list[tuple[Any, Any]] = [(e["from"], e["to"]) for e in events.events]
        assert said == [("WAITING_FOR_INPUT", "RUNNING"), ("RUNNING", "COMPLETED")]
        events.close()
    finally:
        d.stop()


def test_an_idempotent_answer_retried_after_a_restart_gets_its_first_202(tmp_path: Path) -> None:
    root = tmp_path / "root"
    ws = root / "ws1"
    paused_workspace(ws)
    rid = json.loads((ws / ".delta" / "interaction" / "request.json").read_text())["request_id"]
    d = Daemon(tmp_path, [root], http={"listen": "127.0.0.1:0"}).start()
    token = make_token(d.state_dir, "ann")
    key = {"Idempotency-Key": "retry-me"}
    try:
        with client(http_url(d), token) as http:
            path = f"/v1/requests/{rid}/answer"
            first = http.post(path, json={"answer": "yes"}, headers=key)
            assert first.status_code == 202, first.text
        d.wait_resumed(ws)  # answered and taken: the question is gone from the mailbox
    finally:
        d.stop()
    d = Daemon(tmp_path, [root], http={"listen": "127.0.0.1:0"}).start()
    try:
        with client(http_url(d), token) as http:
            again = http.post(path, json={"answer": "yes"}, headers=key)
            assert again.status_code == 202 and again.json() == first.json()
            other = http.post(path, json={"answer": "no"}, headers=key)
            assert other.status_code == 422 and other.json()["code"] == "idempotency_mismatch"
            fresh = http.post(path, json={"answer": "yes"}, headers={"Idempotency-Key": "new"})
            assert fresh.status_code in (404, 409, 410)  # a new key is a new answer: refused
    finally:
        d.stop()
