"""An LLM node's own question inside a parallel branch pauses only its branch, for real:
`delta run --pipeline` processes against the fake model, each branch's replies scripted.

The branch whose model asks is blocked on its question while the others go on; the run puts
the (first) question in the mailbox only when no branch can go on; after the answer that
branch goes on and the next blocked branch's question is asked. Each branch's conversation
is its own lane of the journal.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from deltad.testing import FakeLLM, tool_call
from tests.support.daemon import Daemon, metadata_status, wait_for
from tests.support.inbox import client, http_url, make_token

from ..conftest import Delta, llm_env, write_agent
from .test_pipeline_flow import _graph, _path, _run

TWO_BRANCHES = """\
fan [shape=component]
join [shape=tripleoctagon]
a [prompt="write a"]
b [prompt="write b"]
start -> fan
fan -> a
fan -> b
a -> join
b -> join
join -> exit
"""


def _asks(prompt: str, id: str) -> dict[str, Any]:
    return tool_call("ask_human", {"prompt": prompt}, id)


def _asked(d: Delta) -> list[dict[str, Any]]:
    return [e["payload"] for e in d.events("HUMAN_INTERACTION") if e["payload"]["phase"] == "asked"]


def _outcomes(d: Delta) -> list[str]:
    return [e["payload"]["node"] for e in d.events("NODE_OUTCOME")]


def _said(request: dict[str, Any]) -> str:
    return json.dumps(request["messages"])


def test_a_branch_asks_while_the_other_finishes(delta: Delta, fake: FakeLLM) -> None:
    fake.reply(None, _asks("Which colour?", "qa")).reply("b is written")
    assert _run(delta, _graph(delta, TWO_BRANCHES)).code == 101
    # b ran to its outcome before the run paused for a's question.
    assert _path(delta) == ["start", "fan", "a", "b"]
    assert "b" in _outcomes(delta) and "a" not in _outcomes(delta)
    req = delta.request()
    assert req["prompt"] == "Which colour?" and req["action_id"] == "qa"
    [asked] = _asked(delta)
    assert asked["branch"] == 0 and asked["request"]["request_id"] == req["request_id"]
    # b's conversation is its own: nothing of a's question in it.
    assert "Which colour?" not in _said(fake.requests[1])
    assert "write b" in _said(fake.requests[1])
    delta.answer("blue")
    fake.reply("a is written in blue")
    r = delta("run")
    assert r.code == 0, r.err
    assert _path(delta) == ["start", "fan", "a", "b", "join"]
    a_again = fake.requests[2]["messages"]
    assert [m["role"] for m in a_again] == ["system", "user", "assistant", "tool"]
    assert a_again[-1]["content"] == "blue" and "b is written" not in _said(fake.requests[2])
    assert len(fake.requests) == 3  # every node asked the model once per turn, no more


def test_both_branches_ask_one_after_the_other(delta: Delta, fake: FakeLLM) -> None:
    fake.reply(None, _asks("A?", "qa")).reply(None, _asks("B?", "qb"))
    assert _run(delta, _graph(delta, TWO_BRANCHES)).code == 101
    # Both asked (journaled, each with its branch); only the first is in the mailbox.
    assert [(a["branch"], a["request"]["prompt"]) for a in _asked(delta)] == [(0, "A?"), (1, "B?")]
    first = delta.request()
    assert first["prompt"] == "A?"
    delta.answer("x")
    fake.reply("a done")
    assert delta("run").code == 101
    second = delta.request()
    assert second["prompt"] == "B?" and second["request_id"] != first["request_id"]
    assert len(_asked(delta)) == 2  # b's question was asked once, put in the mailbox later
    delta.answer("y")
    fake.reply("b done")
    r = delta("run")
    assert r.code == 0, r.err
    # Each answer went to its own question.
    assert fake.tool_results(2) == {"qa": "x"} and fake.tool_results(3) == {"qb": "y"}
    assert _outcomes(delta).count("a") == 1 and _outcomes(delta).count("b") == 1


def test_a_kill_at_each_point_runs_no_node_twice(delta: Delta, fake: FakeLLM) -> None:
    fake.reply(None, _asks("A?", "qa")).reply("b done").reply("a done")
    dot = _graph(delta, TWO_BRANCHES)
    kill = -signal.SIGKILL
    # Killed after start's outcome; then after b's, with a blocked on its question (journaled,
    # not in the mailbox); then as a's question is posted.
    assert _run(delta, dot, env={"DELTA_FAULT": "after_outcome"}).code == kill
    assert delta("run", env={"DELTA_FAULT": "after_outcome"}).code == kill
    assert _outcomes(delta) == ["start", "b"] and len(_asked(delta)) == 1
    assert not (delta.delta_dir / "interaction" / "request.json").exists()
    assert delta("run", env={"DELTA_FAULT": "after_post"}).code == kill
    assert delta.request()["prompt"] == "A?"
    assert delta("run").code == 101
    assert delta.request()["prompt"] == "A?" and len(fake.requests) == 2
    delta.answer("x")
    # Killed with the answer committed, then with a's result journaled.
    assert delta("run", env={"DELTA_FAULT": "after_journal"}).code == kill
    assert delta("run", env={"DELTA_FAULT": "after_result"}).code == kill
    r = delta("run")
    assert r.code == 0, r.err
    assert len(fake.requests) == 3  # a, b, a again: no model call twice
    assert fake.tool_results(2) == {"qa": "x"}
    assert sorted(_outcomes(delta)) == ["a", "b", "fan", "join", "start"]
    assert len(_asked(delta)) == 1


GATED_TOOLS = """
  - name: deploy
    description: Deploy to an environment.
    exec: "echo deploying ${env}"
