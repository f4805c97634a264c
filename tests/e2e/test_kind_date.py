"""The `date` input type end to end: the model asks with `input_type: date`, a person answers
with `delta respond` or over HTTP, out-of-range answers are refused (exit 2 / 422)."""

from __future__ import annotations

from pathlib import Path

from deltad.testing import FakeLLM
from tests.support.daemon import Daemon, metadata_status, wait_for
from tests.support.inbox import client, http_url, make_token

from ..conftest import Delta, llm_env
from .test_inbox_api import REAL_CLIENT, _pause

WHEN = {"prompt": "Release day?", "input_type": "date", "earliest": "2030-01-01"}


def test_a_date_question_answered_with_delta_respond(delta: Delta, fake: FakeLLM) -> None:
    fake.call("ask_human", {**WHEN, "latest": "2030-01-31"}, id="d").reply("scheduled")
    r = delta.start()
    assert r.code == 101 and "Expects:  a date, YYYY-MM-DD" in r.out
    said = delta("respond", "2030-02-01")
    assert said.code == 2 and "after the latest, 2030-01-31" in said.err
    said = delta("respond", "next friday")
    assert said.code == 2 and "not a date written YYYY-MM-DD" in said.err
    assert delta("respond", "2030-01-15").code == 0
    assert delta("run").code == 0
    assert fake.tool_results()["d"] == "2030-01-15"


def test_a_date_question_answered_over_http(tmp_path: Path, fake: FakeLLM) -> None:
    fake.call("ask_human", WHEN, id="d").reply("scheduled")
    root, ws = tmp_path / "root", tmp_path / "root" / "ws1"
    root.mkdir()
    d = Daemon(tmp_path, [root], resume_command=REAL_CLIENT, http={"listen": "127.0.0.1:0"})
    d.start(env=llm_env(fake))
    try:
        _pause(fake, tmp_path, ws)
        with client(http_url(d), make_token(d.state_dir, "alice")) as http:
            [q] = wait_for(lambda: http.get("/v1/requests").json()["requests"], "the question")
            assert (q["input_type"], q["earliest"], q["latest"]) == ("date", "2030-01-01", None)
            form = {key: q["form"][key] for key in ("control", "type", "attrs")}
            assert form == {"control": "input", "type": "date",
                            "attrs": {"min": "2030-01-01", "max": None}}  # fmt: skip
            path = f"/v1/requests/{q['request_id']}/answer"
            early = http.post(path, json={"answer": "2029-12-31"})
            assert early.status_code == 422 and "before the earliest" in early.text
            assert http.post(path, json={"answer": "2030-03-04"}).status_code == 202
        wait_for(lambda: metadata_status(ws) == "COMPLETED", "the run to finish")
    finally:
        d.stop()
        d.kill_children()
    assert fake.tool_results()["d"] == "2030-03-04"
