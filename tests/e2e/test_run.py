"""`delta run` end to end: pause, answer, resume; -i; several runs; the everyday commands."""

from __future__ import annotations

import json
import re
import uuid
from datetime import datetime

from deltad.testing import FakeLLM, tool_call

from ..conftest import Delta


def test_pause_answer_resume_completes(delta: Delta, fake: FakeLLM) -> None:
    fake.call("ask_human", {"prompt": "Which database?"}, id="ask1").reply("Migrated prod.")
    r = delta.start("migrate")
    assert r.code == 101, r.err
    assert delta.status() == "WAITING_FOR_INPUT"
    req = delta.request()
    assert uuid.UUID(req["request_id"]).version == 4
    assert req["prompt"] == "Which database?"
    assert req["input_type"] == "text" and req["sensitive"] is False
    assert req["run_id"] == delta.run_dir.name and req["action_id"] == "ask1"
    assert datetime.fromisoformat(req["timestamp"]).utcoffset().total_seconds() == 0
    # The guidance names the response file, a one-line answer and the command to continue.
    assert "response.txt" in r.out and "delta respond" in r.out and "delta run" in r.out
    assert re.fullmatch(r"\d{8}_\d{6}_[0-9a-f]{6}", delta.run_dir.name)
    assert len(fake.requests) == 1

    delta.answer("production\n")
    r = delta("run")
    assert r.code == 0, r.err
    assert "Migrated prod." in r.out
    assert fake.tool_results()["ask1"] == "production"
    assert delta.status() == "COMPLETED"
    assert delta.metadata()["end_time"]
    assert not (delta.delta_dir / "interaction" / "request.json").exists()
    assert not (delta.delta_dir / "interaction" / "response.txt").exists()
    types = [e["type"] for e in delta.journal()]
    assert types[0] == "RUN_START" and types[-1] == "RUN_END"
    seqs = [e["seq"] for e in delta.journal()]
    assert seqs == list(range(1, len(seqs) + 1))


def test_resume_without_answer_asks_again_and_keeps_waiting(delta: Delta, fake: FakeLLM) -> None:
    fake.call("ask_human", {"prompt": "Colour?"}, id="a").reply("ok")
    assert delta.start().code == 101
    before = delta.request()
    r = delta("run")
    assert r.code == 101
    assert "Colour?" in r.out
    assert delta.status() == "WAITING_FOR_INPUT"
    assert delta.request() == before  # same question, not re-posted
    assert len(fake.requests) == 1  # the model was not called again


def test_interactive_with_piped_stdin(delta: Delta, fake: FakeLLM) -> None:
    fake.call("ask_human", {"prompt": "Name?"}, id="n").reply("Hi")
    r = delta.start("greet", "-i", input="Ada\n")
    assert r.code == 0, r.err
    assert "Name?" in r.out
    assert fake.tool_results()["n"] == "Ada"
    assert not (delta.delta_dir / "interaction" / "request.json").exists()


def test_interactive_confirmation_asks_until_yes_or_no(delta: Delta, fake: FakeLLM) -> None:
    fake.call("ask_human", {"prompt": "Deploy?", "input_type": "confirmation"}, id="c")
    fake.reply("deployed")
    r = delta.start("deploy", "-i", input="maybe\nY\n")
    assert r.code == 0, r.err
    assert r.out.count("yes or no") == 2
    assert fake.tool_results()["c"] == "yes"


def test_interactive_eof_falls_back_to_the_mailbox(delta: Delta, fake: FakeLLM) -> None:
    fake.call("ask_human", {"prompt": "Name?"}, id="n").reply("Hi Bo")
    r = delta.start("greet", "-i", input="")
    assert r.code == 101
    assert delta.request()["action_id"] == "n"
    delta.answer("Bo")
    assert delta("run").code == 0
    assert fake.tool_results()["n"] == "Bo"


def test_calls_after_ask_human_in_the_same_turn_run_after_the_answer(
    delta: Delta, fake: FakeLLM
) -> None:
    fake.reply(
        None,
        tool_call("ask_human", {"prompt": "Word?"}, id="q"),
        tool_call("echo", {"text": "after"}, id="e"),
    )
    fake.reply("done")
    assert delta.start().code == 101
    assert "e" not in delta.results()
    delta.answer("bird")
    assert delta("run").code == 0
    results = delta.results()
    assert len(results["q"]) == 1 and len(results["e"]) == 1
    seen = fake.tool_results()
    assert seen["q"] == "bird" and "after" in seen["e"]


