"""Secrets never leave their store; bad input gets one clear line and loses nothing."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from deltad.testing import FakeLLM

from ..conftest import TOOLS, Delta, write_agent

SECRET = "hunter2-Sw0rdfish"


def _files_containing(root: Path, needle: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()]


@pytest.mark.parametrize("how", ["sensitive", "password", "interactive"])
def test_secret_reaches_the_tool_but_nothing_else(delta: Delta, fake: FakeLLM, how: str) -> None:
    args = (
        {"prompt": "API key?", "sensitive": True}
        if how != "password"
        else {"prompt": "API key?", "input_type": "password"}
    )
    fake.call("ask_human", args, id="key")
    fake.call("use_secret", {"value": "${secret:key}"}, id="use")
    fake.reply("configured")
    if how == "interactive":
        r = delta.start("configure", "-i", input=SECRET + "\n")
        outputs = r.out + r.err
    else:
        r1 = delta.start("configure")
        assert r1.code == 101
        if how == "password":
            said = delta("respond", input=SECRET + "\n")  # from stdin: no warning needed
            assert said.code == 0 and "shell history" not in said.err
        else:
            said = delta("respond", SECRET)
            assert said.code == 0 and "shell history" in said.err
        r = delta("run")
        outputs = r1.out + r1.err + r.out + r.err
    assert r.code == 0, r.err
    # The tool got the real value ...
    assert (delta.ws / "secret-seen.txt").read_text() == SECRET
    # ... the model only a handle, and the tool's echo of it redacted.
    sent = json.dumps(fake.requests)
    assert SECRET not in sent
    assert "${secret:key}" in fake.tool_results()["key"]
    assert "[REDACTED]" in fake.tool_results()["use"]
    assert SECRET not in outputs
    # On disk under .delta/: only the 0600 store in a 0700 directory.
    hits = _files_containing(delta.delta_dir, SECRET)
    assert len(hits) == 1 and hits[0].parent.name == "secrets"
    assert stat.S_IMODE(hits[0].stat().st_mode) == 0o600
    assert stat.S_IMODE(hits[0].parent.stat().st_mode) == 0o700
    assert (
        "hunter2"
        not in (delta.run_dir / "io" / "tool_executions" / "use" / "stdout.log").read_text()
    )


def test_malformed_config_names_file_and_field(delta: Delta, tmp_path: Path) -> None:
    bad = write_agent(tmp_path, "[{name: t, exec: 'ls', shell: 'ls'}]", name="bad1")
    r = delta("run", "--agent", str(bad), "--task", "x")
    assert r.code == 2
    assert "config.yaml" in r.err and "tools[0]" in r.err and "exactly one" in r.err
    assert "Traceback" not in r.err and len(r.err.strip().splitlines()) == 1
    assert not delta.delta_dir.exists()

    (bad / "config.yaml").write_text("name: x\nllm: {temperature: 0.5}\n")
    r = delta("run", "--agent", str(bad), "--task", "x")
    assert r.code == 2 and "llm.model" in r.err and "Field required" in r.err

    (bad / "config.yaml").write_text("name: [unclosed\n")
    r = delta("run", "--agent", str(bad), "--task", "x")
    assert r.code == 2 and "not valid YAML" in r.err

    # Nesting past what the parser takes: one line (libyaml caps it; Python's parser recurses).
    (bad / "config.yaml").write_text("name: x\nllm: " + "[" * 50_000 + "]" * 50_000 + "\n")
    r = delta("run", "--agent", str(bad), "--task", "x")
    assert r.code == 2 and "(line 2): not valid YAML" in r.err
    assert "Traceback" not in r.err and len(r.err.strip().splitlines()) == 1

    (bad / "config.yaml").write_text(
        "name: x\nllm: {model: m}\ntools: [{name: ask_human, exec: ls}]\n"
    )
    r = delta("run", "--agent", str(bad), "--task", "x")
    assert r.code == 2 and "built in" in r.err


def test_missing_agent(delta: Delta, tmp_path: Path) -> None:
    r = delta("run", "--agent", str(tmp_path / "nope"), "--task", "x")
    assert r.code == 2 and "agent directory not found" in r.err and "Traceback" not in r.err
    r = delta("run")
    assert r.code == 2 and "--agent" in r.err


def test_agent_deleted_before_resume_leaves_the_run_waiting(
    delta: Delta, fake: FakeLLM, tmp_path: Path
) -> None:
    home = write_agent(tmp_path, TOOLS, name="temp-agent")
    fake.call("ask_human", {"prompt": "Q?"}, id="q").reply("ok")
    assert delta("run", "--agent", str(home), "--task", "t").code == 101
    (home / "config.yaml").rename(home / "config.yaml.bak")
    delta.answer("A")
    r = delta("run")
    assert r.code == 2 and "cannot resume" in r.err
    assert delta.status() == "WAITING_FOR_INPUT"
    assert (delta.delta_dir / "interaction" / "response.txt").read_text() == "A"
    (home / "config.yaml.bak").rename(home / "config.yaml")
    assert delta("run").code == 0


def test_llm_client_error_fails_the_run_with_one_line(delta: Delta, fake: FakeLLM) -> None:
    fake.error(400, "model 'fake-model' does not exist")
    r = delta.start()
    assert r.code == 1
    assert delta.status() == "FAILED"
    assert "400" in r.err and "does not exist" in r.err and "Traceback" not in r.err
    assert "400" in delta.metadata()["error"]
    assert delta.events("RUN_END")[-1]["payload"]["status"] == "FAILED"


def test_llm_server_error_is_retried(delta: Delta, fake: FakeLLM) -> None:
    fake.error(503, "overloaded").error(429, "slow down").reply("made it")
    r = delta.start(env={"DELTA_LLM_MAX_RETRIES": "2"})
    assert r.code == 0, r.err
    assert "made it" in r.out and len(fake.requests) == 3
    assert "model endpoint 503 Service Unavailable, retrying in" in r.err
    assert "(attempt 3/3)" in r.err


def test_no_api_key_is_a_usage_error(delta: Delta) -> None:
    env = {k: v for k, v in delta.env.items() if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL")}
    delta.env = env
    r = delta.start()
    assert r.code == 2 and "OPENAI_API_KEY" in r.err
    assert not delta.delta_dir.exists()


def _pause(delta: Delta, fake: FakeLLM) -> Path:
    fake.call("ask_human", {"prompt": "Q?"}, id="q").reply("done")
    assert delta.start().code == 101
    return delta.delta_dir / "interaction" / "response.txt"


def test_symlinked_response_is_refused_and_kept(
    delta: Delta, fake: FakeLLM, tmp_path: Path
) -> None:
    response = _pause(delta, fake)
    target = tmp_path / "elsewhere.txt"
    target.write_text("sneaky")
    response.symlink_to(target)
    r = delta("run")
    assert r.code == 101 and "symlink" in r.err
    # Set aside (the link itself, never its target), so it cannot block the question forever.
    assert delta.status() == "WAITING_FOR_INPUT" and not os.path.lexists(response)
    [kept] = response.parent.glob("response.rejected-*.txt")
    assert kept.is_symlink() and target.read_text() == "sneaky"
    response.write_text("honest")
    assert delta("run").code == 0
    assert fake.tool_results()["q"] == "honest"


@pytest.mark.parametrize("kind", ["fifo", "huge", "binary", "directory"])
def test_unusable_response_files_are_refused(delta: Delta, fake: FakeLLM, kind: str) -> None:
    response = _pause(delta, fake)
    if kind == "fifo":
        os.mkfifo(response)
    elif kind == "huge":
        response.write_bytes(b"x" * (2 * 1024 * 1024))
    elif kind == "binary":
        response.write_bytes(b"\xff\xfe\x00bad")
    else:
        response.mkdir()
    r = delta("run", timeout=30)
    assert r.code == 101, r.err
    assert "answer not taken" in r.err and "Traceback" not in r.err
    assert delta.status() == "WAITING_FOR_INPUT"
    # Moved aside with a reason, never consumed and never left to block the question.
    assert not os.path.lexists(response)
    assert list(response.parent.glob("response.rejected-*.txt"))
    assert "Last answer was not taken" in delta("status").out
    response.write_text("good")
    assert delta("run").code == 0
    assert fake.tool_results()["q"] == "good"


def test_response_older_than_the_question_is_not_taken(delta: Delta, fake: FakeLLM) -> None:
    response = _pause(delta, fake)
    response.write_text("old news")
    os.utime(response, (1_000_000, 1_000_000))
    r = delta("run")
    assert r.code == 101 and "older than the question" in r.err
    response.write_text("fresh")
    assert delta("run").code == 0
    assert fake.tool_results()["q"] == "fresh"


def test_leftover_response_is_set_aside_when_a_new_question_is_posted(
    delta: Delta, fake: FakeLLM
) -> None:
    (delta.delta_dir / "interaction").mkdir(parents=True)
    leftover = delta.delta_dir / "interaction" / "response.txt"
    leftover.write_text("answer to nothing")
    _pause(delta, fake)
    assert not leftover.exists()
    kept = list(leftover.parent.glob("response.stale-*.txt"))
    assert len(kept) == 1 and kept[0].read_text() == "answer to nothing"


def test_corrupt_state_files_give_one_line(delta: Delta, fake: FakeLLM) -> None:
    _pause(delta, fake)
    meta = delta.run_dir / "execution" / "metadata.json"
    original = meta.read_bytes()
    meta.write_text('{"run_id": 5')
    r = delta("run")
    assert r.code == 2 and "metadata.json" in r.err and "Traceback" not in r.err
    meta.write_bytes(original)
    (delta.delta_dir / "runs" / "LATEST").write_text("../../etc")
    r = delta("status")
    assert r.code == 2 and "LATEST" in r.err


def test_model_mistakes_become_error_results(delta: Delta, fake: FakeLLM) -> None:
    fake.call("no_such_tool", {}, id="u")
    fake.call("echo", "{not json", id="j")
    fake.call("echo", {"text": "x", "extra": 1}, id="x")
    fake.call("ask_human", {}, id="a")
    fake.reply("recovered")
    r = delta.start()
    assert r.code == 0, r.err
    res = {k: v[0] for k, v in delta.results().items()}
    assert res["u"]["status"] == "ERROR" and "no tool named" in res["u"]["observation_content"]
    assert res["j"]["status"] == "ERROR" and "not valid JSON" in res["j"]["observation_content"]
    assert "unknown argument" in res["x"]["observation_content"]
    assert "prompt" in res["a"]["observation_content"]


def test_tool_forms_substitute_safely(tmp_path: Path, fake: FakeLLM) -> None:
    tools = """
  - name: shout
    exec: "printf '%s|%s' ${a} ${AGENT_HOME}"
  - name: count
    shell: "printf '%s' ${text} | wc -c"
  - name: opt
    command: ["sh", "-c", "echo \\"$@\\"; cat", "sh"]
    parameters:
      - {name: level, type: integer, inject_as: option, option_name: --level}
      - {name: body, inject_as: stdin}
    timeout_seconds: 5
  - name: hang
    exec: "sleep 30"
    timeout_seconds: 0.5
"""
    home = write_agent(tmp_path, tools)
    ws = tmp_path / "ws"
    ws.mkdir()
    d = Delta(ws, fake, home)
    fake.call("shout", {"a": "x y; touch pwned"}, id="s")
    fake.call("count", {"text": "$(touch pwned2)"}, id="c")
    fake.call("opt", {"level": 3, "body": "from stdin"}, id="o")
    fake.call("hang", {}, id="h")
    fake.reply("ok")
    r = d.start()
    assert r.code == 0, r.err
    seen = fake.tool_results()
    assert f"x y; touch pwned|{home}" in seen["s"]
    assert "15" in seen["c"]
    assert "--level 3" in seen["o"] and "from stdin" in seen["o"]
    assert "TIMED OUT" in seen["h"]
    assert not list(ws.glob("pwned*"))
    schema = {t["function"]["name"]: t["function"] for t in fake.requests[0]["tools"]}
    assert schema["opt"]["parameters"]["properties"]["level"]["type"] == "integer"
    assert "ask_human" in schema
