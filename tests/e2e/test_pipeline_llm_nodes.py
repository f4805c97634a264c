"""Per-node model settings and what each node sees of the earlier ones, end to end: real
`delta run --pipeline` processes against the fake model, read back from the requests it got.

The stylesheet's specificity and node overrides (model, temperature, reasoning_effort), a
provider's endpoint, an unknown provider refused before the run, a bad stylesheet refused by
`check`; fidelity levels shaping the next node's request, the same after a kill -9; thread_id
sharing a conversation between two nodes.
"""

from __future__ import annotations

import json
import signal
import textwrap
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from deltad.testing import FakeLLM

from ..conftest import EXAMPLES, Delta, wait_for, write_agent


def _write(d: Delta, name: str, text: str) -> Path:
    path = d.ws.parent / name
    path.write_text(textwrap.dedent(text))
    return path


def _pipeline(d: Delta, dot: Path, *extra: str, agent: Path | None = None, **kw: Any) -> Any:
    return d("run", "--pipeline", str(dot), "--agent", str(agent or d.agent), *extra, **kw)


def _sent(fake: FakeLLM, i: int, key: str) -> Any:
    return fake.requests[i].get(key)


STYLED = """\
    digraph styled {
        graph [goal="g", model_stylesheet="
            * { llm_model: base-model; temperature: 0.5; }
            box { reasoning_effort: low; }
            .code { llm_model: code-model; reasoning_effort: medium; }
            .code { temperature: 0.9; }
            #review { llm_model: review-model; reasoning_effort: high; }
        "]
        start [shape=Mdiamond]
        exit [shape=Msquare]
        plan [prompt="plan it", class="planning"]
        build [prompt="build it", class="code"]
        review [prompt="review it", class="code"]
        own [prompt="own", class="code", llm_model="own-model", temperature=0]
        start -> plan -> build -> review -> own -> exit
    }
"""


def test_the_stylesheet_and_node_attributes_set_each_nodes_model(
    delta: Delta, fake: FakeLLM
) -> None:
    dot = _write(delta, "styled.dot", STYLED)
    fake.reply("p").reply("b").reply("r").reply("o")
    r = _pipeline(delta, dot)
    assert r.code == 0, r.err
    assert "W001" not in r.err  # carried out: no warning
    got = [
        (_sent(fake, i, "model"), _sent(fake, i, "temperature"), _sent(fake, i, "reasoning_effort"))
        for i in range(4)
    ]
    assert got == [
        ("base-model", 0.5, "low"),  # * and the shape rule
        ("code-model", 0.9, "medium"),  # .code beats box; the later .code rule adds temperature
        ("review-model", 0.9, "high"),  # #id beats .class
        ("own-model", 0.0, "medium"),  # the node's own attributes beat every rule
    ]
    starts = {e["payload"]["node"]: e["payload"] for e in delta.events("NODE_START")}
    assert starts["review"]["llm"] == {
        "llm_model": "review-model",
        "reasoning_effort": "high",
        "temperature": "0.9",
    }


def test_a_resume_sends_the_recorded_settings_not_the_edited_graph(
    delta: Delta, fake: FakeLLM
) -> None:
    dot = _write(delta, "styled.dot", STYLED)
    fake.reply("p").hang(60)  # build's call never answers: killed there
    proc = delta.popen("run", "--pipeline", str(dot), "--agent", str(delta.agent))
    try:
        wait_for(lambda: len(fake.requests) == 2, "build's model call")
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        proc.kill()
    # The run's copy of the graph is what a resume reads; the node's settings come from its
    # NODE_START even so: the copy is edited here to show they are not resolved again.
    copy = delta.run_dir / "configuration" / "pipeline.dot"
    copy.write_text(copy.read_text().replace("code-model", "edited-model"))
    fake.reply("b").reply("r").reply("o")
    r = delta("run")
    assert r.code == 0, r.err
    assert _sent(fake, 2, "model") == "code-model"  # build, asked again after the crash
    assert _sent(fake, 2, "messages") == _sent(fake, 1, "messages")


