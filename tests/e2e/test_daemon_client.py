"""End to end with the real `delta` client against the fake OpenAI server: the daemon resumes
paused runs, the client ingests the answer, and every answer is journaled exactly once."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deltad.testing import FakeLLM
from tests.support import daemon as harness
from tests.support.daemon import Daemon, answer, metadata_status, wait_for

from ..conftest import llm_env, write_agent

DELTA = str(Path(sys.executable).parent / "delta")
REAL_CLIENT = ["delta", "run", "--work-dir", "{workspace}"]  # the default resume command


def _delta(fake: FakeLLM, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DELTA, *args], env=llm_env(fake), capture_output=True, text=True, timeout=60
    )


def _pause(fake: FakeLLM, tmp: Path, ws: Path) -> None:
    """`delta run` until it asks: exit 101 with request.json waiting."""
    ws.mkdir(parents=True, exist_ok=True)
    out = _delta(
        fake, "run", "--agent", str(write_agent(tmp)), "--task", "t", "--work-dir", str(ws)
    )
    assert out.returncode == 101, out.stderr


def _journal(ws: Path) -> list[dict[str, Any]]:
    rid = (ws / ".delta" / "runs" / "LATEST").read_text().strip()
    lines = (ws / ".delta" / "runs" / rid / "execution" / "journal.jsonl").read_text()
    return [json.loads(x) for x in lines.splitlines() if x.strip()]


def _answers(ws: Path) -> list[dict[str, Any]]:
    return [
        e["payload"]
        for e in _journal(ws)
        if e["type"] == "ACTION_RESULT" and e["payload"].get("action_id") == "ask1"
    ]


@contextlib.contextmanager
def _daemon(tmp: Path, root: Path, fake: FakeLLM, **settings: Any) -> Iterator[Daemon]:
    d = Daemon(tmp, [root], resume_command=REAL_CLIENT, **settings).start(env=llm_env(fake))
    try:
        yield d
    finally:
        d.stop()
        d.kill_children()


def test_daemon_resumes_a_paused_client_run_to_completion(tmp_path: Path, fake: FakeLLM) -> None:
    fake.call("ask_human", {"prompt": "q?"}, id="ask1").reply("done")
    root = tmp_path / "root"
    ws = root / "ws1"
    _pause(fake, tmp_path, ws)
    with _daemon(tmp_path, root, fake) as d:
        answer(ws, "blue")
        [exited] = d.wait_event("resume_exited", workspace=str(ws))
        assert exited["exit_code"] == 0 and exited["outcome"] == "completed"
        assert metadata_status(ws) == "COMPLETED"
        [result] = _answers(ws)
        assert "blue" in json.dumps(result)
        assert "blue" in fake.tool_results()["ask1"]
        d.wait_event("status_transition", to="COMPLETED", workspace=str(ws))


def test_asked_again_is_logged_as_still_waiting_then_resumed(tmp_path: Path, fake: FakeLLM) -> None:
    fake.call("ask_human", {"prompt": "q1?"}, id="ask1")
    fake.call("ask_human", {"prompt": "q2?"}, id="ask2").reply("done")
    root = tmp_path / "root"
    ws = root / "ws1"
    _pause(fake, tmp_path, ws)
    with _daemon(tmp_path, root, fake) as d:
        answer(ws, "first")
        [first] = d.wait_event("resume_exited", workspace=str(ws))
        assert first["exit_code"] == 101 and first["outcome"] == "waiting"
        wait_for(lambda: metadata_status(ws) == "WAITING_FOR_INPUT", "the second question")
        answer(ws, "second")
        d.wait_event("resume_exited", count=2, workspace=str(ws))
        assert metadata_status(ws) == "COMPLETED"
        assert d.events("resume_backoff") == []


def test_answer_written_while_daemon_was_down_real_client(tmp_path: Path, fake: FakeLLM) -> None:
    fake.call("ask_human", {"prompt": "q?"}, id="ask1").reply("done")
    root = tmp_path / "root"
    ws = root / "ws1"
    _pause(fake, tmp_path, ws)
    out = _delta(fake, "respond", "--work-dir", str(ws), "offline answer")
    assert out.returncode == 0, out.stderr
    with _daemon(tmp_path, root, fake) as d:
        d.wait_event("resume_exited", workspace=str(ws), exit_code=0)
        [result] = _answers(ws)
        assert "offline answer" in json.dumps(result)


def test_daemon_and_a_person_race_on_one_run(tmp_path: Path, fake: FakeLLM) -> None:
    fake.call("ask_human", {"prompt": "q?"}, id="ask1").reply("done")
    root = tmp_path / "root"
    ws = root / "ws1"
    _pause(fake, tmp_path, ws)
    with _daemon(tmp_path, root, fake) as d:
        answer(ws, "once")
        by_hand = _delta(fake, "run", "--work-dir", str(ws))  # at the same moment
        d.wait_event("resume_exited", workspace=str(ws))
        wait_for(lambda: metadata_status(ws) == "COMPLETED", "completion")
        d.reload()  # look again: nothing more to resume
        assert len(_answers(ws)) == 1  # journaled exactly once, whoever won
        assert len(fake.requests) == 2
        assert by_hand.returncode in (0, 75, 2), by_hand.stderr


def test_killed_delta_is_marked_interrupted(
    tmp_path: Path, fake: FakeLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Under fanotify `.delta/runs/` is watched too; under every backend the client's `live`
    # file tells its start and its death (tests/e2e/test_daemon_liveness.py).
    monkeypatch.setattr(harness, "ROOT_BACKEND", "fanotify")
    tools = '[{name: wait, description: "wait", command: ["sleep", "60"]}]'
    fake.call("wait", {}, id="w1").reply("done")
    root = tmp_path / "root"
    ws = root / "ws1"
    ws.mkdir(parents=True)
    argv = [DELTA, "run", "--agent", str(write_agent(tmp_path, tools)), "--task", "t"]
    with _daemon(tmp_path, root, fake, liveness_sweep_seconds=0.3) as d:
        client = subprocess.Popen(
            [*argv, "--work-dir", str(ws)],
            env=llm_env(fake),
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            d.wait_event("run_observed", workspace=str(ws), status="RUNNING")
            os.killpg(client.pid, signal.SIGKILL)  # the client and its tool
            client.wait()
            [t] = d.wait_event("status_transition", to="INTERRUPTED", workspace=str(ws))
            assert t["from"] == "RUNNING"
            assert metadata_status(ws) == "INTERRUPTED"
        finally:
            client.kill()


MODEL_RETRY = {"initial_seconds": 0.3, "max_seconds": 1, "give_up_after_seconds": 600}


def test_daemon_rides_out_a_model_outage_and_uses_the_answer_once(
    tmp_path: Path, fake: FakeLLM
) -> None:
    fake.call("ask_human", {"prompt": "q?"}, id="ask1")
    root = tmp_path / "root"
    ws = root / "ws1"
    _pause(fake, tmp_path, ws)
    fake.errors(3, 503).reply("done after the outage")  # the answer's resume + 2 retries fail
    with _daemon(tmp_path, root, fake, model_retry=MODEL_RETRY) as d:
        answer(ws, "blue")
        d.wait_event("resume_exited", count=4, workspace=str(ws))
        assert metadata_status(ws) == "COMPLETED"
        retries = d.events("model_retry", workspace=str(ws))
        assert [r["attempt"] for r in retries] == [1, 2, 3]
        assert all(r["level"] == "warning" for r in retries)
        assert [e["exit_code"] for e in d.events("resume_exited", workspace=str(ws))] == [
            69,
            69,
            69,
            0,
        ]
    assert len(_answers(ws)) == 1
    answered = [
        e
        for e in _journal(ws)
        if e["type"] == "HUMAN_INTERACTION" and e["payload"]["phase"] == "answered"
    ]
    assert len(answered) == 1
    assert "blue" in fake.tool_results()["ask1"]


def test_daemon_gives_up_on_a_long_outage_with_one_error_line(
    tmp_path: Path, fake: FakeLLM
) -> None:
    fake.call("ask_human", {"prompt": "q?"}, id="ask1")
    root = tmp_path / "root"
    ws = root / "ws1"
    _pause(fake, tmp_path, ws)
    fake.errors(50, 503)
    settings = {**MODEL_RETRY, "give_up_after_seconds": 1}
    with _daemon(tmp_path, root, fake, model_retry=settings) as d:
        answer(ws, "blue")
        [gave_up] = d.wait_event("model_retry_gave_up", workspace=str(ws))
        assert gave_up["level"] == "error"
        spawned = len(d.events("resume_spawned", workspace=str(ws)))
        d.reload()  # a full look at everything: still no new attempt, no second line
        assert len(d.events("resume_spawned", workspace=str(ws))) == spawned
        assert len(d.events("model_retry_gave_up", workspace=str(ws))) == 1
    assert metadata_status(ws) == "INTERRUPTED"
    assert len(_answers(ws)) == 1  # journaled, waiting to be used when the model is back
