"""The model seam: one `ChatModel` interface; `OpenAIChatModel` speaks Chat Completions.

Endpoint and key come from DELTA_BASE_URL / DELTA_API_KEY, else the standard OPENAI_BASE_URL /
OPENAI_API_KEY, so OpenAI, vLLM, Ollama and llama.cpp servers all work. The SDK retries 408,
409, 429, 5xx, connection errors and timeouts with exponential backoff (honouring Retry-After);
what is left after that is an `LLMError` with a one-line reason.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import openai

from .agent import LLMSettings
from .errors import LLMError


@dataclass
class ChatReply:
    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)


class ChatModel(Protocol):
    def request_body(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> dict[str, Any]: ...

    def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> ChatReply: ...


def endpoint_from_env() -> tuple[str | None, str]:
    base = os.environ.get("DELTA_BASE_URL") or os.environ.get("OPENAI_BASE_URL") or None
    key = os.environ.get("DELTA_API_KEY") or os.environ.get("OPENAI_API_KEY")
    if not key:
        if base is None:
            raise LLMError("no API key: set OPENAI_API_KEY (or DELTA_API_KEY)")
        key = "unused"  # local servers (Ollama, llama.cpp) often take none
    return base, key


class OpenAIChatModel:
    def __init__(self, settings: LLMSettings) -> None:
        # Check the endpoint now (a resume must fail before touching the run), but build the
        # SDK client on first use: `import openai` costs ~0.9 s of CPU, and many runs never
        # call out (a resume that asks again, a busy workspace, an ingested crash repair).
        self._base, self._key = endpoint_from_env()
        retries = os.environ.get("DELTA_LLM_MAX_RETRIES")
        self.settings = settings
        self._retries = int(retries) if retries and retries.isdigit() else settings.max_retries

    @cached_property
    def client(self) -> openai.OpenAI:
        import openai

        return openai.OpenAI(
            api_key=self._key,
            base_url=self._base,
            max_retries=self._retries,
            timeout=self.settings.timeout_seconds,
        )

    def request_body(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.settings.model, "messages": messages}
        if tools:
            body |= {"tools": tools, "tool_choice": "auto"}
        if self.settings.temperature is not None:
            body["temperature"] = self.settings.temperature
        if self.settings.max_tokens is not None:
            body["max_tokens"] = self.settings.max_tokens
        return body

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> ChatReply:
        import openai

        try:
            resp = self.client.chat.completions.create(**self.request_body(messages, tools))
        except openai.APIStatusError as e:
            raise LLMError(f"model endpoint answered {e.status_code}: {_message(e)}") from None
        except openai.APITimeoutError:
            raise LLMError("model endpoint timed out (after retries)") from None
        except openai.APIConnectionError as e:
            raise LLMError(f"cannot reach the model endpoint: {e.__cause__ or e}") from None
        except openai.OpenAIError as e:
            raise LLMError(f"model call failed: {e}") from None
        raw = resp.model_dump(mode="json", exclude_none=True)
        if not resp.choices:
            raise LLMError("model endpoint returned no choices")
        msg = resp.choices[0].message
        calls = [c.model_dump(mode="json") for c in (msg.tool_calls or [])]
        return ChatReply(msg.content, calls, raw)


def _message(e: openai.APIStatusError) -> str:
    body = e.body if isinstance(e.body, dict) else {}
    err = body.get("error", body) if isinstance(body, dict) else {}
    text = err.get("message") if isinstance(err, dict) else None
    return " ".join(str(text or e.message).split())[:300]
