"""`ScriptedModel`: an in-process ChatModel for driving the engine without a server (the way
httpx ships MockTransport). Same script vocabulary as `FakeLLM`: replies, tool calls, errors
and cut-offs, popped in order; it records every call."""

from __future__ import annotations

import json
from collections import deque
from typing import Any

from deltad.engine.llm import ChatReply, ModelRefused, ModelUnavailable, parse_completion
from deltad.errors import LLMError

from .fakellm import completion, tool_call


class ScriptedModel:
    def __init__(self) -> None:
        self._script: deque[dict[str, Any] | LLMError] = deque()
        self.calls: list[list[dict[str, Any]]] = []  # the messages of each call

    def reply(self, content: str | None = None, *calls: dict[str, Any]) -> ScriptedModel:
        self._script.append(completion(content, list(calls) or None))
        return self

    def call(
        self, name: str, args: dict[str, Any] | None = None, id: str | None = None
    ) -> ScriptedModel:
        return self.reply(None, tool_call(name, args, id))

    def cut_off(self, finish: str, content: str | None = None) -> ScriptedModel:
        self._script.append(completion(content, None, finish))
        return self

    def unavailable(self, why: str = "503 Service Unavailable") -> ScriptedModel:
        self._script.append(ModelUnavailable(why, 1, 503))
        return self

    def refuse(self, why: str = "model endpoint answered 404", status: int = 404) -> ScriptedModel:
        self._script.append(ModelRefused(why, status))
        return self

    @property
    def remaining(self) -> int:
        return len(self._script)

    # -- the ChatModel seam ----------------------------------------------------------------
    def request_body(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> dict[str, Any]:
        return {"model": "scripted", "messages": messages, "tools": tools}

    def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        body: bytes | None = None,
    ) -> ChatReply:
        self.calls.append(messages)
        if not self._script:
            raise ModelUnavailable("the script is exhausted", 1)
        item = self._script.popleft()
        if isinstance(item, LLMError):
            raise item
        return parse_completion(json.dumps(item).encode())