def test_a_provider_names_an_endpoint_of_the_agent(tmp_path: Path, fake: FakeLLM) -> None:
    with FakeLLM() as other:
        agent = write_agent(
            tmp_path,
            extra=f"""\
            providers:
              other:
                base_url: {other.url}
                api_key_env: OTHER_KEY
            """,
            name="providers-agent",
        )
        ws = tmp_path / "ws"
        ws.mkdir()
        d = Delta(ws, fake, agent)
        dot = _write(
            d,
            "p.dot",
            """\
            digraph p {
                graph [model_stylesheet="#second { llm_provider: other; }"]
                start [shape=Mdiamond]
                exit [shape=Msquare]
                first [prompt="one"]
                second [prompt="two"]
                start -> first -> second -> exit
            }
            """,
        )
        missing = _pipeline(d, dot)
        assert missing.code == 2
        assert missing.err.strip() == (
            "delta: error: node second: llm_provider other: its key variable OTHER_KEY is not set"
        )
        assert not d.delta_dir.exists()
        fake.reply("from the default endpoint")
        other.hang(120)  # killed in second's call; the resume asks the same endpoint again
        argv = ["run", "--pipeline", str(dot), "--agent", str(agent)]
        proc = d.popen(*argv, env={"OTHER_KEY": "k2"})
        try:
            wait_for(lambda: len(other.requests) == 1, "second's model call", timeout=60)
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        finally:
            proc.kill()
        other.reply("from the other endpoint")
        r = d("run", env={"OTHER_KEY": "k2"})
        assert r.code == 0, r.err
        assert r.out.strip() == "from the other endpoint"
        assert len(fake.requests) == 1 and len(other.requests) == 2
        assert other.requests[1] == other.requests[0]


def test_an_unknown_provider_is_one_line_before_the_run(delta: Delta, fake: FakeLLM) -> None:
    dot = _write(
        delta,
        "p.dot",
        """\
        digraph p {
            start [shape=Mdiamond]
            exit [shape=Msquare]
            w [prompt="x", llm_provider=anthropic]
            start -> w -> exit
        }
        """,
    )
    r = _pipeline(delta, dot)
    assert r.code == 2
    [line] = r.err.strip().splitlines()
    assert line.startswith("delta: error: node w: llm_provider 'anthropic' is not one of the")
    assert "Traceback" not in r.err and not delta.delta_dir.exists() and not fake.requests


def test_check_refuses_a_stylesheet_that_does_not_parse(delta: Delta) -> None:
    dot = _write(
        delta,
        "bad.dot",
        """\
        digraph bad {
            graph [model_stylesheet="
                * { llm_model: m; }
                .code { llm_model m; }
            "]
            start [shape=Mdiamond]
            exit [shape=Msquare]
            start -> exit
        }
        """,
    )
    r = delta("pipeline", "check", str(dot))
    assert r.code == 2
    assert r.err.strip() == (
        f"delta: error: {dot}:4:27: graph: model_stylesheet: expected ':' after llm_model, "
        "found 'm' [E003 bad-value]"
    )


FIDELITY = """\
    digraph f {
        graph [goal="ship it", default_fidelity="%s"]
        start [shape=Mdiamond]
        exit [shape=Msquare]
        first [prompt="first step"]
        second [prompt="second step"]
        start -> first -> second -> exit
    }
"""


def _second_prompt(fake: FakeLLM) -> str:
    user: str = fake.requests[1]["messages"][1]["content"]
    return user


