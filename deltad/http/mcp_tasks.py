"""The waiting questions as MCP Tasks (the `io.modelcontextprotocol/tasks` extension of the
2026-07-28 revision, SEP-2663): the task ids and the task documents, pure, with no SDK type
(deltad/http/mcp_adapter.py serves them; docs/inbox.md, "MCP").

A question is one task: `input_required` while it waits (its `inputRequests` the same form
answer_question's multi round-trip asks), `working` while an answer waits in the mailbox for
the run to take it, `completed` once answered, `cancelled` once it expired unanswered. Nothing
is stored here: a task's state is the question's, read from the core on every request.

The id carries the question (workspace, request id, when it was asked) and a MAC under a key
derived from the inbox's session key (kept in the state directory): stable across restarts,
not forgeable, and read back without a table. It is not a credential: every request is
authorized again by the core from the caller's token, so an id shown to one token is refused
to another that may not see the workspace, as "not found".
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

IDENTIFIER = "io.modelcontextprotocol/tasks"
POLL_MS = 5000  # a host's suggested polling interval (a subscriptions/listen stream hints sooner)
ID_MAX = 4096  # characters of a task id read at all (a longer one is not ours)
TAG_BYTES = 16
INPUT_KEY = "answer"  # the one input request a question's task makes (as answer_question's)
# The API's refusals of a question that is no longer open, as a task's end.
CLOSED = frozenset({"already_answered", "expired"})


def task_key(session_key: bytes) -> bytes:
    """The task ids' MAC key, derived from the session key (a key of its own purpose)."""
    return hmac.new(session_key, b"deltad mcp task ids", hashlib.sha256).digest()


@dataclass(frozen=True)
class TaskRef:
    """What a task id names: a question in a workspace, asked at `asked_at`."""

    workspace: str
    request_id: str
    asked_at: str | None


def _b64(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def _unb64(s: str) -> bytes:
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


def _tag(key: bytes, payload: bytes) -> bytes:
    return hmac.new(key, b"deltad mcp task\0" + payload, hashlib.sha256).digest()[:TAG_BYTES]


def task_id(key: bytes, workspace: str, request_id: str, asked_at: str | None) -> str:
    """The question's task id: the same for the same question, under the same key."""
    payload = json.dumps([workspace, request_id, asked_at], separators=(",", ":")).encode()
    return f"{_b64(payload)}.{_b64(_tag(key, payload))}"


def task_of(key: bytes, doc: Mapping[str, Any]) -> str:
    """The task id of a question document (as list_requests and get_request give it)."""
    asked = doc.get("timestamp")
    return task_id(
        key, str(doc.get("workspace")), str(doc.get("request_id")), str(asked) if asked else None
    )


def parse(key: bytes, tid: str) -> TaskRef | None:
    """The question a task id names; None when it is not one of ours (forged, cut, another
    inbox's key): the caller says "not found", as for a question it may not see."""
    if len(tid) > ID_MAX or tid.count(".") != 1:
        return None
    body, tag = tid.split(".")
    try:
        payload, got = _unb64(body), _unb64(tag)
    except (binascii.Error, ValueError):
        return None
    if not hmac.compare_digest(got, _tag(key, payload)):
        return None
    try:
        workspace, request_id, asked_at = json.loads(payload)
    except (ValueError, TypeError):
        return None
    if not isinstance(workspace, str) or not isinstance(request_id, str):
        return None
    return TaskRef(workspace, request_id, asked_at if isinstance(asked_at, str) else None)


def _ms_between(start: str | None, end: str | None) -> int | None:
    """Milliseconds from `start` to `end` (ISO 8601), None when either is missing or unread."""
    if not start or not end:
        return None
    try:
        a, b = datetime.fromisoformat(start), datetime.fromisoformat(end)
        return max(0, int((b - a).total_seconds() * 1000))
    except (ValueError, TypeError):  # unparsable, or one with an offset and one without
        return None


def _base(tid: str, status: str, created: str, updated: str, ttl: int | None) -> dict[str, Any]:
    return {
        "taskId": tid,
        "status": status,
        "createdAt": created,
        "lastUpdatedAt": updated,
        "ttlMs": ttl,
        "pollIntervalMs": POLL_MS,
    }


def open_task(
    tid: str, doc: Mapping[str, Any], input_request: Mapping[str, Any], now: str
) -> dict[str, Any]:
    """A waiting question as its task (`tasks/get`'s result, resultType aside). `input_request`
    is the form a host shows (an `elicitation/create` request); `now` is when it was read.
    The TTL is the question's deadline (none: unlimited)."""
    created = str(doc.get("timestamp") or now)
    ttl = _ms_between(created, doc.get("expires_at"))
    rid = doc.get("request_id")
    if doc.get("answer_waiting"):
        # An answer is in the mailbox: the run takes it next (the first answer wins).
        task = _base(tid, "working", created, now, ttl)
        task["statusMessage"] = f"question {rid} was answered: the run takes the answer next"
        return task
    task = _base(tid, "input_required", created, created, ttl)
    approvals = doc.get("approvals")
    given = approvals.get("given") if isinstance(approvals, Mapping) else None
    if isinstance(approvals, Mapping) and given:
        task["lastUpdatedAt"] = now  # a vote was counted since it was asked
        task["statusMessage"] = (
            f"{len(given)} of {approvals.get('required')} approvals given: waiting for more"
        )
    else:
        task["statusMessage"] = f"waiting for an answer: {doc.get('prompt') or rid}"
    task["inputRequests"] = {INPUT_KEY: dict(input_request)}
    return task


def closed_task(ref: TaskRef, tid: str, code: str, message: str, now: str) -> dict[str, Any]:
    """A question the core says is no longer open (`code`: already_answered or expired) as its
    task: answered is `completed` (the result as answer_question would have given it);
    expired unanswered is `cancelled` (by its deadline: no JSON-RPC error happened, so not
    `failed`, which the extension keeps for those)."""
    created = ref.asked_at or now
    if code == "already_answered":
        task = _base(tid, "completed", created, now, None)
        task["statusMessage"] = f"question {ref.request_id} was answered"
        task["result"] = {
            "content": [{"type": "text", "text": f"Question {ref.request_id} was answered."}],
            "structuredContent": {
                "request_id": ref.request_id,
                "workspace": ref.workspace,
                "answered": True,
            },
            "isError": False,
        }
        return task
    task = _base(tid, "cancelled", created, now, None)
    task["statusMessage"] = f"question {ref.request_id} expired unanswered: {message}"
    return task


def create_result(task: Mapping[str, Any]) -> dict[str, Any]:
    """A task as `tools/call`'s CreateTaskResult (resultType "task"): the task fields only."""
    keep = ("taskId", "status", "statusMessage", "createdAt", "lastUpdatedAt", "ttlMs")
    return {"resultType": "task", **{k: task[k] for k in keep if k in task}} | {
        "pollIntervalMs": task.get("pollIntervalMs", POLL_MS)
    }
