"""What a webhook delivery carries, from tables: a tenant's `context` trimmed and marked, and
every body at most DELIVERY_MAX bytes whatever the question holds."""

from __future__ import annotations

import json
from typing import Any

import pytest

from deltad.outbound.notify import (
    CONTEXT_CALLS_MAX,
    CONTEXT_TEXT_MAX,
    DELIVERY_MAX,
    delivery_body,
    trimmed_context,
)


def event(**request: Any) -> dict[str, Any]:
    return {
        "id": 7,
        "type": "request.created",
        "request_id": "r1",
        "url": "http://127.0.0.1:1/#r1",
        "request": {"request_id": "r1", "prompt": "?", **request},
    }


def test_a_small_context_is_sent_as_it_is() -> None:
    doc = event(context={"task": "deploy", "tool_calls": [{"tool_name": "ls", "result": "a"}]})
    assert json.loads(delivery_body(doc)) == doc


@pytest.mark.parametrize(
    "context",
    [
        {"task": "t" * 10**6},
        {"last_message": "m" * (CONTEXT_TEXT_MAX + 1)},
        {"reviewed_output": "o" * 10**5},
        {"tool_calls": [{"tool_name": "x", "result": "r"}] * (CONTEXT_CALLS_MAX + 1)},
        {"tool_calls": [{"tool_name": "x", "arguments": {"a": "b" * 10**5}}]},
    ],
    ids=["task", "last-message", "reviewed-output", "many-calls", "large-arguments"],
)
def test_a_large_context_is_trimmed_and_marked(context: dict[str, Any]) -> None:
    body = delivery_body(event(context=context))
    assert len(body.encode()) <= DELIVERY_MAX
    request = json.loads(body)["request"]
    assert request["context_truncated"] is True
    for key in ("task", "last_message", "reviewed_output"):
        assert len(request["context"].get(key) or "") <= CONTEXT_TEXT_MAX + 1


def test_the_latest_tool_calls_are_kept_and_the_rest_counted() -> None:
    calls = [{"tool_name": f"t{i}", "result": ""} for i in range(8)]
    trimmed, cut = trimmed_context({"tool_calls": calls, "tool_calls_omitted": 3})
    assert cut and [c["tool_name"] for c in trimmed["tool_calls"]] == ["t3", "t4", "t5", "t6", "t7"]
    assert trimmed["tool_calls_omitted"] == 3 + 3


def test_a_question_too_large_even_trimmed_is_left_out_for_its_url() -> None:
    body = delivery_body(event(prompt="p" * 10**6, context={"task": "t"}))
    doc = json.loads(body)
    assert len(body.encode()) <= DELIVERY_MAX
    assert "request" not in doc and doc["request_truncated"] is True
    assert doc["url"] == "http://127.0.0.1:1/#r1" and doc["request_id"] == "r1"
