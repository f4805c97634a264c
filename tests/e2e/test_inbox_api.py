"""The inbox over HTTP, end to end: a real `deltad serve --listen`, real `delta` runs against the
fake OpenAI server, tokens made with `deltad token`, answers over HTTP that the daemon resumes
exactly as it resumes any other writer, the event stream, webhooks and signed links."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import standardwebhooks

from deltad.inbox import links
from deltad.testing import FakeLLM
from tests.support.daemon import Daemon, metadata_status, wait_for
from tests.support.inbox import EventReader, WebhookReceiver, client, http_url, make_token

from ..conftest import llm_env, write_agent

DELTA = str(Path(sys.executable).parent / "delta")
REAL_CLIENT = ["delta", "run", "--work-dir", "{workspace}"]


def _delta(fake: FakeLLM, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DELTA, *args], env=llm_env(fake), capture_output=True, text=True, timeout=60
    )


def _pause(fake: FakeLLM, tmp: Path, ws: Path) -> None:
    ws.mkdir(parents=True, exist_ok=True)
    agent = write_agent(tmp)
    out = _delta(fake, "run", "--agent", str(agent), "--task", "paint", "--work-dir", str(ws))
    assert out.returncode == 101, out.stderr


def _journal(ws: Path) -> list[dict[str, Any]]:
    rid = (ws / ".delta" / "runs" / "LATEST").read_text().strip()
    text = (ws / ".delta" / "runs" / rid / "execution" / "journal.jsonl").read_text()
    return [json.loads(x) for x in text.splitlines() if x.strip()]


def _colour_question(fake: FakeLLM, prompt: str) -> None:
    options = ["Red", "Blue"]
    fake.call(
        "ask_human", {"prompt": prompt, "input_type": "choice", "options": options}, id="ask1"
    )
    fake.reply("painted")


@pytest.fixture
def served(tmp_path: Path, fake: FakeLLM) -> Iterator[tuple[Daemon, str, Path]]:
    root = tmp_path / "root"
    root.mkdir()
    d = Daemon(tmp_path, [root], resume_command=REAL_CLIENT, http={"listen": "127.0.0.1:0"}).start(
        env=llm_env(fake)
    )
    try:
        yield d, http_url(d), root
    finally:
        d.stop()
        d.kill_children()


def test_answer_over_http_resumes_the_run_and_the_stream_says_so(
    served: tuple[Daemon, str, Path], tmp_path: Path, fake: FakeLLM
) -> None:
    d, url, root = served
    _colour_question(fake, "Which colour?")
    token = make_token(d.state_dir, "alice")
    stream = EventReader(url, token)
    ws = root / "ws1"
    _pause(fake, tmp_path, ws)  # while the daemon runs: the question is announced
    created = stream.wait(lambda e: e["type"] == "request.created", "request.created")
    with client(url, token) as http:
        [q] = http.get("/v1/requests").json()["requests"]
        assert q["request_id"] == created["request_id"]
        assert (q["prompt"], q["input_type"], q["task"]) == ("Which colour?", "choice", "paint")
        assert [o["label"] for o in q["options"]] == ["Red", "Blue"]
        assert q["workspace"] == str(ws) and q["agent"] == "agent"
        assert http.get(f"/v1/requests/{q['request_id']}").json()["prompt"] == "Which colour?"
        r = http.post(f"/v1/requests/{q['request_id']}/answer", json={"answer": "b"})
        assert r.status_code == 202, r.text
        stream.wait(
            lambda e: e["type"] == "run.status" and e["to"] == "COMPLETED", "run.status COMPLETED"
        )
        stream.wait(lambda e: e["type"] == "request.answered", "request.answered")
        assert http.get("/v1/requests").json()["requests"] == []
        runs = http.get("/v1/runs", params={"status": "COMPLETED"}).json()["runs"]
        assert [x["workspace"] for x in runs] == [str(ws)]
        detail = http.get(f"/v1/runs/{runs[0]['run_id']}", params={"workspace": str(ws)}).json()
        assert detail["last_message"] == "painted" and detail["journal"]
        # The page's history: the run's end with its outcome's final message and duration.
        [end] = [h for h in http.get("/v1/history").json()["history"] if h["kind"] == "run_ended"]
        assert (end["status"], end["final_message"], end["reason"]) == (
            "COMPLETED",
            "painted",
            None,
        )
        assert end["final_message"] == detail["outcome"]["final_message"]
        assert 0 <= end["duration_seconds"] <= detail["outcome"]["duration_seconds"] + 1
    stream.close()
    assert metadata_status(ws) == "COMPLETED"
    answered = [
        e["payload"]
        for e in _journal(ws)
        if e["type"] == "HUMAN_INTERACTION" and e["payload"].get("phase") == "answered"
    ]
    assert len(answered) == 1
    reply = answered[0]["reply"]
    assert (reply["answered_by"], reply["channel"], reply["value"]) == ("alice", "http", "Blue")
    assert "Blue" in fake.tool_results()["ask1"]


def test_errors_401_403_404_422_and_one_winner_in_a_race(
    served: tuple[Daemon, str, Path], tmp_path: Path, fake: FakeLLM
) -> None:
    d, url, root = served
    _colour_question(fake, "Pick")
    ws = root / "ws1"
    _pause(fake, tmp_path, ws)
    answerer = make_token(d.state_dir, "bob")
    reader = make_token(d.state_dir, "rita", role="reader")
    elsewhere = make_token(d.state_dir, "eve", str(root / "other"))
    with pytest.raises(subprocess.CalledProcessError) as refused:  # no way out through `..`
        make_token(d.state_dir, "mallory", str(root / "other/../ws1"))
    assert refused.value.returncode == 2 and "no . or .." in refused.value.stderr
    http = client(url, answerer)
    rid = wait_for(lambda: http.get("/v1/requests").json()["requests"], "the question")[0][
        "request_id"
    ]
    path = f"/v1/requests/{rid}/answer"
    with client(url) as anon:
        r = anon.get("/v1/requests")
        assert r.status_code == 401 and r.json()["code"] == "unauthorized"
    with client(url, "dlt_not-a-token") as bad:
        assert bad.get("/v1/requests").status_code == 401
    with client(url, elsewhere) as eve:
        assert eve.get("/v1/requests").json()["requests"] == []
        r = eve.post(path, json={"answer": "r"})  # another tenant's: as if there were none
        assert r.status_code == 404 and r.json()["code"] == "unknown_request"
    with client(url, reader) as rita:
        assert rita.get("/v1/requests").json()["requests"][0]["request_id"] == rid
        assert rita.post(path, json={"answer": "r"}).status_code == 403
    r = http.post("/v1/requests/nope/answer", json={"answer": "r"})
    assert r.status_code == 404 and r.json()["code"] == "unknown_request"
    r = http.post(path, json={"answer": "green"})
    assert r.status_code == 422 and r.json()["code"] == "misfit"
    respond = _delta(fake, "respond", "--work-dir", str(ws), "--choice", "green")
    assert respond.returncode != 0 and r.json()["error"] in respond.stderr  # the same words
    r = http.post(path, json={"answr": "r"})
    assert r.status_code == 422 and "answr" in r.json()["error"]

    results: list[int] = []
    barrier = threading.Barrier(2)

    def race(answer: str) -> None:
        with client(url, answerer) as c:
            barrier.wait()
            results.append(c.post(path, json={"answer": answer}).status_code)

    threads = [threading.Thread(target=race, args=(a,)) for a in ("r", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [202, 409], results
    assert http.post(path, json={"answer": "r"}).status_code == 409
    http.close()


def test_idempotency_key_repeats_the_first_response(
    served: tuple[Daemon, str, Path], tmp_path: Path, fake: FakeLLM
) -> None:
    d, url, root = served
    fake.call("ask_human", {"prompt": "Name?"}, id="ask1").reply("hello")
    ws = root / "ws1"
    _pause(fake, tmp_path, ws)
    with client(url, make_token(d.state_dir, "bob")) as http:
        rid = wait_for(lambda: http.get("/v1/requests").json()["requests"], "question")[0][
            "request_id"
        ]
        key = {"Idempotency-Key": "k1"}
        first = http.post(f"/v1/requests/{rid}/answer", json={"answer": "Ada"}, headers=key)
        again = http.post(f"/v1/requests/{rid}/answer", json={"answer": "Ada"}, headers=key)
        other = http.post(f"/v1/requests/{rid}/answer", json={"answer": "Bo"}, headers=key)
        assert (first.status_code, again.status_code) == (202, 202)
        assert first.json() == again.json()
        assert other.status_code == 422 and other.json()["code"] == "idempotency_mismatch"


def test_webhook_is_signed_and_a_signed_link_answers_once(
    tmp_path: Path, fake: FakeLLM, notify_out: Path
) -> None:
    hook = WebhookReceiver(fail_first=1)  # the first delivery fails: it is retried
    got_cmd = notify_out / "command-got.jsonl"  # the command runs as the inbox's user
    secret = tmp_path / "hook.secret"
    secret.write_text("s3cret-signing-key\n")
    secret.chmod(0o600)
    root = tmp_path / "root"
    root.mkdir()
    notify = {
        "answer_links": True,
        "webhooks": [
            {
                "url": hook.url,
                "signing": {"secret_file": str(secret)},
                "backoff_seconds": 0.1,
                "events": ["request.created", "run.status"],
            }
        ],
        "commands": [
            {
                "argv": [
                    sys.executable,
                    "-c",
                    f"import sys; open({str(got_cmd)!r}, 'a').write(sys.stdin.read() + '\\n')",
                ],
                "events": ["request.created"],
            }
        ],
    }
    d = Daemon(
        tmp_path,
        [root],
        resume_command=REAL_CLIENT,
        http={"listen": "127.0.0.1:0"},
        notify=notify,
    ).start(env=llm_env(fake))
    try:
        url = http_url(d)
        fake.call("ask_human", {"prompt": "Ship it?", "input_type": "yes_no"}, id="ask1").reply(
            "shipped"
        )
        ws = root / "ws1"
        _pause(fake, tmp_path, ws)

        def created() -> dict[str, Any] | None:
            for headers, body in hook.received:
                doc = json.loads(body)
                if doc["type"] == "request.created":
                    return {"headers": headers, "body": body, "doc": doc}
            return None

        got = wait_for(created, "a signed request.created webhook")
        key = base64.b64encode(b"s3cret-signing-key").decode()  # the file less its newline
        standardwebhooks.Webhook(key).verify(got["body"], got["headers"])
        doc = got["doc"]
        assert doc["request"]["prompt"] == "Ship it?" and doc["url"].startswith(url)
        link = doc["answer_link"]
        token = link.rsplit("/", 1)[1]
        assert d.wait_event("notify_retry")
        with client(url) as anon:  # no bearer token: the link is the credential
            assert anon.get(f"/a/{token}").status_code == 200  # the page
            assert anon.get(f"/v1/links/{token}").json()["prompt"] == "Ship it?"
            first = anon.post(f"/v1/links/{token}/answer", json={"answer": "yes"})
            assert first.status_code == 202, first.text
            second = anon.post(f"/v1/links/{token}/answer", json={"answer": "no"})
            assert second.status_code == 409
            forged = token[:-2] + ("AA" if not token.endswith("AA") else "BB")
            assert anon.get(f"/v1/links/{forged}").status_code == 404
        wait_for(lambda: metadata_status(ws) == "COMPLETED", "the run completed")
        assert "yes" in fake.tool_results()["ask1"]

        def completed() -> bool:
            return any(
                json.loads(b)["type"] == "run.status" and json.loads(b)["to"] == "COMPLETED"
                for _, b in hook.received
            )

        wait_for(completed, "a run.status webhook")
        [by_command] = [json.loads(x) for x in got_cmd.read_text().splitlines() if x]
        assert by_command["type"] == "request.created"
        assert by_command["request"]["prompt"] == "Ship it?"
    finally:
        d.stop()
        d.kill_children()
        hook.close()


def test_a_password_answered_over_http_stays_secret(
    served: tuple[Daemon, str, Path], tmp_path: Path, fake: FakeLLM
) -> None:
    d, url, root = served
    secret = "hunter2-http-secret"
    fake.call("ask_human", {"prompt": "Password?", "input_type": "password"}, id="ask1").reply(
        "stored"
    )
    token = make_token(d.state_dir, "alice")
    stream = EventReader(url, token)
    ws = root / "ws1"
    _pause(fake, tmp_path, ws)
    seen: list[str] = []
    with client(url, token) as http:
        [q] = wait_for(lambda: http.get("/v1/requests").json()["requests"], "question")
        assert q["sensitive"] is True
        r = http.post(f"/v1/requests/{q['request_id']}/answer", json={"answer": secret})
        assert r.status_code == 202
        seen.append(r.text)
        answer = ws / ".delta" / "interaction" / "response.json"
        if answer.exists():  # the daemon may have taken it already
            assert answer.stat().st_mode & 0o777 == 0o600
        stream.wait(lambda e: e["type"] == "run.status" and e["to"] == "COMPLETED", "done")
        run_id = http.get("/v1/runs").json()["runs"][0]["run_id"]
        seen.append(http.get(f"/v1/runs/{run_id}", params={"workspace": str(ws)}).text)
        seen.append(http.get("/v1/runs").text)
    stream.close()
    seen += stream.raw
    seen.append(d.log_path.read_text())
    seen.append(json.dumps(_journal(ws)))
    seen += [p.read_text(errors="replace") for p in d.tmp.rglob("*.log")]
    assert not [s for s in seen if secret in s]
    assert secret not in json.dumps(fake.requests)  # the model got a handle, not the value


def test_listening_off_loopback_without_tls_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    out = subprocess.run(
        [
            str(Path(sys.executable).parent / "deltad"),
            "serve",
            "--root",
            str(root),
            "--listen",
            "0.0.0.0:0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")},
    )
    assert out.returncode == 2
    assert "not a loopback address" in out.stderr and "Traceback" not in out.stderr


def test_an_answer_over_http_belongs_to_the_workspace_owner_and_scopes_hold(
    tmp_path: Path,
) -> None:
    from deltad.testing.stub import paused_workspace

    from ..users import accounts, chown_tree, executable_by_all, need_root, shared_tmp

    need_root()
    with accounts() as acc, executable_by_all(), shared_tmp() as base:
        mallory, alice = acc.user(), acc.user()
        root = base / "root"
        root.mkdir()
        theirs, mine = root / "mallory-ws", root / "alice-ws"
        paused_workspace(theirs, prompt="Mallory's question")
        paused_workspace(mine, prompt="Alice's question")
        chown_tree(theirs, mallory)
        chown_tree(mine, alice)
        (mine / "peek").symlink_to(theirs)  # a way into mallory's workspace, by name
        home = base / "daemon"
        home.mkdir()
        home.chmod(0o1777)  # the stand-in resume, run as the owner, records here
        d = Daemon(home, [root], mode="hold", http={"listen": "127.0.0.1:0"}).start()
        try:
            url = http_url(d)
            alices = make_token(d.state_dir, "alice", str(mine))
            admins = make_token(d.state_dir, "ops", str(root))
            with client(url, alices) as http:
                shown = wait_for(lambda: http.get("/v1/requests").json()["requests"], "list")
                assert [q["prompt"] for q in shown] == ["Alice's question"]
                with client(url, admins) as ops:
                    both = wait_for(
                        lambda: len(ops.get("/v1/requests").json()["requests"]) == 2 and ops,
                        "both questions",
                    )
                    qs = {q["workspace"]: q for q in both.get("/v1/requests").json()["requests"]}
                rid = qs[str(theirs)]["request_id"]
                r = http.post(f"/v1/requests/{rid}/answer", json={"answer": "stolen"})
                assert r.status_code == 404 and r.json()["code"] == "unknown_request"
                runs = http.get("/v1/runs").json()["runs"]
                assert [x["workspace"] for x in runs] == [str(mine)]
                peek = http.get(
                    f"/v1/runs/{qs[str(theirs)]['run_id']}",
                    params={"workspace": str(mine / "peek")},
                )
                assert peek.status_code == 404  # not a watched workspace, whatever it points at
                r = http.post(
                    f"/v1/requests/{qs[str(mine)]['request_id']}/answer", json={"answer": "mine"}
                )
                assert r.status_code == 202
            answer = mine / ".delta" / "interaction" / "response.json"
            st = answer.stat()  # the held resume has not taken it yet
            assert (st.st_uid, st.st_mode & 0o077) == (alice.uid, 0)
            assert not (theirs / ".delta" / "interaction" / "response.json").exists()
            (d.record.parent / (d.record.name + ".go")).touch()
            d.wait_resumed(mine)
        finally:
            d.stop()
            d.kill_children()


def test_a_pipeline_gate_is_answered_over_http_like_any_question(
    served: tuple[Daemon, str, Path], tmp_path: Path, fake: FakeLLM
) -> None:
    d, url, root = served
    fake.reply("the plan").reply("applied")
    ws = root / "ws1"
    ws.mkdir()
    dot = Path(__file__).parents[2] / "examples" / "pipelines" / "review-gate.dot"
    agent = write_agent(tmp_path)
    out = _delta(fake, "run", "--pipeline", str(dot), "--agent", str(agent), "-w", str(ws))
    assert out.returncode == 101, out.stderr
    with client(url, make_token(d.state_dir, "alice")) as http:
        [gate] = wait_for(lambda: http.get("/v1/requests").json()["requests"], "the gate")
        assert (gate["node_id"], gate["input_type"]) == ("review_gate", "choice")
        assert [o["key"] for o in gate["options"]] == ["A", "R"]
        r = http.post(f"/v1/requests/{gate['request_id']}/answer", json={"answer": "a"})
        assert r.status_code == 202, r.text
    wait_for(lambda: metadata_status(ws) == "COMPLETED", "the pipeline to finish")
    edges = [e["payload"] for e in _journal(ws) if e["type"] == "EDGE_TAKEN"]
    assert ("review_gate", "apply") in [(e["source"], e["target"]) for e in edges]


def test_a_json_body_sent_as_curl_d_sends_it_is_taken_and_what_is_not_json_names_the_header(
    served: tuple[Daemon, str, Path], tmp_path: Path, fake: FakeLLM
) -> None:
    """`curl -d '{...}'` without `-H 'Content-Type: application/json'` sends the JSON as
    `application/x-www-form-urlencoded`: the delegation and bulk examples are taken as JSON (as
    is a body with no Content-Type at all); a body that is not JSON is a 415 naming the header.
    A duration without its unit is refused with the forms it may take, not read as seconds."""
    d, url, root = served
    _colour_question(fake, "Pick")
    ws = root / "ws1"
    _pause(fake, tmp_path, ws)
    bob = make_token(d.state_dir, "bob")
    make_token(d.state_dir, "carol")
    form = {"Content-Type": "application/x-www-form-urlencoded"}  # what `curl -d` sends
    with client(url, bob) as http:
        [q] = wait_for(lambda: http.get("/v1/requests").json()["requests"], "the question")
        rid = q["request_id"]
        for refused in (
            http.post(f"/v1/requests/{rid}/delegate", content=b"to=carol", headers=form),
            http.post(
                f"/v1/requests/{rid}/delegate",
                content=b'{"to": "carol"}',
                headers={"Content-Type": "text/plain"},
            ),
        ):
            assert refused.status_code == 415, refused.text
            assert refused.headers["content-type"] == "application/problem+json"
            assert refused.json()["code"] == "unsupported_media_type"
            assert "sent with Content-Type: application/json (got " in refused.json()["detail"]

        r = http.post(
            f"/v1/requests/{rid}/delegate",
            content=b'{"to": "carol", "note": "yours"}',
            headers=form,
        )
        assert r.status_code == 200, r.text
        for name in ("due_within", "older_than"):
            r = http.get("/v1/requests", params={name: "10"})
            assert r.status_code == 422, r.text
            assert r.json()["detail"] == (
                f"{name}: a duration like 90s, 10m, 1h30m or 2d, not '10' "
                "(a number needs its unit: 10s, 10m, 10h or 10d)"
            )
        # Without a bearer token (a signed link, a page's cookie) a form is never read as JSON:
        # another site's form, or its no-cors fetch, could send one.
        link = links.sign(links.load_key(d.state_dir), rid, str(ws), 3600)
        with client(url) as anon:
            r = anon.post(f"/v1/links/{link}/answer", content=b'{"answer": "Red"}', headers=form)
            assert r.status_code == 415 and r.json()["code"] == "unsupported_media_type", r.text
        bulk = json.dumps({"items": [{"request_id": rid}], "answer": {"answer": "Red"}}).encode()
        r = http.post("/v1/answers", content=bulk)  # no Content-Type at all
        assert "content-type" not in r.request.headers
        assert r.status_code == 200, r.text
        assert [x["status"] for x in r.json()["results"]] == ["accepted"], r.text
    wait_for(lambda: metadata_status(ws) == "COMPLETED", "the run resumed with the answer")


def test_a_lone_surrogate_in_a_body_is_a_422_not_a_500(
    served: tuple[Daemon, str, Path], tmp_path: Path, fake: FakeLLM
) -> None:
    """JSON can carry "\\ud800", which no UTF-8 text holds: refused as the input it is."""
    d, url, root = served
    fake.call("ask_human", {"prompt": "Name?"}, id="ask1").reply("named")
    ws = root / "ws1"
    _pause(fake, tmp_path, ws)
    http = client(url, make_token(d.state_dir, "bob"))
    rid = wait_for(lambda: http.get("/v1/requests").json()["requests"], "the question")[0][
        "request_id"
    ]
    headers = {"Content-Type": "application/json"}
    for body in (b'{"answer": "a\\ud800b"}', b'{"answer": "\\udfff"}'):
        r = http.post(f"/v1/requests/{rid}/answer", content=body, headers=headers)
        assert r.status_code == 422, (r.status_code, r.text)
        assert "surrogate" in r.json()["detail"], r.text
    assert not d.events("http_internal_error") and not d.events("internal_error")
    assert http.post(f"/v1/requests/{rid}/answer", json={"answer": "Ada"}).status_code == 202
