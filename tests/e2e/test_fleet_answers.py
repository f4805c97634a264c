"""Decisions at fleet scale: one answer for many questions (`POST /v1/answers`, `delta respond
--all-under`), each checked and resumed on its own, exactly once; and a question handed to
another token, recorded beside it and honoured by the respondents' check. A real `deltad
serve` over HTTP, stand-in resume clients that record each resume."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

from deltad.protocol.models import Option
from deltad.testing import FakeLLM
from deltad.testing.stub import paused_workspace
from tests.support.daemon import BIN, Daemon, metadata_status, records, wait_for
from tests.support.inbox import client, http_url, make_token

from ..conftest import Delta, llm_env, write_agent

OPTIONS = [Option(key="a", label="Apple"), Option(key="p", label="Pear")]


def _request_id(ws: Path) -> str:
    return str(
        json.loads((ws / ".delta" / "interaction" / "request.json").read_text())["request_id"]
    )


def _listed(http: Any, n: int) -> list[dict[str, Any]]:
    def all_listed() -> list[dict[str, Any]] | None:
        docs: list[dict[str, Any]] = http.get("/v1/requests", params={"limit": 1000}).json()[
            "requests"
        ]
        return docs if len(docs) >= n else None

    found = wait_for(all_listed, f"{n} questions listed")
    assert found is not None
    return found


def test_one_answer_for_fifty_questions_resumes_each_exactly_once(tmp_path: Path) -> None:
    root = tmp_path / "root"
    fleet = [root / f"ws-{i:02}" for i in range(50)]
    for ws in fleet:
        paused_workspace(ws, "Which fruit?", input_type="choice", options=OPTIONS)
    other = root / "ws-yes-no"
    paused_workspace(other, "Ship it?", input_type="yes_no")
    fewer = root / "ws-fewer-options"
    paused_workspace(fewer, "Which fruit?", input_type="choice", options=OPTIONS[:1])
    guarded = root / "ws-alice-only"
    paused_workspace(
        guarded, "Which fruit?", input_type="choice", options=OPTIONS, respondents=["alice"]
    )
    d = Daemon(tmp_path, [root], http={"listen": "127.0.0.1:0"}).start()
    try:
        url = http_url(d)
        token = make_token(d.state_dir, "bob")
        reader = make_token(d.state_dir, "rita", role="reader")
        with client(url, token) as http:
            _listed(http, 53)
            items = [{"request_id": _request_id(ws), "workspace": str(ws)} for ws in fleet]
            bad = [
                {"request_id": _request_id(other), "workspace": str(other)},
                {"request_id": _request_id(fewer), "workspace": str(fewer)},
                {"request_id": _request_id(guarded), "workspace": str(guarded)},
                {"request_id": "req_no_such_question"},
                items[0],  # the same question twice in one call
            ]
            body = {"items": items + bad, "answer": {"answer": "p", "comment": "fleet-wide"}}
            with client(url, reader) as r:
                refused = r.post("/v1/answers", json=body)
                assert refused.status_code == 403 and refused.json()["code"] == "forbidden"
            too_many = {"items": [items[0]] * 101, "answer": {"answer": "p"}}
            assert http.post("/v1/answers", json=too_many).status_code == 422
            r = http.post("/v1/answers", json=body, headers={"Idempotency-Key": "fleet-1"})
            assert r.status_code == 200, r.text
            doc = r.json()
            assert (doc["accepted"], doc["refused"]) == (50, 5)
            results = doc["results"]
            assert [x["status"] for x in results[:50]] == ["accepted"] * 50
            assert [x["workspace"] for x in results[:50]] == [str(ws) for ws in fleet]
            codes = [(x["status"], x["code"]) for x in results[50:]]
            assert codes == [
                ("refused", "different_kind"),
                ("refused", "different_kind"),
                ("refused", "not_a_respondent"),
                ("refused", "unknown_request"),
                ("refused", "duplicate_item"),
            ], results[50:]
            assert all(x["error"] for x in results[50:])  # each says why, in a line
            for ws in fleet:
                d.wait_resumed(ws)
            # The refused ones are still waiting, untouched.
            for ws in (other, fewer, guarded):
                assert not (ws / ".delta" / "interaction" / "response.json").exists()
            # A retry with the same key repeats each accepted item's first response and
            # answers nothing twice.
            again = http.post("/v1/answers", json=body, headers={"Idempotency-Key": "fleet-1"})
            assert again.status_code == 200
            assert again.json()["results"][:50] == results[:50]
        spawned = Counter(e["workspace"] for e in d.events("resume_spawned"))
        d.stop()
    finally:
        d.kill_children()
    resumed = Counter(r["workspace"] for r in records(d.record))
    assert resumed == Counter({str(ws): 1 for ws in fleet})
    assert {spawned[str(ws)] for ws in fleet} == {1}
    answers = {json.loads(r["answer"])["answer"] for r in records(d.record)}
    assert answers == {"p"}


def test_a_question_handed_to_another_token_is_recorded_and_they_may_answer(
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    ws = root / "ws"
    paused_workspace(ws, "Merge?", input_type="yes_no", respondents=["alice"])
    d = Daemon(tmp_path, [root], http={"listen": "127.0.0.1:0"}).start()
    try:
        url = http_url(d)
        alice = make_token(d.state_dir, "alice")
        bob = make_token(d.state_dir, "bob")
        make_token(d.state_dir, "rita", role="reader")
        with client(url, alice) as a, client(url, bob) as b:
            [q] = _listed(a, 1)
            rid = q["request_id"]
            assert q["delegations"] == []
            answer = {"answer": "yes"}
            assert b.post(f"/v1/requests/{rid}/answer", json=answer).status_code == 403
            # Bob may not answer, so he may not hand it over either.
            r = b.post(f"/v1/requests/{rid}/delegate", json={"to": "bob"})
            assert r.status_code == 403 and r.json()["code"] == "not_a_respondent"
            # rita only reads; a person is no one without http.oidc configured
            for nobody in ("mallory", "group:nobody", "rita", "oidc:bob@example.com"):
                r = a.post(f"/v1/requests/{rid}/delegate", json={"to": nobody})
                assert r.status_code == 422 and r.json()["code"] == "unknown_delegate", nobody
            assert "OIDC" in r.json()["error"] and "\n" not in r.json()["error"], r.text
            r = a.post(f"/v1/requests/{rid}/delegate", json={"to": "bob", "note": "on leave"})
            assert r.status_code == 200, r.text
            [handed] = r.json()["delegations"]
            assert (handed["by"], handed["to"], handed["note"]) == ("alice", "bob", "on leave")
            shown = b.get(f"/v1/requests/{rid}").json()
            assert shown["respondents"] == ["alice"] and shown["delegations"] == [handed]
            # Recorded in the mailbox: `delta status` reads it, as would a restarted daemon.
            out = subprocess.run(
                [str(BIN / "delta"), "status", "--work-dir", str(ws)],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert "Handed:   by alice to bob" in out.stdout and "on leave" in out.stdout
            r = b.post(f"/v1/requests/{rid}/answer", json=answer)
            assert r.status_code == 202, r.text
            [resumed] = d.wait_resumed(ws)
        d.stop()
    finally:
        d.kill_children()
    kept = json.loads(resumed["answer"])
    assert kept["answered_by"] == "bob" and kept["delegations"] == [handed]
    assert len(records(d.record)) == 1


def test_delta_respond_answers_every_workspace_under_a_directory(tmp_path: Path) -> None:
    root = tmp_path / "root"
    fleet = [root / "team" / f"ws-{i}" for i in range(3)]
    for ws in fleet:
        paused_workspace(ws, "Which fruit?", input_type="choice", options=OPTIONS)
    odd = root / "team" / "ws-odd"
    paused_workspace(odd, "Ship it?", input_type="yes_no")
    elsewhere = root / "other" / "ws"
    paused_workspace(elsewhere, "Which fruit?", input_type="choice", options=OPTIONS)
    argv = [str(BIN / "delta"), "respond", "--all-under", str(root), "--only", "*/team/*"]
    out = subprocess.run([*argv, "--choice", "p"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out.stderr
    assert "Answered 3 question(s); 1 not answered." in out.stdout
    [line] = out.stderr.splitlines()
    assert str(odd) in line and "another kind of question" in line
    for ws in fleet:
        doc = json.loads((ws / ".delta" / "interaction" / "response.json").read_text())
        assert (doc["answer"], doc["channel"]) == ("p", "cli")
    for ws in (odd, elsewhere):  # refused, or not matched: untouched
        assert not list((ws / ".delta" / "interaction").glob("response*"))
    # Again: each is already answered, and says so; nothing is replaced.
    out = subprocess.run([*argv, "--choice", "a"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and len(out.stderr.splitlines()) == 4
    assert all("already waiting" in x for x in out.stderr.splitlines()[:3]), out.stderr


def test_a_hand_over_is_kept_in_the_journal_and_the_history(tmp_path: Path, fake: FakeLLM) -> None:
    root = tmp_path / "root"
    ws = root / "ws"
    ws.mkdir(parents=True)
    fake.call("ask_human", {"prompt": "Merge?", "input_type": "yes_no", "respondents": ["alice"]})
    fake.reply("merged")
    assert Delta(ws, fake, write_agent(tmp_path)).start("merge it").code == 101
    d = Daemon(
        tmp_path,
        [root],
        resume_command=["delta", "run", "--work-dir", "{workspace}"],
        http={"listen": "127.0.0.1:0"},
    ).start(env=llm_env(fake))
    try:
        url = http_url(d)
        alice, bob = make_token(d.state_dir, "alice"), make_token(d.state_dir, "bob")
        with client(url, alice) as a, client(url, bob) as b:
            [q] = _listed(a, 1)
            handed = {"to": "bob", "note": "you wrote it"}
            assert a.post(f"/v1/requests/{q['request_id']}/delegate", json=handed).is_success
            r = b.post(f"/v1/requests/{q['request_id']}/answer", json={"answer": "yes"})
            assert r.status_code == 202, r.text
            wait_for(lambda: metadata_status(ws) == "COMPLETED", "the run completed")
            [entry] = [h for h in b.get("/v1/history").json()["history"] if h["kind"] == "answered"]
    finally:
        d.stop()
        d.kill_children()
    assert entry["answered_by"] == "bob"
    [kept] = entry["delegations"]
    assert (kept["by"], kept["to"], kept["note"]) == ("alice", "bob", "you wrote it")
