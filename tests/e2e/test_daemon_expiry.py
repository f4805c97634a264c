"""deltad and issue 4: questions that expire are resumed even if nobody answers, also across a
daemon restart; answers the client refuses are logged by the daemon too."""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path

import pytest

from deltad.testing import FakeLLM, tool_call
from tests.support.daemon import metadata_status, wait_for

from ..conftest import GATED_TOOLS_FOR_DAEMON, Delta, write_agent
from .test_daemon_client import _daemon


def _ws(tmp: Path, fake: FakeLLM, tools: str = "[]", extra: str = "") -> Delta:
    root = tmp / "root"
    (root / "ws").mkdir(parents=True)
    return Delta(root / "ws", fake, write_agent(tmp, tools, extra))


def _results(d: Delta) -> dict[str, str]:
    return {
        e["payload"]["action_id"]: e["payload"]["observation_content"]
        for e in d.events("ACTION_RESULT")
    }


def test_daemon_resumes_an_expired_question_nobody_answered(tmp_path: Path, fake: FakeLLM) -> None:
    d = _ws(tmp_path, fake)
    fake.call(
        "ask_human", {"prompt": "Go?", "input_type": "yes_no", "timeout_seconds": 2}, id="q"
    ).reply("carried on without an answer")
    with _daemon(tmp_path, tmp_path / "root", fake) as daemon:
        assert d.start().code == 101
        wait_for(lambda: metadata_status(d.ws) == "COMPLETED", "the run to finish on expiry")
        assert daemon.events("resume_queued", reason="question_expired")
    assert _results(d)["q"].startswith("TIMEOUT") and "not consent" in _results(d)["q"]


def test_expiry_survives_a_daemon_restart(tmp_path: Path, fake: FakeLLM) -> None:
    d = _ws(tmp_path, fake)
    fake.call(
        "ask_human",
        {"prompt": "Colour?", "options": ["Red", "Blue"], "default": "Blue", "timeout_seconds": 1},
        id="q",
    ).reply("went with the default")
    assert d.start().code == 101
    deadline = datetime.fromisoformat(d.request()["expires_at"]).timestamp()
    while time.time() <= deadline:  # the daemon is down when the deadline passes
        time.sleep(0.05)
    with _daemon(tmp_path, tmp_path / "root", fake):
        wait_for(lambda: metadata_status(d.ws) == "COMPLETED", "the run to finish at start")
    assert _results(d)["q"].startswith("Blue") and "default" in _results(d)["q"]


def test_daemon_rejects_an_expired_approval(tmp_path: Path, fake: FakeLLM) -> None:
    d = _ws(
        tmp_path,
        fake,
        GATED_TOOLS_FOR_DAEMON,
        "approval:\n  require: [deploy]\n  timeout_seconds: 2\n",
    )
    fake.reply(None, tool_call("deploy", {"env": "prod"}, id="dep")).reply("did not deploy")
    with _daemon(tmp_path, tmp_path / "root", fake):
        assert d.start().code == 101
        wait_for(lambda: metadata_status(d.ws) == "COMPLETED", "the approval to time out")
    assert "no decision within 2 seconds" in _results(d)["dep"]
    assert not (d.ws / "deployed.txt").exists()


def test_daemon_logs_an_answer_the_client_refused(tmp_path: Path, fake: FakeLLM) -> None:
    d = _ws(tmp_path, fake)
    fake.call("ask_human", {"prompt": "Pick", "options": ["Red", "Blue"]}, id="q").reply("ok")
    with _daemon(tmp_path, tmp_path / "root", fake) as daemon:
        assert d.start().code == 101
        d.answer("Green")
        line = daemon.wait_event("answer_refused")[0]
        # The daemon names the refusal note; it never reads what a user wrote.
        assert line["file"].startswith("response.rejected-") and line["file"].endswith(".error")
        assert "Green" not in json.dumps(line)
        assert line["workspace"] == str(d.ws)
        assert "not one of the options" in d("status").out
        assert metadata_status(d.ws) == "WAITING_FOR_INPUT"
        (d.delta_dir / "interaction" / "response.json").write_text(
            json.dumps({"request_id": d.request()["request_id"], "answer": "b"})
        )
        wait_for(lambda: metadata_status(d.ws) == "COMPLETED", "the good answer")
    assert _results(d)["q"] == "Blue (option B)"


