"""A script for the fake model: what it says at each step of a conversation, written as YAML, so
anyone can try every question kind, a tool call, an approval or a pipeline gate without an API
key (`python -m deltad.testing.fakellm --script FILE`; docs/delta.md, "Agents").

The reply is a pure function of the request: the conversation's latest user message picks the
steps (a `nodes:` rule whose `when` it contains, else the top-level `steps:`), and the number
of assistant turns since that message picks the step. So the fake model keeps no state: a run
paused, resumed by another process or replayed gets the same reply at the same point, and one
fake model serves many runs at once.

    steps:                        # a plain run
      - ask_human: {prompt: "Which channel?", input_type: choice,
                    options: [stable, beta]}
      - tool: deploy              # a tool call (approval as the agent's config says)
        args: {version: "1.4.0", channel: "{answer}"}
      - say: "Shipped to {answer}."     # the final message; {answer}: the last tool result
    nodes:                        # a pipeline: the node whose prompt contains `when`
      - when: "Generate a brief plan"
        steps:
          - outcome: success      # the spec's status block (attractor §5.2)
            say: "Plan: one paragraph."
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .completions import completion, tool_call

MAX_SCRIPT_BYTES = 1 << 20
EXHAUSTED = "(the fake model's script has no more steps here)"


class ScriptError(Exception):
    """One line: why a script cannot be used."""


class Step(BaseModel):
    """One reply: exactly one of a question, a tool call, a final message or a node outcome."""

    model_config = ConfigDict(extra="forbid")

    ask_human: dict[str, Any] | None = None  # ask_human's arguments, every kind's as they are
    tool: str | None = None
    args: dict[str, Any] = Field(default_factory=dict)
    say: str | None = None
    outcome: Literal["success", "partial_success", "retry", "fail", "skipped"] | None = None
    preferred_label: str | None = None
    context_updates: dict[str, Any] | None = None
    failure_reason: str | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> Step:
        kinds = [k for k in ("ask_human", "tool", "outcome") if getattr(self, k) is not None]
        if len(kinds) > 1:
            raise ValueError(f"a step is one of ask_human, tool, say or outcome, not {kinds}")
        if not kinds and self.say is None:
            raise ValueError("a step needs ask_human, tool, say or outcome")
        if self.args and self.tool is None:
            raise ValueError("args belong to a tool step")
        return self


class NodeRule(BaseModel):
    model_config = ConfigDict(extra="forbid")

    when: str = Field(min_length=1)
    steps: list[Step]


class Script(BaseModel):
    model_config = ConfigDict(extra="forbid")

    steps: list[Step] = Field(default_factory=list)
    nodes: list[NodeRule] = Field(default_factory=list)


def load(path: Path) -> Script:
    """The script at `path`, or a one-line ScriptError."""
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_SCRIPT_BYTES + 1)
    except OSError as e:
        raise ScriptError(f"{path}: {e.strerror or e}") from None
    if len(raw) > MAX_SCRIPT_BYTES:
        raise ScriptError(f"{path}: larger than {MAX_SCRIPT_BYTES} bytes")
    try:
        return Script.model_validate(yaml.safe_load(raw) or {})
    except yaml.YAMLError as e:
        raise ScriptError(f"{path}: not YAML: {' '.join(str(e).split())}") from None
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top)"
        raise ScriptError(f"{path}: {where}: {first['msg']}") from None


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):  # content parts
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content or "")


def position(messages: list[dict[str, Any]]) -> tuple[str, int, str]:
    """(the latest user message, assistant turns since it, the latest tool result)."""
    last_user, turns, answer = "", 0, ""
    for m in messages:
        role = m.get("role")
        if role == "user":
            last_user, turns = _text(m), 0
        elif role == "assistant":
            turns += 1
        elif role == "tool":
            answer = _text(m)
    return last_user, turns, answer


def steps_for(script: Script, last_user: str) -> list[Step]:
    rule = next((r for r in script.nodes if r.when in last_user), None)
    return rule.steps if rule else script.steps


def _fill(value: Any, answer: str) -> Any:
    if isinstance(value, str):
        return value.replace("{answer}", answer)
    if isinstance(value, dict):
        return {k: _fill(v, answer) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, answer) for v in value]
    return value


def reply(script: Script, body: dict[str, Any]) -> dict[str, Any]:
    """The completion for one request (pure: the same request, the same reply)."""
    messages = body.get("messages")
    last_user, turns, answer = position(messages if isinstance(messages, list) else [])
    steps = steps_for(script, last_user)
    if turns >= len(steps):
        return completion(EXHAUSTED)
    step = steps[turns]
    if step.ask_human is not None:
        return completion(step.say, [tool_call("ask_human", _fill(step.ask_human, answer))])
    if step.tool is not None:
        return completion(step.say, [tool_call(step.tool, _fill(step.args, answer))])
    text = _fill(step.say or "", answer)
    if step.outcome is None:
        return completion(text)
    block: dict[str, Any] = {"outcome": step.outcome}
    for key in ("preferred_label", "context_updates", "failure_reason"):
        if (value := getattr(step, key)) is not None:
            block[key] = _fill(value, answer)
    return completion(f"{text or 'Done.'}\n\n```json\n{json.dumps(block)}\n```\n")
