"""The fake model's scripts (deltad/testing/fakescript.py): each reply a pure function of the
conversation, every example script valid, a bad script refused in one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from deltad.testing.fakescript import EXHAUSTED, Script, ScriptError, load, reply

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "fake-model"

SCRIPT = Script.model_validate(
    {
        "steps": [
            {"ask_human": {"prompt": "Channel?", "input_type": "choice", "options": ["a", "b"]}},
            {"tool": "deploy", "args": {"channel": "{answer}"}},
            {"say": "shipped: {answer}"},
        ],
        "nodes": [
            {"when": "Generate a plan", "steps": [{"outcome": "fail", "failure_reason": "no"}]},
        ],
    }
)


def _body(*turns: tuple[str, str]) -> dict[str, Any]:
    return {"messages": [{"role": r, "content": c} for r, c in turns]}


def _message(body: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = reply(SCRIPT, body)["choices"][0]["message"]
    return message


SYSTEM, TASK = ("system", "You are an agent."), ("user", "do it")


@pytest.mark.parametrize(
    ("turns", "expect"),
    [
        ((SYSTEM, TASK), ("ask_human", {"prompt": "Channel?", "input_type": "choice"})),
        ((SYSTEM, TASK, ("assistant", ""), ("tool", "b")), ("deploy", {"channel": "b"})),
        (
            (SYSTEM, TASK, ("assistant", ""), ("tool", "b"), ("assistant", ""), ("tool", "ok")),
            "shipped: ok",
        ),
        ((SYSTEM, TASK) + (("assistant", ""), ("tool", "x")) * 3, EXHAUSTED),
        # a pipeline node: its prompt is the latest user message; the count starts there
        ((SYSTEM, TASK, ("assistant", "done"), ("user", "Generate a plan for: x")), "fail"),
    ],
)
def test_the_step_is_the_assistant_turns_since_the_latest_user_message(
    turns: tuple[tuple[str, str], ...], expect: Any
) -> None:
    message = _message(_body(*turns))
    if isinstance(expect, tuple):
        [call] = message["tool_calls"]
        name, args = expect
        assert call["function"]["name"] == name
        assert json.loads(call["function"]["arguments"]).items() >= args.items()
    elif expect == "fail":
        block = message["content"].split("```json\n")[1].split("\n```")[0]
        assert json.loads(block) == {"outcome": "fail", "failure_reason": "no"}
    else:
        assert message["content"] == expect and "tool_calls" not in message


def test_the_same_request_gets_the_same_reply() -> None:
    body = _body(SYSTEM, TASK, ("assistant", ""), ("tool", "b"))
    a, b = _message(body), _message(body)
    assert a["tool_calls"][0]["function"] == b["tool_calls"][0]["function"]


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_example_script_loads(path: Path) -> None:
    script = load(path)
    assert script.steps or script.nodes


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("steps: [{ask_human: {prompt: q}, tool: x}]", "steps.0: Value error, a step is one of"),
        ("steps: [{}]", "steps.0: Value error, a step needs ask_human, tool, say or outcome"),
        ("steps: [{sya: hi}]", "steps.0.sya: Extra inputs are not permitted"),
        ("steps: [{outcome: great}]", "steps.0.outcome: Input should be"),
        ("nodes: [{when: '', steps: []}]", "nodes.0.when: String should have at least 1"),
        ("steps: [", "not YAML"),
        ("[1, 2]", "(top): Input should be a valid dictionary"),
    ],
)
def test_a_bad_script_is_one_line(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(ScriptError) as err:
        load(path)
    assert says in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_a_missing_or_huge_script_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ScriptError, match="No such file"):
        load(tmp_path / "none.yaml")
    (tmp_path / "big.yaml").write_bytes(b"#" * (2 << 20))
    with pytest.raises(ScriptError, match="larger than"):
        load(tmp_path / "big.yaml")
