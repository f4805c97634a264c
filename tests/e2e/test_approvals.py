"""Typed questions and tool-call approvals through real `delta` processes."""

from __future__ import annotations

import json
import subprocess
import time
from datetime import datetime
from pathlib import Path

import pytest

from deltad.testing import FakeLLM, tool_call

from ..conftest import Delta, write_agent

GATED = """
  - name: echo
    exec: "echo ${text}"
  - name: deploy
    description: Deploy to an environment.
    exec: "echo deploying ${env}"
  - name: deploy_db
    shell: "echo migrating ${db}"
"""
POLICY = """
approval:
  require: ["deploy*"]
"""


@pytest.fixture
def gated(tmp_path: Path, fake: FakeLLM) -> Delta:
    home = write_agent(tmp_path, GATED, POLICY, name="gated-agent")
    ws = tmp_path / "gws"
    ws.mkdir()
    return Delta(ws, fake, home)


def interactions(d: Delta, phase: str) -> list[dict]:
    return [e["payload"] for e in d.events("HUMAN_INTERACTION") if e["payload"]["phase"] == phase]


def wait_past(deadline_iso: str) -> None:
    deadline = datetime.fromisoformat(deadline_iso).timestamp()
    while time.time() <= deadline:
        time.sleep(0.05)


def test_gated_call_among_ungated_ones(gated: Delta, fake: FakeLLM) -> None:
    fake.reply(
        None,
        tool_call("echo", {"text": "one"}, id="e1"),
        tool_call("deploy", {"env": "prod"}, id="d1"),
        tool_call("echo", {"text": "two"}, id="e2"),
    )
    fake.reply("shipped")
    r = gated.start("ship it")
    assert r.code == 101, r.err
    assert set(gated.results()) == {"e1", "e2"}  # ungated calls ran first
    req = gated.request()
    assert req["input_type"] == "approval"
    assert [(c["action_id"], c["tool_name"], c["arguments"]) for c in req["calls"]] == [
        ("d1", "deploy", {"env": "prod"})
    ]
    assert req["calls"][0]["resolved_command"] == "echo deploying prod"
    assert "--approve" in r.out and "d1: deploy" in r.out
    assert gated("respond", "--approve", "--as", "alice").code == 0
    r = gated("run")
    assert r.code == 0, r.err
    assert "deploying prod" in fake.tool_results()["d1"]
    answered = interactions(gated, "answered")[0]
    assert answered["reply"]["answered_by"] == "alice" and answered["reply"]["at"]
    assert answered["reply"]["decisions"][0]["decision"] == "approve"
    assert interactions(gated, "asked")[0]["request"]["request_id"] == req["request_id"]


def test_mixed_decisions_in_one_request(gated: Delta, fake: FakeLLM) -> None:
    fake.reply(
        None,
        tool_call("deploy", {"env": "prod"}, id="d1"),
        tool_call("deploy", {"env": "staging"}, id="d2"),
        tool_call("deploy_db", {"db": "main"}, id="d3"),
    )
    fake.reply("done")
    assert gated.start().code == 101
    assert len(gated.request()["calls"]) == 3
    r = gated(
        "respond",
        "--decide",
        "d1=reject",
        "--reason",
        "not on a Friday",
        "--edit",
        "d2",
        '{"env": "dev"}',
        "--decide",
        "d3=approve",
    )
    assert r.code == 0, r.err
    assert gated("run").code == 0
    seen = fake.tool_results()
    assert seen["d1"].startswith("rejected by the human") and "not on a Friday" in seen["d1"]
    assert "deploying dev" in seen["d2"] and "edited the arguments" in seen["d2"]
    assert "migrating main" in seen["d3"]
    results = {k: v[0]["status"] for k, v in gated.results().items()}
    assert results == {"d1": "FAILED", "d2": "SUCCESS", "d3": "SUCCESS"}
    edited = next(
        e["payload"] for e in gated.events("ACTION_REQUEST") if e["payload"]["action_id"] == "d2"
    )
    assert edited["tool_args"] == {"env": "dev"}


def test_plain_text_approve_in_response_txt(gated: Delta, fake: FakeLLM) -> None:
    fake.call("deploy", {"env": "qa"}, id="d").reply("ok")
    assert gated.start().code == 101
    gated.answer("approve\n")
    assert gated("run").code == 0
    assert "deploying qa" in fake.tool_results()["d"]