def test_fidelity_levels_shape_what_the_next_node_sees(
    tmp_path: Path, fake: FakeLLM, agent: Path
) -> None:
    seen: dict[str, str] = {}
    for level in ("truncate", "compact", "summary:low", "summary:high"):
        ws = tmp_path / level.replace(":", "-")
        ws.mkdir()
        d = Delta(ws, fake, agent)
        fake.requests.clear()
        fake.reply("FIRST-OUTPUT").reply("done")
        r = _pipeline(d, _write(d, f"{ws.name}.dot", FIDELITY % level))
        assert r.code == 0, r.err
        seen[level] = _second_prompt(fake)
        assert [e["payload"].get("fidelity") for e in d.events("NODE_START")][1:3] == [level] * 2
    run_id = seen["truncate"].rsplit("Run: ", 1)[1]
    assert seen["truncate"] == f"second step\n\nPipeline goal: ship it\nRun: {run_id}"
    assert seen["compact"] == (
        "second step\n\nContext from earlier steps of the pipeline:\n- response.first: FIRST-OUTPUT"
    )
    assert seen["summary:low"] == (
        "second step\n\nSummary of the earlier steps of the pipeline:\n"
        "2 stage(s) finished; the latest 2:\n- start: success\n- first: success"
    )
    assert "- first: success (FIRST-OUTPUT)" in seen["summary:high"]
    assert "- response.first: FIRST-OUTPUT" in seen["summary:high"]


def test_an_edge_fidelity_beats_the_node_and_the_graph(delta: Delta, fake: FakeLLM) -> None:
    dot = _write(
        delta,
        "e.dot",
        """\
        digraph e {
            graph [default_fidelity="summary:high"]
            start [shape=Mdiamond]
            exit [shape=Msquare]
            a [prompt="A"]
            b [prompt="B", fidelity="summary:low"]
            start -> a
            a -> b [fidelity=truncate]
            b -> exit
        }
        """,
    )
    fake.reply("out-a").reply("out-b")
    assert _pipeline(delta, dot).code == 0
    assert [e["payload"].get("fidelity") for e in delta.events("NODE_START")][1:] == [
        "summary:high",
        "truncate",
    ]
    assert "out-a" not in _second_prompt(fake)


THREAD = """\
    digraph t {
        start [shape=Mdiamond]
        exit [shape=Msquare]
        draft [prompt="draft it", thread_id=writing, fidelity=full]
        check [prompt="check it", shape=parallelogram, tool_command="true"]
        polish [prompt="polish it", thread_id=writing, fidelity=full]
        start -> draft -> check -> polish -> exit
    }
"""


def test_thread_id_shares_a_conversation_and_a_resume_sends_the_same(
    delta: Delta, fake: FakeLLM
) -> None:
    dot = _write(delta, "t.dot", THREAD)
    fake.call("echo", {"text": "hi"}).reply("the draft").hang(60)
    proc = delta.popen("run", "--pipeline", str(dot), "--agent", str(delta.agent))
    try:
        wait_for(lambda: len(fake.requests) == 3, "polish's model call")
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        proc.kill()
    fake.reply("polished")
    r = delta("run")
    assert r.code == 0, r.err
    roles = [(m["role"], m.get("content")) for m in fake.requests[3]["messages"]]
    assert roles[1] == ("user", "draft it")
    assert roles[2][0] == "assistant" and roles[3][0] == "tool"  # draft's tool call, its result
    assert roles[4] == ("assistant", "the draft")
    assert roles[5] == ("user", "polish it")  # the thread goes on: no digest of draft
    assert fake.requests[3]["messages"] == fake.requests[2]["messages"]  # after the kill -9
    starts = {e["payload"]["node"]: e for e in delta.events("NODE_START")}
    polish = starts["polish"]["payload"]
    assert polish["thread"] == "writing"
    assert polish["thread_history"][0][0] == starts["draft"]["seq"]


TIMED = """\
    digraph timed {
        start [shape=Mdiamond]
        exit [shape=Msquare]
        w [prompt="think hard", timeout="%s"]
        done [shape=parallelogram, tool_command="echo done"]
        handle [shape=parallelogram, tool_command="echo handled"]
        start -> w
        w -> done [condition="outcome=success"]
        w -> handle [condition="outcome=fail"]
        done -> exit
        handle -> exit
    }
"""


