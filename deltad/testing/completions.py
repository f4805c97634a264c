"""OpenAI Chat Completions documents as the fake model answers them: a reply, a tool call.
Shared by the fake model and its scripts (deltad/testing/fakescript.py)."""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

_ids = itertools.count(1)


def tool_call(
    name: str, args: dict[str, Any] | str | None = None, id: str | None = None
) -> dict[str, Any]:
    arguments = args if isinstance(args, str) else json.dumps(args or {})
    return {
        "id": id or f"call_{next(_ids):04d}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def completion(
    content: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    finish: str | None = None,
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": f"chatcmpl-{next(_ids)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": "fake",
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": finish or ("tool_calls" if tool_calls else "stop"),
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