def test_cancel_ends_the_run_canceled(gated: Delta, fake: FakeLLM) -> None:
    fake.reply(
        None,
        tool_call("deploy", {"env": "prod"}, id="d1"),
        tool_call("deploy", {"env": "eu"}, id="d2"),
    )
    assert gated.start().code == 101
    assert gated("respond", "--cancel").code == 0
    r = gated("run")
    assert r.code == 4, r.err
    assert gated.status() == "CANCELED"
    assert gated.events("RUN_END")[-1]["payload"]["status"] == "CANCELED"
    assert {k: v[0]["status"] for k, v in gated.results().items()} == {"d1": "ERROR", "d2": "ERROR"}
    assert len(fake.requests) == 1  # the model is not asked again


def test_wrong_request_id_is_moved_aside_with_an_error(gated: Delta, fake: FakeLLM) -> None:
    fake.call("deploy", {"env": "prod"}, id="d").reply("ok")
    assert gated.start().code == 101
    inbox = gated.delta_dir / "interaction"
    (inbox / "response.json").write_text(
        json.dumps(
            {"request_id": "not-the-one", "decisions": [{"action_id": "d", "decision": "approve"}]}
        )
    )
    r = gated("run")
    assert r.code == 101 and "not-the-one" in r.err
    assert gated.status() == "WAITING_FOR_INPUT" and "d" not in gated.results()
    assert not (inbox / "response.json").exists()
    kept = list(inbox.glob("response.rejected-*.json"))
    errors = list(inbox.glob("response.rejected-*.error"))
    assert len(kept) == 1 and len(errors) == 1 and "not-the-one" in errors[0].read_text()
    status = json.loads(gated("status", "--json").out)
    assert "not-the-one" in status["answer_error"]
    assert "not taken" in gated("status").out
    assert gated("respond", "--approve").code == 0
    assert gated("run").code == 0


def test_a_response_too_deep_to_parse_is_moved_aside_with_an_error(
    gated: Delta, fake: FakeLLM
) -> None:
    fake.call("deploy", {"env": "prod"}, id="d").reply("ok")
    assert gated.start().code == 101
    inbox = gated.delta_dir / "interaction"
    (inbox / "response.json").write_text("[" * 100_000)
    r = gated("run")
    assert r.code == 101 and "Traceback" not in r.err
    assert gated.status() == "WAITING_FOR_INPUT" and not (inbox / "response.json").exists()
    assert len(list(inbox.glob("response.rejected-*.error"))) == 1
    assert gated("respond", "--approve").code == 0
    assert gated("run").code == 0


def test_edit_that_fails_the_schema_is_refused(gated: Delta, fake: FakeLLM) -> None:
    fake.call("deploy", {"env": "prod"}, id="d").reply("ok")
    assert gated.start().code == 101
    bad = gated("respond", "--edit", "d", '{"env": "x", "force": true}')
    assert bad.code == 2 and "unknown argument" in bad.err
    req = gated.request()
    (gated.delta_dir / "interaction" / "response.json").write_text(
        json.dumps(
            {
                "request_id": req["request_id"],
                "decisions": [
                    {"action_id": "d", "decision": "edit", "arguments": {"region": "eu"}}
                ],
            }
        )
    )
    r = gated("run")
    assert r.code == 101 and "edit of 'd'" in r.err
    assert "d" not in gated.results()


def test_approval_timeout_rejects(tmp_path: Path, fake: FakeLLM) -> None:
    home = write_agent(tmp_path, GATED, "approval:\n  require: [deploy]\n  timeout_seconds: 1\n")
    (tmp_path / "ws").mkdir()
    d = Delta(tmp_path / "ws", fake, home)
    fake.call("deploy", {"env": "prod"}, id="d").reply("gave up")
    assert d.start().code == 101
    wait_past(d.request()["expires_at"])
    r = d("run")
    assert r.code == 0, r.err
    seen = fake.tool_results()["d"]
    assert "no decision within 1 seconds" in seen and "not consent" in seen
    assert d.results()["d"][0]["status"] == "FAILED"
    assert interactions(d, "answered")[0]["reply"]["outcome"] == "timeout"