def _outcome(d: Delta, node: str) -> dict[str, Any]:
    [found] = [e["payload"] for e in d.events("NODE_OUTCOME") if e["payload"]["node"] == node]
    return found


def test_an_llm_nodes_timeout_bounds_its_model_call(delta: Delta, fake: FakeLLM) -> None:
    fake.hang(120)  # the model never answers in time
    r = _pipeline(delta, _write(delta, "t.dot", TIMED % "3s"), timeout=100)
    assert r.code == 0, r.err
    w = _outcome(delta, "w")
    assert w["status"] == "fail" and w["failure_reason"].startswith("timed out: the node's")
    assert [e["payload"]["node"] for e in delta.events("NODE_START")][-1] == "handle"
    assert "W001" not in r.err


def test_an_llm_nodes_deadline_survives_a_kill(delta: Delta, fake: FakeLLM) -> None:
    """Killed in the call; resumed after the recorded deadline: the timeout path, no new call."""
    fake.hang(120)
    dot = _write(delta, "t.dot", TIMED % "10s")
    proc = delta.popen("run", "--pipeline", str(dot), "--agent", str(delta.agent))
    try:
        wait_for(lambda: len(fake.requests) == 1, "w's model call", timeout=60)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        proc.kill()
    [start] = [e["payload"] for e in delta.events("NODE_START") if e["payload"]["node"] == "w"]
    deadline = datetime.fromisoformat(start["deadline"])
    wait_for(lambda: datetime.now(UTC) > deadline, "w's deadline", timeout=60)
    fake.reply("too late")  # would be taken if the resume called the model again
    r = delta("run")
    assert r.code == 0, r.err
    assert _outcome(delta, "w")["status"] == "fail" and len(fake.requests) == 1
    assert [e["payload"]["node"] for e in delta.events("NODE_START")][-1] == "handle"


def test_every_example_pipeline_checks_without_warnings(delta: Delta) -> None:
    for dot in sorted((EXAMPLES / "pipelines").glob("*.dot")):
        r = delta("pipeline", "check", "--strict", str(dot))
        assert r.code == 0, (dot.name, r.err)


def test_the_model_settings_example_runs(delta: Delta, fake: FakeLLM) -> None:
    fake.reply("DRAFT").reply("PROBLEMS").reply("FINAL")
    r = _pipeline(delta, EXAMPLES / "pipelines" / "model-settings.dot")
    assert r.code == 0, r.err
    assert r.out.strip() == "FINAL"
    assert [q.get("reasoning_effort") for q in fake.requests] == [None, "high", None]
    assert [q.get("temperature") for q in fake.requests] == [None, None, 0.2]
    polish = [(m["role"], m["content"]) for m in fake.requests[2]["messages"]]
    assert polish[1:3] == [("user", "Draft: Write a release note for version 1.4"),
                           ("assistant", "DRAFT")]  # fmt: skip
    assert "PROBLEMS" not in json.dumps(polish)  # a thread of its own, not review's digest


def test_a_summary_is_the_same_after_a_kill(delta: Delta, fake: FakeLLM) -> None:
    """The digest is composed once, into NODE_START: the call asked again after a kill -9
    sends the same messages."""
    fake.reply("FIRST-OUTPUT").hang(120)
    dot = _write(delta, "f.dot", FIDELITY % "summary:medium")
    proc = delta.popen("run", "--pipeline", str(dot), "--agent", str(delta.agent))
    try:
        wait_for(lambda: len(fake.requests) == 2, "second's model call", timeout=60)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        proc.kill()
    fake.reply("done")
    r = delta("run")
    assert r.code == 0, r.err
    assert fake.requests[2]["messages"] == fake.requests[1]["messages"]
    assert "- first: success" in _second_prompt(fake)
    assert "- response.first: FIRST-OUTPUT" in _second_prompt(fake)