def test_question_seen_while_the_run_is_still_running_still_expires(
    tmp_path: Path, fake: FakeLLM
) -> None:
    # The client posts request.json, then flips the status, then exits; nothing signals the
    # flip. Hold the client between the two so the daemon sees the question while RUNNING,
    # with the liveness sweep far away: only the daemon's own re-check can notice the deadline.
    d = _ws(tmp_path, fake)
    fake.call("ask_human", {"prompt": "Go?", "timeout_seconds": 2}, id="q").reply("moved on")
    with _daemon(
        tmp_path, tmp_path / "root", fake, liveness_sweep_seconds=3600, rescan_interval_seconds=3600
    ) as daemon:
        r = d.start(env={"DELTA_HOLD": "after_post", "DELTA_HOLD_SECONDS": "1"})
        assert r.code == 101
        wait_for(lambda: metadata_status(d.ws) == "COMPLETED", "the run to finish on expiry")
        assert daemon.events("resume_queued", reason="question_expired")


def test_a_request_file_whose_deadline_is_not_the_journal_s_is_reported_not_resumed_for(
    tmp_path: Path, fake: FakeLLM
) -> None:
    """request.json edited to a year-1 deadline the journal never asked: the client acts on the
    journal's, so the daemon reports it once and resumes at the journal's deadline, not in a
    loop of resumes that each pause again."""
    d = _ws(tmp_path, fake)
    fake.call(
        "ask_human", {"prompt": "Go?", "input_type": "yes_no", "timeout_seconds": 15}, id="q"
    ).reply("carried on without an answer")
    assert d.start().code == 101
    real = datetime.fromisoformat(d.request()["expires_at"])
    doc = d.request() | {"expires_at": "0001-01-01T00:00:00"}
    (d.delta_dir / "interaction" / "request.json").write_text(json.dumps(doc))
    with _daemon(tmp_path, tmp_path / "root", fake) as daemon:
        wait_for(lambda: metadata_status(d.ws) == "COMPLETED", "the run to expire at last")
        [queued] = daemon.events("resume_queued", workspace=str(d.ws))  # not one per backoff
        assert queued["reason"] == "question_expired"
        [problem] = daemon.events("workspace_problem", workspace=str(d.ws))  # logged once
        assert "expires_at 0001-01-01T00:00:00Z" in problem["problem"]
    [result] = d.events("ACTION_RESULT")
    assert result["payload"]["observation_content"].startswith("TIMEOUT")
    assert datetime.fromisoformat(result["timestamp"]) >= real  # the journal's deadline held


@pytest.mark.parametrize("answered", [False, True], ids=["waiting", "answered"])
def test_the_client_puts_back_the_journal_s_question_over_an_edited_copy(
    tmp_path: Path, fake: FakeLLM, answered: bool
) -> None:
    d = _ws(tmp_path, fake)
    fake.call(
        "ask_human", {"prompt": "Go?", "input_type": "yes_no", "timeout_seconds": 3600}, id="q"
    ).reply("done")
    assert d.start().code == 101
    asked = d.request()
    box = d.delta_dir / "interaction"
    (box / "request.json").write_text(json.dumps(asked | {"expires_at": "0001-01-01T00:00:00"}))
    if answered:  # written for the edited copy: the repair must not make it stale
        d.answer("yes")

    r = d("run")
    assert r.code == (0 if answered else 101), r.err
    assert "expires_at 0001-01-01T00:00:00Z" in r.err and "Traceback" not in r.err
    [kept] = box.glob("request.refused-*.json")
    assert json.loads(kept.read_text())["expires_at"] == "0001-01-01T00:00:00"
    assert "expires_at" in kept.with_suffix(".error").read_text()
    if answered:
        assert _results(d)["q"] == "yes"
    else:
        assert d.request()["expires_at"] == asked["expires_at"]  # the journal's, back
