"""The questions as MCP Tasks, pure (deltad/http/mcp_tasks.py): the ids, and each state of a
question as the task SEP-2663 describes."""

from __future__ import annotations

from typing import Any

import pytest

from deltad.http import mcp_tasks
from deltad.http.mcp_tasks import TaskRef

KEY = mcp_tasks.task_key(b"k" * 32)
ASKED, NOW = "2026-11-29T10:00:00+00:00", "2026-11-29T10:05:00+00:00"
FORM = {"method": "elicitation/create", "params": {"mode": "form", "message": "Ship it?"}}


def doc(**more: Any) -> dict[str, Any]:
    return {
        "request_id": "r1",
        "workspace": "/srv/ws/a",
        "timestamp": ASKED,
        "prompt": "Ship it?",
    } | more


def test_an_id_is_stable_names_its_question_and_cannot_be_forged() -> None:
    tid = mcp_tasks.task_of(KEY, doc())
    assert tid == mcp_tasks.task_of(KEY, doc(prompt="changed"))  # the question, not its text
    assert mcp_tasks.parse(KEY, tid) == TaskRef("/srv/ws/a", "r1", ASKED)
    assert tid != mcp_tasks.task_of(KEY, doc(workspace="/srv/ws/b"))
    assert tid != mcp_tasks.task_of(KEY, doc(request_id="r2"))
    # Another key (another inbox), a changed body or tag, junk: not ours.
    assert mcp_tasks.parse(mcp_tasks.task_key(b"x" * 32), tid) is None
    body, tag = tid.split(".")
    other = mcp_tasks.task_of(KEY, doc(request_id="r2")).split(".")[0]
    for bad in (f"{other}.{tag}", f"{body}.{tag[:-1]}", body, "", "a.b.c", "!!.!!", "x" * 5000):
        assert mcp_tasks.parse(KEY, bad) is None, bad


def test_different_session_keys_give_different_task_keys() -> None:
    assert mcp_tasks.task_key(b"a" * 32) != mcp_tasks.task_key(b"b" * 32)
    assert mcp_tasks.task_key(b"a" * 32) != b"a" * 32


@pytest.mark.parametrize(
    ("more", "status", "message", "updated"),
    [
        ({}, "input_required", "waiting for an answer: Ship it?", ASKED),
        (
            {"approvals": {"required": 2, "given": [{"by": "bob"}]}},
            "input_required",
            "1 of 2 approvals given: waiting for more",
            NOW,
        ),
        ({"answer_waiting": True}, "working", "question r1 was answered: the run takes", NOW),
    ],
)
def test_an_open_question_as_its_task(
    more: dict[str, Any], status: str, message: str, updated: str
) -> None:
    task = mcp_tasks.open_task("t", doc(expires_at="2026-11-29T11:00:00+00:00", **more), FORM, NOW)
    assert (task["taskId"], task["status"]) == ("t", status)
    assert task["statusMessage"].startswith(message)
    assert (task["createdAt"], task["lastUpdatedAt"]) == (ASKED, updated)
    assert task["ttlMs"] == 3_600_000 and task["pollIntervalMs"] == mcp_tasks.POLL_MS
    if status == "input_required":
        assert task["inputRequests"] == {"answer": FORM}
    else:
        assert "inputRequests" not in task


def test_no_deadline_is_an_unlimited_ttl() -> None:
    assert mcp_tasks.open_task("t", doc(), FORM, NOW)["ttlMs"] is None
    assert mcp_tasks.open_task("t", doc(expires_at="soon"), FORM, NOW)["ttlMs"] is None


def test_a_closed_question_as_its_task() -> None:
    ref = TaskRef("/srv/ws/a", "r1", ASKED)
    done = mcp_tasks.closed_task(ref, "t", "already_answered", "question r1 was answered", NOW)
    assert (done["status"], done["createdAt"], done["lastUpdatedAt"]) == ("completed", ASKED, NOW)
    assert done["result"]["isError"] is False
    assert done["result"]["structuredContent"]["request_id"] == "r1"
    gone = mcp_tasks.closed_task(ref, "t", "expired", "question r1 expired", NOW)
    assert gone["status"] == "cancelled" and "expired" in gone["statusMessage"]
    assert "result" not in gone and "error" not in gone  # not `failed`: no JSON-RPC error
    unknown_asked = mcp_tasks.closed_task(TaskRef("w", "r1", None), "t", "expired", "", NOW)
    assert unknown_asked["createdAt"] == NOW


def test_create_result_is_the_task_without_its_payload() -> None:
    made = mcp_tasks.create_result(mcp_tasks.open_task("t", doc(), FORM, NOW))
    assert made["resultType"] == "task" and made["status"] == "input_required"
    assert "inputRequests" not in made and made["pollIntervalMs"] == mcp_tasks.POLL_MS