def test_policy_typo_fails_closed(gated: Delta, tmp_path: Path) -> None:
    home = write_agent(tmp_path, GATED, "approval:\n  require: [deplyo]\n", name="typo")
    r = gated("run", "--agent", str(home), "--task", "x")
    assert r.code == 2 and "approval.require[0]" in r.err and "matches no tool" in r.err
    home = write_agent(tmp_path, GATED, "approval:\n  requires: [deploy]\n", name="typo2")
    r = gated("run", "--agent", str(home), "--task", "x")
    assert r.code == 2 and "approval.requires" in r.err


def test_choice_answered_by_key_and_by_label(delta: Delta, fake: FakeLLM) -> None:
    opts = {"prompt": "Next step?", "options": ["[A] Apply", "[R] Revise"]}
    fake.call("ask_human", opts, id="q1").call("ask_human", opts, id="q2").reply("ok")
    assert delta.start().code == 101
    assert [o["key"] for o in delta.request()["options"]] == ["A", "R"]
    delta.answer("r")
    assert delta("run").code == 101
    assert delta("respond", "--choice", "Apply").code == 0
    assert delta("run").code == 0
    seen = fake.tool_results()
    assert seen["q1"] == "Revise (option R)" and seen["q2"] == "Apply (option A)"


def test_unknown_choice_is_kept_and_reported(delta: Delta, fake: FakeLLM) -> None:
    fake.call("ask_human", {"prompt": "Pick", "options": ["Red", "Blue"]}, id="q").reply("ok")
    assert delta.start().code == 101
    assert delta("respond", "Green").code == 2  # respond checks too
    delta.answer("Green")
    r = delta("run")
    assert r.code == 101 and "not one of the options" in r.err
    assert list((delta.delta_dir / "interaction").glob("response.rejected-*.txt"))


@pytest.mark.parametrize("with_default", [True, False])
def test_question_timeout(delta: Delta, fake: FakeLLM, with_default: bool) -> None:
    args = {"prompt": "Proceed?", "input_type": "yes_no", "timeout_seconds": 1}
    if with_default:
        args["default"] = "no"
    fake.call("ask_human", args, id="q").reply("ok")
    assert delta.start().code == 101
    wait_past(delta.request()["expires_at"])
    assert delta("run").code == 0
    seen = fake.tool_results()["q"]
    if with_default:
        assert seen.startswith("no") and "default" in seen
    else:
        assert seen.startswith("TIMEOUT") and "not consent" in seen
        assert delta.results()["q"][0]["status"] == "FAILED"