def test_second_run_after_a_completed_one(delta: Delta, fake: FakeLLM) -> None:
    fake.reply("first done").reply("second done")
    assert delta.start("one").code == 0
    first = delta.run_dir.name
    r = delta("run")
    assert r.code == 2 and "COMPLETED" in r.err and "--agent" in r.err
    assert delta.start("two").code == 0
    assert delta.run_dir.name != first
    runs = json.loads(delta("runs", "--json").out)
    assert [x["status"] for x in runs] == ["COMPLETED", "COMPLETED"]
    assert {x["task"] for x in runs} == {"one", "two"}


def test_task_with_a_resumable_run_says_what_it_did(delta: Delta, fake: FakeLLM) -> None:
    fake.call("ask_human", {"prompt": "Q?"}, id="q").reply("fine")
    assert delta.start("first").code == 101
    delta.answer("A")
    r = delta.start("another task")
    assert r.code == 0
    assert "resuming run" in r.err and "--new" in r.err
    assert delta.metadata()["task"] == "first"


def test_new_supersedes_a_waiting_run(delta: Delta, fake: FakeLLM) -> None:
    fake.call("ask_human", {"prompt": "Q?"}, id="q").reply("second")
    assert delta.start("first").code == 101
    old = delta.run_dir
    assert delta.start("second", "--new").code == 0
    old_meta = json.loads((old / "execution" / "metadata.json").read_text())
    assert old_meta["status"] == "INTERRUPTED"
    assert not (delta.delta_dir / "interaction" / "request.json").exists()
    assert list((delta.delta_dir / "interaction").glob("request.superseded-*.json"))


def test_max_iterations_caps_the_run(delta: Delta, fake: FakeLLM) -> None:
    for i in range(3):
        fake.call("echo", {"text": str(i)})
    r = delta.start("loop", "--max-iterations", "2")
    assert r.code == 1
    assert delta.status() == "FAILED"
    assert "max_iterations (2)" in delta.metadata()["error"]
    assert len(fake.requests) == 2


def test_status_respond_and_runs(delta: Delta, fake: FakeLLM) -> None:
    r = delta("respond", "x")
    assert r.code == 2 and "nothing is waiting" in r.err
    fake.call("ask_human", {"prompt": "Proceed?", "input_type": "confirmation"}, id="p")
    fake.reply("went ahead")
    assert delta.start().code == 101
    doc = json.loads(delta("status", "--json").out)
    assert doc["status"] == "WAITING_FOR_INPUT"
    assert doc["pending"]["prompt"] == "Proceed?" and doc["response"] == {"state": "missing"}
    assert "Proceed?" in delta("status").out
    bad = delta("respond", "perhaps")
    assert bad.code == 2 and "yes or no" in bad.err
    assert delta("respond", "yes").code == 0
    again = delta("respond", "no")
    assert again.code == 2 and "--force" in again.err
    assert json.loads(delta("status", "--json").out)["response"]["state"] == "ready"
    assert delta("run").code == 0
    assert fake.tool_results()["p"] == "yes"
    assert "COMPLETED" in delta("runs").out


def test_respond_from_file(delta: Delta, fake: FakeLLM, tmp_path) -> None:
    fake.call("ask_human", {"prompt": "Paste the log"}, id="l").reply("thanks")
    assert delta.start().code == 101
    f = tmp_path / "answer.txt"
    f.write_text("line one\nline two\n")
    assert delta("respond", "--file", str(f)).code == 0
    assert delta("run").code == 0
    assert fake.tool_results()["l"] == "line one\nline two"


def test_help_lists_exit_codes() -> None:
    import subprocess

    from ..conftest import bin_path

    out = subprocess.run(
        [bin_path("delta"), "run", "--help"], capture_output=True, text=True
    ).stdout
    for code, word in [
        (0, "completed"),
        (1, "failed"),
        (2, "usage"),
        (4, "canceled"),
        (75, "busy"),
        (101, "waiting"),
        (130, "interrupted"),
    ]:
        assert re.search(rf"^\s+{code}\s+{word}", out, re.M), (code, out)


def test_a_number_question_end_to_end(delta: Delta, fake: FakeLLM) -> None:
    fake.call(
        "ask_human",
        {"prompt": "Replicas?", "input_type": "number", "minimum": 1, "maximum": 5},
        id="n",
    ).reply("scaled")
    r = delta.start()
    assert r.code == 101 and "Expects:  a number" in r.out
    said = delta("respond", "9")
    assert said.code == 2 and "above the maximum" in said.err
    assert delta("respond", "3").code == 0
    assert delta("run").code == 0
    assert fake.tool_results()["n"] == "3"