"""


def test_an_approval_in_a_branch_pauses_only_its_branch(tmp_path: Path, fake: FakeLLM) -> None:
    home = write_agent(tmp_path, GATED_TOOLS, 'approval:\n  require: ["deploy"]\n', "gated")
    ws = tmp_path / "gws"
    ws.mkdir()
    d = Delta(ws, fake, home)
    fake.reply(None, tool_call("deploy", {"env": "prod"}, id="d1")).reply("b is written")
    assert _run(d, _graph(d, TWO_BRANCHES)).code == 101
    assert _path(d) == ["start", "fan", "a", "b"] and "b" in _outcomes(d)
    req = d.request()
    assert req["input_type"] == "approval" and req["calls"][0]["action_id"] == "d1"
    assert d("respond", "--approve").code == 0
    fake.reply("deployed")
    r = d("run")
    assert r.code == 0, r.err
    assert "deploying prod" in fake.tool_results(2)["d1"]


def test_deltad_resumes_each_branchs_question_in_turn(tmp_path: Path, fake: FakeLLM) -> None:
    """Both branches ask: the inbox lists one question at a time; each answer over HTTP makes
    `deltad` resume the run, which asks the other branch's question, then finishes."""
    root = tmp_path / "root"
    ws = root / "ws1"
    ws.mkdir(parents=True)
    fake.reply(None, _asks("A?", "qa")).reply(None, _asks("B?", "qb"))
    fake.reply("a done").reply("b done")
    agent = write_agent(tmp_path)
    dot = tmp_path / "two.dot"
    dot.write_text(
        "digraph two {\n start [shape=Mdiamond]\n exit [shape=Msquare]\n" + TWO_BRANCHES + "}\n"
    )
    resume = ["delta", "run", "--work-dir", "{workspace}"]
    d = Daemon(tmp_path, [root], resume_command=resume, http={"listen": "127.0.0.1:0"})
    d.start(env=llm_env(fake))
    try:
        delta = str(Path(sys.executable).parent / "delta")
        args = [delta, "run", "--pipeline", str(dot), "--agent", str(agent), "-w", str(ws)]
        out = subprocess.run(args, env=llm_env(fake), capture_output=True, text=True, timeout=60)
        assert out.returncode == 101, out.stderr
        # Both branches' models asked before the run paused; only A? is in the mailbox.
        [journal] = (ws / ".delta" / "runs").glob("*/execution/journal.jsonl")
        lines = [json.loads(line) for line in journal.read_text().splitlines()]
        asked = [e["payload"] for e in lines if e["payload"].get("phase") == "asked"]
        assert [(a["branch"], a["request"]["prompt"]) for a in asked] == [(0, "A?"), (1, "B?")]
        with client(http_url(d), make_token(d.state_dir, "alice")) as http:
            for prompt, answer in (("A?", "x"), ("B?", "y")):

                def listed(p: str = prompt) -> list[dict[str, Any]]:
                    found = http.get("/v1/requests").json()["requests"]
                    return found if [q["prompt"] for q in found] == [p] else []

                [q] = wait_for(listed, f"the question {prompt}")
                r = http.post(f"/v1/requests/{q['request_id']}/answer", json={"answer": answer})
                assert r.status_code == 202, r.text
        wait_for(lambda: metadata_status(ws) == "COMPLETED", "the run to finish")
    finally:
        d.stop()
        d.kill_children()
    assert len(fake.requests) == 4  # each branch's two turns, each once
    assert fake.tool_results(2) == {"qa": "x"} and fake.tool_results(3) == {"qb": "y"}
