"""A question carries what a person decides with, names who may answer it, and a finished run
says how it ended: real `delta` (and `deltad serve --listen`) processes against the fake model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from deltad.inbox import links
from deltad.testing import FakeLLM
from deltad.testing.fakellm import tool_call
from tests.support.daemon import DELTAD, Daemon, metadata_status, wait_for
from tests.support.inbox import client, http_url, make_token

from ..conftest import Delta, llm_env, write_agent

SECRET = "hunter2-context-secret"
LONG = "x" * 5000  # a tool result over the per-call bound


def test_a_question_carries_the_task_last_message_and_tool_calls(
    delta: Delta, fake: FakeLLM
) -> None:
    fake.call("ask_human", {"prompt": "API key?", "sensitive": True}, id="key")
    fake.call("use_secret", {"value": "${secret:key}"}, id="use")
    fake.call("echo", {"text": LONG}, id="long")
    fake.reply(
        "I stored the key and\x1b[31m checked the output.",
        tool_call("ask_human", {"prompt": "Deploy now?", "input_type": "yes_no"}, id="go"),
    )
    fake.reply("deployed")
    assert delta.start("configure the service").code == 101
    assert delta("respond", input=SECRET + "\n").code == 0
    r = delta("run")
    assert r.code == 101, r.err

    req = delta.request()
    ctx = req["context"]
    assert req["prompt"] == "Deploy now?"
    assert ctx["task"] == "configure the service"
    assert ctx["last_message"] == "I stored the key and\x1b[31m checked the output."
    use, long = ctx["tool_calls"]  # the secret question's own call is not among them
    assert use["tool_name"] == "use_secret" and use["arguments"] == {"value": "${secret:key}"}
    assert use["status"] == "SUCCESS" and "[REDACTED]" in use["result"]
    assert long["tool_name"] == "echo" and len(long["result"]) < 2200
    assert "[cut: " in long["result"]
    raw = (delta.delta_dir / "interaction" / "request.json").read_text()
    assert SECRET not in raw
    # The journal's asked record holds the same context: a re-ask builds the same question.
    asked = [e for e in delta.events("HUMAN_INTERACTION") if e["payload"]["phase"] == "asked"]
    assert asked[-1]["payload"]["request"]["context"] == ctx

    shown = delta("status")
    assert shown.code == 0, shown.err
    assert "Task:     configure the service" in shown.out
    assert "I stored the key and\\x1b[31m checked the output." in shown.out
    assert "\x1b" not in shown.out  # the agent's escape sequence is shown, not obeyed
    assert 'use_secret {"value": "${secret:key}"} -> SUCCESS' in shown.out
    assert "echo {" in shown.out
    assert SECRET not in shown.out


def test_a_question_asked_again_after_a_crash_carries_the_same_context(
    delta: Delta, fake: FakeLLM
) -> None:
    fake.reply("Checking first.", tool_call("echo", {"text": "looked"}, id="e1"))
    fake.reply("Ready.", tool_call("ask_human", {"prompt": "Go?"}, id="go"))
    fake.reply("went")
    crashed = delta.start("go somewhere", env={"DELTA_FAULT": "after_post"})
    assert crashed.code < 0  # killed with request.json posted
    first = delta.request()
    (delta.delta_dir / "interaction" / "request.json").unlink()  # the mailbox lost it
    r = delta("run")
    assert r.code == 101, r.err
    again = delta.request()
    assert again["request_id"] == first["request_id"]
    assert again["context"] == first["context"]
    assert again["context"]["last_message"] == "Ready."
    assert "looked" in again["context"]["tool_calls"][0]["result"]


def test_an_approval_carries_the_context_and_the_policy_respondents(
    tmp_path: Path, fake: FakeLLM
) -> None:
    tools = '[{name: deploy, shell: "echo deployed ${env}"}, {name: look, exec: "echo looked"}]'
    policy = "approval:\n  require: [deploy]\n  respondents: [alice, 'group:ops']\n"
    agent = write_agent(tmp_path, tools, policy)
    ws = tmp_path / "ws"
    ws.mkdir()
    d = Delta(ws, fake, agent)
    fake.reply("Looked first.", tool_call("look", {}, id="l1"))
    fake.reply("Now deploying.", tool_call("deploy", {"env": "prod"}, id="d1"))
    fake.reply("done")
    assert d.start("ship it").code == 101
    req = d.request()
    assert req["input_type"] == "approval" and req["respondents"] == ["alice", "group:ops"]
    assert req["context"]["last_message"] == "Now deploying."
    assert [c["tool_name"] for c in req["context"]["tool_calls"]] == ["look"]
    shown = d("status").out
    assert "Who:      alice, group:ops" in shown
    assert "look {} -> SUCCESS: === STDOUT === looked" in shown


PLAN_GATE = """digraph plan_review {
    graph [goal="Plan the release"]
    start [shape=Mdiamond]
    exit  [shape=Msquare]
    plan   [shape=box, prompt="Write a plan for: $goal"]
    review [shape=hexagon, label="Review the plan", respondents="alice, group:ops"]
    start -> plan -> review
    review -> exit [label="[A] Approve"]
    review -> plan [label="[R] Revise"]
}
"""


def test_a_gate_carries_the_output_of_the_node_under_review(delta: Delta, fake: FakeLLM) -> None:
    dot = delta.ws.parent / "plan.dot"
    dot.write_text(PLAN_GATE)
    fake.reply("PLAN: 1. tag v1.4\n2. build\n3. publish the notes")
    r = delta("run", "--pipeline", str(dot), "--agent", str(delta.agent))
    assert r.code == 101, r.err
    req = delta.request()
    assert req["node_id"] == "review" and req["respondents"] == ["alice", "group:ops"]
    ctx = req["context"]
    assert ctx["reviewed_node"] == "plan"
    assert ctx["reviewed_output"] == "PLAN: 1. tag v1.4\n2. build\n3. publish the notes"
    assert ctx["task"] == "Plan the release"
    shown = delta("status").out
    assert "Output of plan (under review):" in shown
    assert "      PLAN: 1. tag v1.4\n      2. build\n      3. publish the notes" in shown


def test_a_finished_run_shows_its_final_message_duration_and_who_answered(
    delta: Delta, fake: FakeLLM
) -> None:
    fake.call("ask_human", {"prompt": "Which colour?", "options": ["Red", "Blue"]}, id="c")
    fake.call("ask_human", {"prompt": "Token?", "input_type": "password"}, id="p")
    fake.reply("Painted it blue and\nstored the token.")
    assert delta.start("paint the shed").code == 101
    assert delta("respond", "--choice", "B", "--as", "alice").code == 0
    assert delta("run").code == 101
    assert delta("respond", input=SECRET + "\n").code == 0
    r = delta("run")
    assert r.code == 0, r.err
    shown = delta("status")
    assert shown.code == 0, shown.err
    out = shown.out
    assert "Status:     COMPLETED" in out
    assert "Duration:   " in out
    assert "Final message:\n  Painted it blue and\n  stored the token." in out
    assert "alice (cli): Which colour? -> B: Blue" in out
    assert "Token? -> (sensitive: not shown)" in out
    assert SECRET not in out
    doc = json.loads(delta("status", "--json").out)["outcome"]
    assert doc["status"] == "COMPLETED" and doc["duration_seconds"] >= 0
    assert [a["answer"] for a in doc["answers"]] == ["B: Blue", "(sensitive: not shown)"]
    assert doc["answers"][0]["answered_by"] == "alice"


def _token_in_group(d: Daemon, name: str, group: str) -> str:
    argv = [DELTAD, "token", "add", name, "--group", group, "--state-dir", str(d.state_dir)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.strip().splitlines()[-1]


def _pending(ws: Path, prompt: str) -> str | None:
    try:
        req = json.loads((ws / ".delta" / "interaction" / "request.json").read_text())
    except (FileNotFoundError, ValueError):
        return None  # not posted yet, or being replaced
    return str(req["request_id"]) if req["prompt"] == prompt else None


def test_only_the_named_respondents_may_answer_over_http(
    tmp_path: Path, fake: FakeLLM, notify_out: Path
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    got = notify_out / "notified.jsonl"  # the command runs as the inbox's user
    record = f"import sys; open({str(got)!r}, 'a').write(sys.stdin.read() + '\\n')"
    notify = {"commands": [{"argv": [sys.executable, "-c", record], "events": ["request.created"]}]}
    d = Daemon(
        tmp_path,
        [root],
        resume_command=["delta", "run", "--work-dir", "{workspace}"],
        http={"listen": "127.0.0.1:0"},
        notify=notify,
    ).start(env=llm_env(fake))
    try:
        url = http_url(d)
        alice = make_token(d.state_dir, "alice")
        bob = make_token(d.state_dir, "bob")
        carol = _token_in_group(d, "carol", "ops")
        fake.reply("Checked the diff.", tool_call("echo", {"text": "diff ok"}, id="e1"))
        ask = {"prompt": "Merge?", "input_type": "yes_no", "respondents": ["alice"]}
        fake.call("ask_human", ask, id="ask1")
        fake.call("ask_human", {"prompt": "Tag it?", "respondents": ["group:ops"]}, id="ask2")
        fake.reply("merged")
        ws = root / "ws1"
        ws.mkdir()
        tools = '[{name: echo, exec: "echo ${text}"}]'
        agent = write_agent(tmp_path, tools)
        r = Delta(ws, fake, agent).start("merge the branch")
        assert r.code == 101, r.err
        rid = json.loads((ws / ".delta" / "interaction" / "request.json").read_text())
        request_id = rid["request_id"]

        def listed() -> dict[str, Any] | None:
            with client(url, bob) as c:
                docs = c.get("/v1/requests").json()["requests"]
            return next((x for x in docs if x["request_id"] == request_id), None)

        doc = wait_for(listed, "the question in the inbox")
        assert doc["respondents"] == ["alice"]  # bob may see it, not answer it
        assert doc["context"]["last_message"] == "Checked the diff."
        with client(url, bob) as c:
            refused = c.post(f"/v1/requests/{request_id}/answer", json={"answer": "yes"})
        assert refused.status_code == 403, refused.text
        assert refused.json()["code"] == "not_a_respondent"
        link = links.sign(links.load_key(d.state_dir), request_id, str(ws), 600)
        with client(url) as anon:
            by_link = anon.post(f"/v1/links/{link}/answer", json={"answer": "yes"})
        assert by_link.status_code == 403 and by_link.json()["code"] == "not_a_respondent"
        assert not (ws / ".delta" / "interaction" / "response.json").exists()
        with client(url, alice) as c:
            ok = c.post(f"/v1/requests/{request_id}/answer", json={"answer": "yes"})
        assert ok.status_code == 202, ok.text
        # The next question is for group:ops: alice is not in it, carol is.
        second = wait_for(lambda: _pending(ws, "Tag it?"), "the second question")
        with client(url, alice) as c:
            wait_for(lambda: c.get(f"/v1/requests/{second}").status_code == 200, "it is listed")
            no = c.post(f"/v1/requests/{second}/answer", json={"answer": "v1"})
        assert no.status_code == 403 and "only group:ops" in no.json()["error"]
        with client(url, carol) as c:
            yes = c.post(f"/v1/requests/{second}/answer", json={"answer": "v1"})
        assert yes.status_code == 202, yes.text
        wait_for(lambda: metadata_status(ws) == "COMPLETED", "the run completed")
        run_id = rid["run_id"]
        with client(url, bob) as c:
            run = c.get(f"/v1/runs/{run_id}", params={"workspace": str(ws)}).json()
        outcome = run["outcome"]
        assert outcome["status"] == "COMPLETED" and outcome["final_message"] == "merged"
        answered = [(a["prompt"], a["answered_by"], a["channel"]) for a in outcome["answers"]]
        assert answered == [("Merge?", "alice", "http"), ("Tag it?", "carol", "http")]
        # The notification carries the question with its context.
        note = wait_for(lambda: got.exists() and got.read_text().strip(), "a notification")
        sent = json.loads(note.splitlines()[0])
        assert "diff ok" in sent["request"]["context"]["tool_calls"][0]["result"]
    finally:
        d.stop()
        d.kill_children()
