"""A provider blip never ends a run for good; a permanent refusal says why and can be retried;
a cut-off answer is never taken for a finished one. Real `delta` against the fake server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deltad.testing import FakeLLM

from ..conftest import TOOLS, Delta, write_agent

UNAVAILABLE = 69


def _answered_then(delta: Delta, fake: FakeLLM) -> None:
    """A run that asks, gets its answer journaled, and then needs the model again."""
    fake.call("ask_human", {"prompt": "Name?"}, id="q")
    assert delta.start().code == 101
    delta.answer("Ada")


def _answer_count(delta: Delta) -> tuple[int, int]:
    answered = [e for e in delta.events("HUMAN_INTERACTION") if e["payload"]["phase"] == "answered"]
    return len(answered), len(delta.results()["q"])


def test_an_outage_after_the_answer_leaves_the_run_resumable(delta: Delta, fake: FakeLLM) -> None:
    _answered_then(delta, fake)
    fake.errors(3, 503)  # 1 + 2 retries, all failing
    r = delta("run", env={"DELTA_LLM_MAX_RETRIES": "2"})
    assert r.code == UNAVAILABLE, r.err
    assert "Traceback" not in r.err
    assert r.err.count("model endpoint 503 Service Unavailable, retrying in") == 2
    assert "delta run --work-dir" in r.err and "deltad retries it by itself" in r.err
    meta = delta.metadata()
    assert meta["status"] == "INTERRUPTED" and meta["error_kind"] == "model_unavailable"
    assert "503" in meta["error"] and "3 attempt(s)" in meta["error"]
    assert "503" in delta("status").out
    log = (delta.run_dir / "execution" / "engine.log").read_text()
    assert log.count("retrying in") == 2
    [err_record] = list((delta.run_dir / "io" / "invocations").glob("*/error.json"))
    assert json.loads(err_record.read_text())["kind"] == "model_unavailable"
    assert _answer_count(delta) == (1, 1)  # the answer is journaled, used once
    fake.reply("Hello Ada")
    r = delta("run")
    assert r.code == 0 and "Hello Ada" in r.out
    assert _answer_count(delta) == (1, 1)
    assert delta.metadata()["model_failing_since"] is None


def test_connection_refused_then_back(delta: Delta, fake: FakeLLM) -> None:
    _answered_then(delta, fake)
    fake.down()
    r = delta("run")
    assert r.code == UNAVAILABLE and "connection refused" in r.err and "Traceback" not in r.err
    fake.up()
    fake.reply("back")
    assert delta("run").code == 0
    assert _answer_count(delta) == (1, 1)


def test_retry_after_is_honoured_and_a_long_one_is_reported(delta: Delta, fake: FakeLLM) -> None:
    fake.error(429, "slow down", retry_after="1").error(429, "later", retry_after="3600")
    fake.reply("done")
    r = delta.start(env={"DELTA_LLM_MAX_RETRIES": "2"})
    assert r.code == 0, r.err
    assert "model endpoint 429 Too Many Requests, retrying in 1." in r.err
    assert "asked to wait 3600 s (Retry-After)" in r.err


def test_a_hung_endpoint_is_capped_and_said(tmp_path: Path, fake: FakeLLM) -> None:
    agent = write_agent(tmp_path, TOOLS, extra="")
    cfg = agent / "config.yaml"
    cfg.write_text(
        cfg.read_text().replace(
            "  model: fake-model\n",
            "  model: fake-model\n  timeout_seconds: 2\n  total_timeout_seconds: 3\n",
        )
    )
    ws = tmp_path / "ws"
    ws.mkdir()
    d = Delta(ws, fake, agent)
    fake.hang(30).hang(30)
    r = d.start(env={"DELTA_LLM_MAX_RETRIES": "5"})
    assert r.code == UNAVAILABLE, r.err
    assert "still waiting for the model endpoint" in r.err
    assert "timed out" in r.err and "total cap" in r.err


@pytest.mark.parametrize(
    "body",
    [
        b'{"choices": [{"message": {"content": "hi"',
        b'{"choices": [{"message": null}]}',
        b'{"choices": []}',
        b"<html>bad gateway</html>",
    ],
    ids=["truncated", "null_message", "no_choices", "not_json"],
)
def test_a_broken_200_body_is_one_line_and_transient(
    delta: Delta, fake: FakeLLM, body: bytes
) -> None:
    fake.raw(200, body)
    r = delta.start()
    assert r.code == UNAVAILABLE, r.err
    assert "not a chat completion" in r.err and "Traceback" not in r.err
    assert len([x for x in r.err.splitlines() if x.strip()]) <= 3
    fake.reply("fine now")
    assert delta("run").code == 0


@pytest.mark.parametrize("reason", ["length", "content_filter"])
def test_a_cut_off_final_answer_is_not_completion(delta: Delta, fake: FakeLLM, reason: str) -> None:
    fake.cut_off(reason, "The answer is")
    r = delta.start()
    assert r.code == 1 and delta.status() == "INTERRUPTED", r.err
    assert delta.metadata()["error_kind"] == "model_output"
    assert reason in r.err
    assert delta.events("THOUGHT") == []  # a resume asks again, not replays the stub
    fake.reply("The answer is 42.")
    r = delta("run")
    assert r.code == 0 and "42" in r.out
    assert delta.events("THOUGHT")[-1]["payload"]["finish_reason"] == "stop"


def test_a_cut_off_tool_call_is_never_run(delta: Delta, fake: FakeLLM) -> None:
    from deltad.testing.fakellm import tool_call

    fake.cut_off("length", None, tool_call("echo", '{"text": "hal', id="e"))
    r = delta.start()
    assert r.code == 1 and delta.status() == "INTERRUPTED"
    assert delta.events("ACTION_REQUEST") == [] and delta.events("ACTION_RESULT") == []


def test_a_wrong_key_names_its_variable_and_can_be_retried(delta: Delta, fake: FakeLLM) -> None:
    fake.error(401, "Incorrect API key provided")
    r = delta.start()
    assert r.code == 2, r.err
    assert "OPENAI_API_KEY" in r.err and "401" in r.err and "Traceback" not in r.err
    assert delta.status() == "FAILED" and delta.metadata()["error_kind"] == "model_refused"
    assert "--retry" in r.err
    plain = delta("run")
    assert plain.code == 2 and "--retry" in plain.err
    fake.reply("done")
    r = delta("run", "--retry")
    assert r.code == 0, r.err
    assert delta.status() == "COMPLETED"


@pytest.mark.parametrize("status", [400, 404, 422])
def test_permanent_refusals_fail_with_the_reason(delta: Delta, fake: FakeLLM, status: int) -> None:
    fake.error(status, "no such model")
    r = delta.start()
    assert r.code == 1 and delta.status() == "FAILED"
    assert str(status) in r.err and "no such model" in r.err
    fake.reply("ok")
    rid = delta.metadata()["run_id"]
    assert delta("run", "--run-id", rid, "--retry").code == 0


def test_retry_refuses_a_run_that_failed_for_another_reason(delta: Delta, fake: FakeLLM) -> None:
    fake.call("echo", {"text": "one"}, id="a")
    r = delta.start("t", "--max-iterations", "1")
    assert r.code == 1 and "max_iterations" in r.err
    r = delta("run", "--retry")
    assert r.code == 2 and "only resumes a run the model endpoint failed" in r.err


@pytest.mark.parametrize("value", ["three", "-1", "999", "2.5"])
def test_bad_max_retries_is_a_usage_error(delta: Delta, value: str) -> None:
    r = delta.start(env={"DELTA_LLM_MAX_RETRIES": value})
    assert r.code == 2 and "DELTA_LLM_MAX_RETRIES" in r.err
    assert not delta.delta_dir.exists()