def test_interactive_choice_and_timeout(delta: Delta, fake: FakeLLM) -> None:
    fake.call("ask_human", {"prompt": "Which?", "options": ["[A] Alpha", "[B] Beta"]}, id="c")
    fake.call("ask_human", {"prompt": "Still there?", "timeout_seconds": 1}, id="t")
    fake.reply("done")
    p = subprocess.Popen(
        delta.argv("run", "-i", "--agent", str(delta.agent), "--task", "x"),
        cwd=delta.ws,
        env=delta.env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert p.stdin is not None
    p.stdin.write("b\n")
    p.stdin.flush()  # then say nothing more, with stdin still open
    try:
        out, err = _wait_exit(p)
    finally:
        p.kill()
    assert p.returncode == 0, err
    assert "[A] Alpha" in out and "[B] Beta" in out
    seen = fake.tool_results()
    assert seen["c"] == "Beta (option B)" and seen["t"].startswith("TIMEOUT")


def _wait_exit(p: subprocess.Popen[str]) -> tuple[str, str]:
    deadline = time.monotonic() + 60
    while p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert p.stdout is not None and p.stderr is not None
    return p.stdout.read(), p.stderr.read()


def test_interactive_approval(gated: Delta, fake: FakeLLM) -> None:
    fake.reply(
        None, tool_call("deploy", {"env": "a"}, id="d1"), tool_call("deploy", {"env": "b"}, id="d2")
    )
    fake.reply("ok")
    r = gated.start("x", "-i", input="a\nr\nnot b\n")
    assert r.code == 0, r.err
    seen = fake.tool_results()
    assert "deploying a" in seen["d1"] and "not b" in seen["d2"]


def test_auto_approve(gated: Delta, fake: FakeLLM) -> None:
    fake.call("ask_human", {"prompt": "Go?", "input_type": "yes_no"}, id="q")
    fake.call("ask_human", {"prompt": "Password?", "input_type": "password"}, id="p")
    fake.call("deploy", {"env": "ci"}, id="d").reply("ok")
    r = gated.start("x", "--auto-approve")
    assert r.code == 0, r.err
    seen = fake.tool_results()
    assert seen["q"] == "yes" and "skipped" in seen["p"] and "deploying ci" in seen["d"]
    sources = {p["reply"]["source"] for p in interactions(gated, "answered")}
    assert sources == {"auto"}


def test_answers_file_queue_and_exhaustion(gated: Delta, fake: FakeLLM, tmp_path: Path) -> None:
    answers = tmp_path / "answers.yaml"
    answers.write_text("- R\n")
    fake.call("ask_human", {"prompt": "Pick", "options": ["[A] A", "[R] R"]}, id="q")
    fake.call("deploy", {"env": "prod"}, id="d").reply("ok")
    r = gated.start("x", "--answers", str(answers))
    assert r.code == 0, r.err
    seen = fake.tool_results()
    assert seen["q"] == "R (option R)"
    assert "skipped" in seen["d"] and gated.results()["d"][0]["status"] == "FAILED"
    assert not (gated.ws / ".delta" / "interaction" / "request.json").exists()


def test_recording_redacts_secrets(delta: Delta, fake: FakeLLM) -> None:
    fake.call("ask_human", {"prompt": "Token?", "sensitive": True}, id="s").reply("ok")
    assert delta.start().code == 101
    delta.answer("tok-123-secret")
    assert delta("run").code == 0
    answered = interactions(delta, "answered")
    assert answered[0]["reply"]["value"] == "${secret:s}"
    assert "tok-123-secret" not in json.dumps(delta.journal())


def test_release_example_choice_then_gated_deploy(tmp_path: Path, fake: FakeLLM) -> None:
    """The README's example agent: a choice question, then an approval for `deploy`."""
    from ..conftest import EXAMPLES

    (tmp_path / "ws").mkdir()
    d = Delta(tmp_path / "ws", fake, EXAMPLES / "release-agent")
    fake.call("run_tests", {"version": "1.4.0"}, id="t")
    fake.call(
        "ask_human",
        {
            "prompt": "Which channel?",
            "options": ["[S] stable", "[B] beta", "[N] nightly"],
            "default": "B",
            "timeout_seconds": 600,
        },
        id="ch",
    )
    fake.call("deploy", {"version": "1.4.0", "channel": "beta"}, id="dep")
    fake.reply("Shipped 1.4.0 to beta.")
    assert d.start("release 1.4.0").code == 101
    assert d("respond", "--choice", "b").code == 0
    assert d("run").code == 101  # now waiting for the deploy approval
    assert d.request()["calls"][0]["resolved_command"] == "echo deploying 1.4.0 to beta"
    assert d("respond", "--approve").code == 0
    r = d("run")
    assert r.code == 0 and "Shipped" in r.out
    assert "deploying 1.4.0 to beta" in fake.tool_results()["dep"]
    assert "running tests for 1.4.0" in fake.tool_results(1)["t"]  # the value, not "$1"


def test_library_run_with_a_callback_interviewer(
    tmp_path: Path, fake: FakeLLM, monkeypatch
) -> None:
    """Library users drive a run in-process and answer through a function."""
    import io

    from deltad.client import CallbackInterviewer, Reply, RunOptions, run
    from deltad.protocol import InteractionRequest

    monkeypatch.setenv("OPENAI_BASE_URL", fake.url)
    monkeypatch.setenv("OPENAI_API_KEY", "x")
    monkeypatch.setenv("DELTA_LLM_MAX_RETRIES", "0")
    home = write_agent(tmp_path, GATED, POLICY, name="lib-agent")
    fake.call("ask_human", {"prompt": "Env?", "options": ["[P] prod", "[S] staging"]}, id="q")
    fake.call("deploy", {"env": "staging"}, id="d").reply("done")
    asked: list[InteractionRequest] = []

    def decide(req: InteractionRequest) -> str | Reply:
        asked.append(req)
        return "s" if req.input_type == "choice" else "approve"

    out = io.StringIO()
    code = run(
        RunOptions(
            tmp_path / "lib-ws", agent=str(home), task="t", interviewer=CallbackInterviewer(decide)
        ),
        out=out,
        err=io.StringIO(),
    )
    assert code == 0 and "done" in out.getvalue()
    assert [str(r.input_type) for r in asked] == ["choice", "approval"]
    seen = fake.tool_results()
    assert seen["q"] == "staging (option S)" and "deploying staging" in seen["d"]
