"""The inbox as an MCP server (streamable HTTP), behind this one module: the official `mcp`
SDK's types and server are imported here and nowhere else, so the next revision of the spec
(it changed three times in a year) is a change to this file only.

What an MCP host sees (docs/inbox.md, "MCP"):

    tools      list_questions  the waiting questions this token may see (a page of them)
               get_question    one question, whole (prompt, options, bounds, context, calls)
               answer_question answer it: the same answering path as POST /v1/requests/{id}/answer,
                               recorded with channel "mcp" and the token's name as answered_by
    resources  deltad://questions/{request_id}?workspace=...  each waiting question, readable
    events     resources list_changed on a `subscriptions/listen` stream (2026-07-28) whenever a
               question is asked, answered or expires; the list itself shows only what the
               token may see
    tasks      io.modelcontextprotocol/tasks (2026-07-28): each question as a task, tasks/get,
               tasks/update (answers it), tasks/cancel (acknowledged only); no tasks/list

Every call is authenticated again from its own HTTP request's bearer token (the same tokens,
roles and scopes as the API; with `http.oidc`, a provider's JWT as a person, by the API's own
check), and everything that reads or writes a workspace is an operation
of the core's table (deltad/inbox/ops.py), asked by name through a `Caller` (in the inbox
process: the core, which checks it all again). A secret is never
answered here (the core refuses it too). Clocks: only a task's `lastUpdatedAt` (now, once
something changed since the question was asked); the feed's events arrive on its reader's
thread and are handed to the event loop.

On a 2026-07-28 connection, answer_question called without an answer takes the spec's
multi round-trip path (SEP-2322): it returns `input_required` with an elicitation form built
from the question's kind and a `requestState` the SDK's RequestStateBoundary seals (AES-GCM,
bound to the token, the call's arguments, ten minutes); the same call again with the filled
form answers.

On a 2026-07-28 connection whose request declares the Tasks extension
(`io.modelcontextprotocol/tasks`, SEP-2663), each question the token may see is also a task
(deltad/http/mcp_tasks.py: ids and documents, pure): answer_question without an answer returns
it (resultType "task"), list_questions and get_question name each question's `task_id`;
`tasks/get` reads it (input_required with the form, working, completed, cancelled),
`tasks/update` answers it through the same answering path, `tasks/cancel` is acknowledged and
changes nothing (a question is the agent's: no caller of the inbox may withdraw it). There is no
`tasks/list` (the extension has none). The SDK ships the extension seam (`Extension`,
`MethodBinding`) and no Tasks implementation: the methods are bound here, on that seam.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

import anyio
import anyio.to_thread
import mcp_types as types
import structlog
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding, compose_tool_call_handler
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.models import InitializationOptions
from mcp.server.request_state import RequestStateBoundary, RequestStateSecurity
from mcp.server.session import ServerSession
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.subscriptions import (
    ListenHandler,
    ResourcesListChanged,
    ServerEvent,
    SubscriptionBus,
)
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import Field
from starlette.types import Receive, Scope, Send

from deltad import __version__
from deltad.http import limits, mcp_tasks, oidc
from deltad.http.access import McpMetrics
from deltad.http.mcp_gate import Unauthorized, identify
from deltad.inbox import oidc as people
from deltad.inbox import scopes
from deltad.inbox.config import McpConfig
from deltad.inbox.feed import FeedEvent
from deltad.inbox.ops import ApiError, Caller
from deltad.inbox.tokens import Identity, TokenError, TokenStore

log = structlog.get_logger("deltad.mcp")

CHANNEL = "mcp"
URI_PREFIX = "deltad://questions/"
PAGE_MAX = 100  # questions one list_questions or resources/list call returns at most
PROMPT_PREVIEW = 200  # characters of a prompt in a list's line
STATE_SECONDS = 600.0  # how long an answer_question form stays answerable
LISTEN_BACKLOG = 64  # hints a listening stream may have unsent (beyond: the SDK ends it)
# Feed events that change what a token's list holds or may answer (an escalation adds people).
CHANGED = frozenset({"request.created", "request.answered", "request.expired", "request.escalated"})

# -- the tools, as MCP hosts see them --------------------------------------------------------
_WORKSPACE = {
    "type": "string",
    "description": "The question's workspace, as listed (needed only when one request id is "
    "open in several workspaces).",
}
TOOLS: tuple[types.Tool, ...] = (
    types.Tool(
        name="list_questions",
        title="Waiting questions",
        description="The questions agents are waiting on that this token may see and answer, "
        "newest first. Follow next_cursor for more.",
        input_schema={
            "type": "object",
            "properties": {
                "workspace": {"type": "string", "description": "A workspace glob to filter by."},
                "input_type": {
                    "type": "string",
                    "description": "Only this kind (text, choice, approval, number, ...).",
                },
                "limit": {"type": "integer", "minimum": 1, "maximum": PAGE_MAX, "default": 20},
                "cursor": {"type": "string", "description": "A previous page's next_cursor."},
                "mine": {
                    "type": "boolean",
                    "default": False,
                    "description": "Only the questions that name this caller (as a respondent, "
                    "by one of its groups, handed or escalated to it); not those anyone may "
                    "answer.",
                },
            },
            "additionalProperties": False,
        },
        annotations=types.ToolAnnotations(read_only_hint=True, open_world_hint=False),
    ),
    types.Tool(
        name="get_question",
        title="Read a question",
        description="One waiting question, whole: its prompt, what the answer must be (options, "
        "bounds), its context and, for an approval, the calls it gates.",
        input_schema={
            "type": "object",
            "properties": {"request_id": {"type": "string"}, "workspace": _WORKSPACE},
            "required": ["request_id"],
            "additionalProperties": False,
        },
        annotations=types.ToolAnnotations(read_only_hint=True, open_world_hint=False),
    ),
    types.Tool(
        name="answer_question",
        title="Answer a question",
        description="Answer a waiting question as this token; the agent's run resumes. Give "
        "`answer` (text; a choice's key or label; yes/no; a number; a date) or, for an approval "
        "of gated calls, `decisions`. Secrets are never answered here: use the inbox page.",
        input_schema={
            "type": "object",
            "properties": {
                "request_id": {"type": "string"},
                "workspace": _WORKSPACE,
                "answer": {"type": "string"},
                "decisions": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "action_id": {"type": "string"},
                            "decision": {"type": "string", "enum": ["approve", "reject", "edit"]},
                            "arguments": {"type": "object"},
                            "reason": {"type": "string"},
                        },
                        "required": ["action_id", "decision"],
                    },
                },
                "comment": {"type": "string", "description": "A note kept with the answer."},
                "idempotency_key": {
                    "type": "string",
                    "maxLength": 200,
                    "description": "A key of your choosing: a retry with the same key and "
                    "answer gets the first call's result (kept 24 hours), not a refusal.",
                },
            },
            "required": ["request_id"],
            "additionalProperties": False,
        },
        annotations=types.ToolAnnotations(
            read_only_hint=False, destructive_hint=False, idempotent_hint=False
        ),
    ),
)

TOOL_NAMES = frozenset(t.name for t in TOOLS)


# -- the read model as MCP results (pure: tested from a table) --------------------------------
def summary(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A question as one entry of a list: what a person needs to pick it."""
    prompt = str(doc.get("prompt") or "")
    out: dict[str, Any] = {
        "request_id": doc.get("request_id"),
        "workspace": doc.get("workspace"),
        "input_type": doc.get("input_type"),
        "prompt": prompt if len(prompt) <= PROMPT_PREVIEW else prompt[: PROMPT_PREVIEW - 1] + "…",
        "task": doc.get("task"),
        "asked_at": doc.get("timestamp"),
        "expires_at": doc.get("expires_at"),
        "sensitive": bool(doc.get("sensitive")),
        "url": doc.get("url"),
    }
    if doc.get("options"):
        out["options"] = [_option(o) for o in doc["options"]]
    return out


def _option(o: Any) -> str:
    if isinstance(o, Mapping):
        key, label = o.get("key"), o.get("label")
        return f"{key}: {label}" if key is not None and label not in (None, key) else str(label)
    return str(o)


def line(s: Mapping[str, Any]) -> str:
    """A summary as one line of text (for hosts that show only text)."""
    parts = [f"[{s['request_id']}]", f"({s['input_type']})", str(s["prompt"])]
    if s.get("options"):
        parts.append("— options: " + ", ".join(s["options"]))
    if s.get("sensitive"):
        parts.append("— a secret: answer it on the inbox page")
    parts.append(f"— workspace {s['workspace']}")
    return " ".join(parts)


def list_result(page: Mapping[str, Any], task_key: bytes | None = None) -> types.CallToolResult:
    """`list_requests`' page as list_questions' result (with `task_key`: each question's task
    id, for a host that follows it with `tasks/get`)."""
    found = [summary(d) for d in page.get("requests", [])]
    if task_key is not None:
        for s, d in zip(found, page.get("requests", []), strict=True):
            s["task_id"] = mcp_tasks.task_of(task_key, d)
    text = "\n".join(line(s) for s in found) if found else "No question is waiting for you."
    if page.get("next"):
        text += "\n(more: call list_questions again with cursor = next_cursor)"
    return types.CallToolResult(
        content=[types.TextContent(text=text)],
        structured_content={"questions": found, "next_cursor": page.get("next")},
    )


QUESTION_FIELDS = (
    "request_id",
    "workspace",
    "run_id",
    "task",
    "agent",
    "prompt",
    "input_type",
    "expects",
    "bounds",
    "options",
    "minimum",
    "maximum",
    "default",
    "allow_empty",
    "sensitive",
    "expires_at",
    "after_deadline",
    "respondents",
    "delegations",
    "approvals",
    "follow_up",
    "context",
    "calls",
    "timestamp",
    "answer_waiting",
    "last_refusal",
    "url",
)


def question(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A question whole, as get_question gives it (the page's form and internals left out)."""
    return {k: doc[k] for k in QUESTION_FIELDS if doc.get(k) is not None}


def question_result(doc: Mapping[str, Any], task_key: bytes | None = None) -> types.CallToolResult:
    q = question(doc)
    if task_key is not None:
        q["task_id"] = mcp_tasks.task_of(task_key, doc)
    lines = [line(summary(doc)), ""]
    if q.get("prompt"):
        lines.append(str(q["prompt"]))
    if q.get("expects"):
        lines.append(f"Expects: {q['expects']}")
    if q.get("bounds"):
        lines.append(f"Bounds: {q['bounds']}")
    for c in q.get("calls", []):
        args = json.dumps(c.get("arguments"), sort_keys=True)
        lines.append(f"Gated call {c.get('action_id')}: {c.get('tool_name')}({args})")
    if q.get("expires_at"):
        lines.append(f"Expires at {q['expires_at']} ({q.get('after_deadline') or 'no default'})")
    return types.CallToolResult(
        content=[types.TextContent(text="\n".join(lines))], structured_content=q
    )


def answered_result(doc: Mapping[str, Any]) -> types.CallToolResult:
    """The core's 202 document: an answer, or (four eyes) a vote that may not complete it."""
    rid, by = doc.get("request_id"), doc.get("answered_by")
    approvals = doc.get("approvals")
    if doc.get("answered") is False and isinstance(approvals, Mapping):
        given = approvals.get("given") or []
        text = (
            f"Vote counted on question {rid} as {by}: {len(given)} of "
            f"{approvals.get('required')} approvals; the run resumes once enough people agree."
        )
    else:
        text = f"Answered question {rid} as {by}: the run in {doc.get('workspace')} resumes."
    content: list[types.ContentBlock] = [types.TextContent(text=text)]
    return types.CallToolResult(content=content, structured_content=dict(doc))


def refused(code: str, message: str) -> types.CallToolResult:
    """A tool call that changed nothing, with the API's code and its one line."""
    return types.CallToolResult(
        content=[types.TextContent(text=f"refused ({code}): {message}")],
        structured_content={"error": message, "code": code},
        is_error=True,
    )


def secret_refused(doc: Mapping[str, Any]) -> types.CallToolResult:
    return refused(
        "secret",
        f"question {doc.get('request_id')} asks for a secret, which is never answered over MCP: "
        f"answer it on the inbox page ({doc.get('url')})",
    )


def answer_body(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The API's answer body from answer_question's arguments (the answering path checks it)."""
    return {k: arguments[k] for k in ("answer", "decisions", "comment") if k in arguments}


ELICITED = "answer"  # the key of the one input request answer_question makes


def elicitation(doc: Mapping[str, Any]) -> dict[str, Any] | None:
    """The form (an elicitation's flat `requestedSchema`) a host shows to answer `doc`; None
    when a form cannot ask it (a secret: never; a control a form has no field for). Built from
    the question's `form` (protocol/kinds.py, what the page builds from): the kinds are the
    vocabulary's to tell apart, not this adapter's."""
    form = doc.get("form")
    if doc.get("sensitive") or not isinstance(form, Mapping):
        return None
    keys = [k for k in form.get("keys") or [] if isinstance(k, Mapping)]
    extra: dict[str, Any] = {}
    control, kind = form.get("control"), form.get("type")
    if control == "input" and kind in ("text", "number", "date"):
        field: dict[str, Any] = {"type": "number" if kind == "number" else "string"}
        field["title"] = "Answer"
        if kind == "number":
            field |= {k: doc[k] for k in ("minimum", "maximum") if doc.get(k) is not None}
        elif kind == "date":
            field["format"] = "date"
    elif control == "keys" and keys:
        answers = [(str(k.get("answer") or k.get("key")), str(k.get("label"))) for k in keys]
        field = {"type": "string", "title": "Answer"}
        field["oneOf"] = [{"const": a, "title": label} for a, label in answers]
    elif control == "decisions":
        # A form cannot edit a call's arguments (the page can): approve or reject every call.
        decisions = [str(k.get("decision")) for k in keys]
        field = {"type": "string", "title": "Decision"}
        field["enum"] = [d for d in decisions if d in ("approve", "reject")]
        if any(k.get("reason") for k in keys):
            extra = {"reason": {"type": "string", "title": "Reason (for a rejection)"}}
    else:
        return None
    return {"type": "object", "properties": {ELICITED: field, **extra}, "required": [ELICITED]}


def elicited_text(control: str, content: Mapping[str, Any]) -> str:
    """A filled form as the answer's text, read by the question's kind like any other; a
    rejection's reason (a `decisions` form) goes with it."""
    value = content.get(ELICITED)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = "" if value is None else str(value)
    reason = content.get("reason")
    if control == "decisions" and text == "reject" and isinstance(reason, str) and reason:
        return f"reject: {reason}"
    return text


def uri_of(doc: Mapping[str, Any]) -> str:
    return (
        f"{URI_PREFIX}{quote(str(doc.get('request_id')), safe='')}"
        f"?workspace={quote(str(doc.get('workspace')), safe='')}"
    )


def parse_uri(uri: str) -> tuple[str, str | None]:
    """(request id, workspace) from a question's URI; ValueError when it is not one."""
    if not uri.startswith(URI_PREFIX):
        raise ValueError(f"not a question: {uri[:200]}")
    parts = urlsplit(uri)
    rid = unquote(parts.path.lstrip("/"))
    workspace = parse_qs(parts.query).get("workspace", [None])[0]
    if not rid:
        raise ValueError("a question's URI names its request id")
    return rid, workspace


def resource_of(doc: Mapping[str, Any]) -> types.Resource:
    s = summary(doc)
    return types.Resource(
        uri=uri_of(doc),
        name=str(s["request_id"]),
        title=str(s["prompt"])[:80] or str(s["request_id"]),
        description=line(s),
        mime_type="application/json",
    )


# -- the server ---------------------------------------------------------------------------------
@dataclass
class Inbox:
    """What the handlers need: the core's operations (they reach workspaces), and the tokens."""

    calls: Caller
    tokens: TokenStore
    metrics: McpMetrics | None = None
    # The task ids' key (mcp_tasks.task_key of the inbox's session key: stable across restarts).
    task_key: bytes = field(default_factory=lambda: os.urandom(32))
    # The OIDC provider whose JWTs are taken too (its keys were fetched at the gate, for this
    # same request: the check here finds them held).
    provider: oidc.Provider | None = None

    def counted(
        self, tool: str, result: types.CallToolResult | types.InputRequiredResult
    ) -> types.CallToolResult | types.InputRequiredResult:
        if self.metrics is not None:
            outcome = (
                "input_required"
                if isinstance(result, types.InputRequiredResult)
                else "refused"
                if result.is_error
                else "ok"
            )
            self.metrics.called(tool, outcome)
        return result

    def who(self, ctx: ServerRequestContext[Any, Any]) -> Identity:
        request = ctx.request
        headers = getattr(request, "headers", None)
        try:
            authorization = headers.get("authorization") if headers else None
            return identify(self.tokens, authorization, self.provider)
        except Unauthorized as e:  # revoked since the HTTP layer let the request in
            raise MCPError(-32001, str(e)) from None

    # Each runs in a worker thread: a call to the core blocks until the core answers.
    def list_page(
        self, who: Identity, args: Mapping[str, Any], limit_default: int = 20
    ) -> dict[str, Any]:
        limit = args.get("limit", limit_default)
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= PAGE_MAX:
            raise ApiError(422, "bad_page", f"limit: from 1 to {PAGE_MAX}")
        mine = args.get("mine", False)
        if not isinstance(mine, bool):
            raise ApiError(422, "bad_request", "mine: true or false")
        return self.calls.call(
            "list_requests",
            who,
            workspace=_text(args, "workspace"),
            input_type=_text(args, "input_type"),
            limit=limit,
            cursor=_text(args, "cursor"),
            mine=mine,
        )

    def get_request(self, who: Identity, rid: str, workspace: str | None) -> dict[str, Any]:
        return self.calls.call("get_request", who, request_id=rid, workspace=workspace)

    def answer_for(
        self,
        who: Identity,
        rid: str,
        body: dict[str, Any],
        key: str | None,
        workspace: str | None,
    ) -> dict[str, Any]:
        """The core's answer, recorded with the MCP channel (a secret is refused there too)."""
        return self.calls.call(
            "answer",
            who,
            request_id=rid,
            body=body,
            idempotency_key=key,
            workspace=workspace,
            channel=CHANNEL,
        )

    def tool(self, who: Identity, name: str, args: Mapping[str, Any]) -> types.CallToolResult:
        if name not in TOOL_NAMES:
            return refused("unknown_tool", f"no tool {name[:80]!r}")
        try:
            if name == "list_questions":
                return list_result(self.list_page(who, args), self.task_key)
            rid = _text(args, "request_id")
            if not rid:
                raise ApiError(422, "bad_request", "request_id: a question's id is needed")
            if name == "get_question":
                doc = self.get_request(who, rid, _text(args, "workspace"))
                return question_result(doc, self.task_key)
            return self.answer(who, rid, args)
        except ApiError as e:
            return refused(e.code, str(e))

    def answer(self, who: Identity, rid: str, args: Mapping[str, Any]) -> types.CallToolResult:
        """Straight to the core's answer (it finds the workspace, refuses a secret over MCP,
        and with an idempotency key gives a retry the first answer's result)."""
        if not who.can_answer():
            raise ApiError(403, "forbidden", f"token {who.name} may read, not answer ({who.role})")
        key, workspace = _text(args, "idempotency_key"), _text(args, "workspace")
        done = self.answer_for(who, rid, answer_body(args), key, workspace)
        log.info("mcp_answered", token=who.name, request_id=rid)
        return answered_result(done)

    def elicit(
        self,
        who: Identity,
        args: Mapping[str, Any],
        responses: Mapping[str, Any] | None,
        state: str | None,
    ) -> types.CallToolResult | types.InputRequiredResult:
        """answer_question with no answer, on a 2026-07-28 connection: the question asked as
        an elicitation form (multi round-trip, SEP-2322), then answered from what the person
        filled in. `state` comes back verified (RequestStateBoundary: sealed, bound to the
        token, the tool's arguments and ten minutes)."""
        try:
            rid = _text(args, "request_id")
            if not rid:
                raise ApiError(422, "bad_request", "request_id: a question's id is needed")
            if not who.can_answer():
                raise ApiError(403, "forbidden", f"token {who.name} may read, not answer")
            if state is None or responses is None:
                return self.ask(who, rid, _text(args, "workspace"))
            asked = json.loads(state)
            reply = responses.get(ELICITED)
            if not isinstance(reply, types.ElicitResult) or reply.action != "accept":
                return refused(
                    "declined", f"question {rid} was not answered (the form was not sent)"
                )
            body = {"answer": elicited_text(str(asked.get("control")), reply.content or {})}
            done = self.answer_for(who, rid, body, None, asked["workspace"])
        except ApiError as e:
            return refused(e.code, str(e))
        log.info("mcp_answered", token=who.name, request_id=rid, through="elicitation")
        return answered_result(done)

    def ask(
        self, who: Identity, rid: str, workspace: str | None
    ) -> types.CallToolResult | types.InputRequiredResult:
        doc = self.get_request(who, rid, workspace)
        if doc.get("sensitive"):
            return secret_refused(doc)
        form = form_of(doc)
        if form is None:
            return refused("answer_needed", f"question {rid}: give `answer` or `decisions`")
        form_doc = doc.get("form")
        control = form_doc.get("control") if isinstance(form_doc, Mapping) else None
        state = {"workspace": doc.get("workspace"), "control": control}
        return types.InputRequiredResult(
            input_requests={ELICITED: types.ElicitRequest(params=form)},
            request_state=json.dumps(state),
        )

    # -- the Tasks extension (each runs in a worker thread; errors are JSON-RPC's) -------------
    def task_created(self, who: Identity, args: Mapping[str, Any], now: str) -> dict[str, Any]:
        """answer_question without an answer, from a host that declared the extension: the
        question's task (CreateTaskResult), which the host follows with tasks/get."""
        rid = _text(args, "request_id")
        if not rid:
            raise ApiError(422, "bad_request", "request_id: a question's id is needed")
        if not who.can_answer():
            raise ApiError(403, "forbidden", f"token {who.name} may read, not answer")
        doc = self.get_request(who, rid, _text(args, "workspace"))
        tid = mcp_tasks.task_of(self.task_key, doc)
        return mcp_tasks.create_result(mcp_tasks.open_task(tid, doc, task_input(doc), now))

    def _task(self, who: Identity, tid: str) -> tuple[mcp_tasks.TaskRef, dict[str, Any]]:
        """The question a task id names, open (ApiError: closed, or not this token's)."""
        ref = mcp_tasks.parse(self.task_key, tid)
        if ref is None:
            raise ApiError(404, "unknown_request", "no such task")
        return ref, self.get_request(who, ref.request_id, ref.workspace)

    def task_get(self, who: Identity, tid: str, now: str) -> dict[str, Any]:
        try:
            _, doc = self._task(who, tid)
        except ApiError as e:
            ref = mcp_tasks.parse(self.task_key, tid)
            if ref is None or e.code not in mcp_tasks.CLOSED:
                raise task_error(e) from None
            return mcp_tasks.closed_task(ref, tid, e.code, str(e), now)
        return mcp_tasks.open_task(tid, doc, task_input(doc), now)

    def task_update(self, who: Identity, tid: str, responses: Mapping[str, Any]) -> None:
        """The filled form answers the question: the same call to the core as answer_question
        (respondents, approvals, a bound call's digest, the first answer wins, the audit).
        A response to no outstanding request, or a declined form, is ignored (SEP-2663)."""
        try:
            ref, doc = self._task(who, tid)
            reply = responses.get(mcp_tasks.INPUT_KEY)
            if not isinstance(reply, Mapping) or reply.get("action") != "accept":
                return
            if doc.get("sensitive") or elicitation(doc) is None:
                return  # asked as a link to the page (url mode): answered there, not here
            if not who.can_answer():
                raise ApiError(403, "forbidden", f"token {who.name} may read, not answer")
            form = doc.get("form")
            control = str(form.get("control")) if isinstance(form, Mapping) else ""
            content = reply.get("content")
            text = elicited_text(control, content if isinstance(content, Mapping) else {})
            # A retried update gets the first one's result: one key per task and token.
            key = "mcp-task:" + hashlib.sha256(tid.encode()).hexdigest()[:40]
            self.answer_for(who, ref.request_id, {"answer": text}, key, ref.workspace)
        except ApiError as e:
            raise task_error(e) from None
        log.info("mcp_answered", token=who.name, request_id=ref.request_id, through="task")

    def task_cancel(self, who: Identity, tid: str) -> None:
        """Acknowledged, nothing changed: the question is the agent's, and no caller of the
        inbox may withdraw it (cancellation is cooperative in SEP-2663: the ack promises no
        `cancelled`). An id this token may not see is "not found", as for tasks/get."""
        try:
            ref, _ = self._task(who, tid)
        except ApiError as e:
            if e.code not in mcp_tasks.CLOSED:
                raise task_error(e) from None
            return  # closed already: nothing to cancel
        log.info("mcp_task_cancel_ignored", token=who.name, request_id=ref.request_id)


def form_of(doc: Mapping[str, Any]) -> types.ElicitRequestFormParams | None:
    """The elicitation form answering `doc` asks (None: no form can ask it)."""
    schema = elicitation(doc)
    if schema is None:
        return None
    message = f"{doc.get('prompt')}\n(expects {doc.get('expects')})"
    return types.ElicitRequestFormParams(message=message, requested_schema=schema)


def task_input(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A question's task's input request: its form, or for what no form may ask (a secret, an
    edit of gated calls) a link to the question on the inbox page (url mode)."""
    form = None if doc.get("sensitive") else form_of(doc)
    params: types.ElicitRequestFormParams | types.ElicitRequestURLParams = (
        form
        if form is not None
        else types.ElicitRequestURLParams(
            message=f"{doc.get('prompt')}\n(answer it on the inbox page)", url=str(doc.get("url"))
        )
    )
    return types.ElicitRequest(params=params).model_dump(
        by_alias=True, mode="json", exclude_none=True
    )


TASK_NOT_FOUND = "Failed to retrieve task: Task not found"


def task_error(e: ApiError) -> MCPError:
    """A refusal as the extension's JSON-RPC error: -32602 for what the caller sent (an id it
    may not see is "not found", as if it did not exist), -32603 for the inbox's own trouble."""
    if e.code in ("unknown_request", "unknown_workspace"):  # the id names both: one answer
        return MCPError(types.INVALID_PARAMS, TASK_NOT_FOUND)
    if e.http >= 500:
        return MCPError(types.INTERNAL_ERROR, f"{e.code}: {e}")
    return MCPError(types.INVALID_PARAMS, f"{e.code}: {e}", {"code": e.code})


def _text(args: Mapping[str, Any], key: str) -> str | None:
    v = args.get(key)
    if v is None:
        return None
    if not isinstance(v, str):
        raise ApiError(422, "bad_request", f"{key}: a string")
    return v


class Hub:
    """Who listens (each `subscriptions/listen` stream, with the token it was opened with), and
    the feed's events told to those whose scope holds the event's workspace only: a token
    scoped elsewhere never learns that a question came or went. An event is a hint (the list
    is read afresh, checked by the core); the scope is matched on the path as the feed names it
    (no file is looked at here: the inbox process holds no workspace)."""

    def __init__(self, tokens: TokenStore, cap: int, sessions: int = 1000) -> None:
        self.tokens, self.cap, self.sessions = tokens, cap, sessions
        self._listeners: dict[object, tuple[Identity, Callable[[ServerEvent], None]]] = {}
        # Sessions of the handshake era (2025-11-25 and before), by Mcp-Session-Id: told on
        # their standalone stream (`notifications/resources/list_changed`), the newest kept.
        self._legacy: OrderedDict[str, tuple[Identity, ServerSession]] = OrderedDict()
        self._sending: set[asyncio.Future[None]] = set()

    def remember(self, session_id: str, who: Identity, session: ServerSession) -> None:
        """A handshake-era session made a request as `who` (on the event loop)."""
        self._legacy[session_id] = (who, session)
        self._legacy.move_to_end(session_id)
        while len(self._legacy) > self.sessions:
            self._legacy.popitem(last=False)

    def _tell(self, session_id: str, session: ServerSession) -> None:
        task = asyncio.ensure_future(session.send_resource_list_changed())
        self._sending.add(task)  # held until done (the loop keeps only a weak reference)

        def done(t: asyncio.Future[None]) -> None:
            self._sending.discard(t)
            if t.cancelled() or t.exception() is not None:  # the session is gone
                self._legacy.pop(session_id, None)

        task.add_done_callback(done)

    def view(self, who: Identity) -> SubscriptionBus:
        hub = self

        class View:
            async def publish(self, event: ServerEvent) -> None:  # the hub publishes, not a view
                raise NotImplementedError

            def subscribe(self, listener: Callable[[ServerEvent], None]) -> Callable[[], None]:
                return hub.subscribe(who, listener)

        return View()

    def subscribe(
        self, who: Identity, listener: Callable[[ServerEvent], None]
    ) -> Callable[[], None]:
        if len(self._listeners) >= self.cap:
            raise MCPError(-32603, f"{self.cap} listening streams are open already: try later")
        key = object()
        self._listeners[key] = (who, listener)

        def unsubscribe() -> None:
            self._listeners.pop(key, None)

        return unsubscribe

    def changed(self, workspace: str | None) -> None:
        """On the event loop: tell each listener allowed to see `workspace` (None: everyone).
        Each token is looked up once per event, however many streams it has open."""
        standing: dict[Identity, bool] = {}

        def told(who: Identity) -> bool:
            if workspace is not None and not scopes.allows_at(who.scopes, workspace, workspace):
                return False
            if who not in standing:
                standing[who] = _still(self.tokens, who)
            return standing[who]

        for who, listener in list(self._listeners.values()):
            if told(who):
                listener(ResourcesListChanged())
        for session_id, (who, session) in list(self._legacy.items()):
            if told(who):
                self._tell(session_id, session)
            elif standing.get(who) is False:  # revoked or changed: never told again
                self._legacy.pop(session_id, None)

    def __len__(self) -> int:
        """Open listening streams (handshake-era sessions are only known to have left when a
        notice to one fails: they are not counted)."""
        return len(self._listeners)


def _still(tokens: TokenStore, who: Identity) -> bool:
    """Whether `who`'s token still stands as it was (revoked or changed: no more hints). A
    person signed in through OIDC has no token: their JWT was checked when the stream was
    opened, and a hint only says to read the list again (read with a JWT checked anew)."""
    if people.is_person(who.name):
        return True
    try:
        held = tokens.by_name(who.name)
    except TokenError:
        return False
    return held is not None and held[1] == who


class _Server(Server[Any]):
    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        """Handshake-era clients are told the resource list changes (on their GET stream), and
        not told of the Tasks extension (SEP-2663 defines it from 2026-07-28 only)."""
        told = notification_options or NotificationOptions(resources_changed=True)
        return super().create_initialization_options(
            told, experimental_capabilities, extensions if extensions is not None else {}
        )


class UpdateTaskParams(types.RequestParams):
    task_id: str
    input_responses: dict[str, Any] = Field(default_factory=dict)


def _now() -> str:
    """Now, as the daemon writes a question's times (UTC, `Z`)."""
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def declares_tasks(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Whether this request's client declared the Tasks extension (2026-07-28 only)."""
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return False
    caps = ctx.session.client_capabilities
    return caps is not None and mcp_tasks.IDENTIFIER in (caps.extensions or {})


class Tasks(Extension):
    """The Tasks extension's methods, on the SDK's extension seam (no `tasks/list`: SEP-2663
    has none, so an id is learned only from a tool's result)."""

    identifier = mcp_tasks.IDENTIFIER

    def __init__(self, inbox: Inbox) -> None:
        self.inbox = inbox

    def methods(self) -> list[MethodBinding]:
        modern = frozenset(MODERN_PROTOCOL_VERSIONS)
        return [
            MethodBinding("tasks/get", types.GetTaskRequestParams, self.get, modern),
            MethodBinding("tasks/update", UpdateTaskParams, self.update, modern),
            MethodBinding("tasks/cancel", types.CancelTaskRequestParams, self.cancel, modern),
        ]

    def caller(self, ctx: ServerRequestContext[Any, Any]) -> Identity:
        """The token, on a connection and request the extension is negotiated on (SEP-2663:
        -32021 for a request that did not declare it; not a method before 2026-07-28)."""
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            raise MCPError(types.METHOD_NOT_FOUND, "Method not found", ctx.method)
        who = self.inbox.who(ctx)
        if not declares_tasks(ctx):
            need: dict[str, Any] = {"requiredCapabilities": {"extensions": {self.identifier: {}}}}
            raise MCPError(
                types.MISSING_REQUIRED_CLIENT_CAPABILITY, "Missing required client capability", need
            )
        return who

    async def intercept_tool_call(
        self,
        params: types.CallToolRequestParams,
        ctx: ServerRequestContext[Any, Any],
        call_next: CallNext,
    ) -> HandlerResult:
        """answer_question without an answer, from a host that declared the extension: the
        question as its task (CreateTaskResult), followed with tasks/get and tasks/update.
        Any other call (and this one from other hosts: the form) goes on as before."""
        args = dict(params.arguments or {})
        unanswered = not answer_body(args).keys() & {"answer", "decisions"}
        if params.name != "answer_question" or not unanswered or not declares_tasks(ctx):
            return await call_next(ctx)
        inbox, who = self.inbox, self.inbox.who(ctx)
        try:
            task = await anyio.to_thread.run_sync(inbox.task_created, who, args, _now())
        except ApiError as e:
            return inbox.counted(params.name, refused(e.code, str(e)))
        if inbox.metrics is not None:
            inbox.metrics.called(params.name, "task")
        return task

    async def get(
        self, ctx: ServerRequestContext[Any, Any], params: types.GetTaskRequestParams
    ) -> dict[str, Any]:
        who = self.caller(ctx)
        return await anyio.to_thread.run_sync(self.inbox.task_get, who, params.task_id, _now())

    async def update(
        self, ctx: ServerRequestContext[Any, Any], params: UpdateTaskParams
    ) -> dict[str, Any]:
        who = self.caller(ctx)
        responses = params.input_responses
        await anyio.to_thread.run_sync(self.inbox.task_update, who, params.task_id, responses)
        return {}

    async def cancel(
        self, ctx: ServerRequestContext[Any, Any], params: types.CancelTaskRequestParams
    ) -> dict[str, Any]:
        who = self.caller(ctx)
        await anyio.to_thread.run_sync(self.inbox.task_cancel, who, params.task_id)
        return {}


def build_server(inbox: Inbox, hub: Hub) -> Server[Any]:
    def caller_of(ctx: ServerRequestContext[Any, Any]) -> Identity:
        """The caller (and a handshake-era session, remembered to be told of changes)."""
        caller = inbox.who(ctx)
        headers = getattr(ctx.request, "headers", None)
        sid = headers.get(MCP_SESSION_ID_HEADER) if headers is not None else None
        if sid and ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            hub.remember(sid, caller, ctx.session)
        return caller

    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        caller_of(ctx)
        return types.ListToolsResult(tools=list(TOOLS))

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        who = caller_of(ctx)
        args = dict(params.arguments or {})
        unanswered = not answer_body(args).keys() & {"answer", "decisions"}
        if (
            params.name == "answer_question"
            and ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
            and unanswered
        ):
            responses, state = params.input_responses, params.request_state
            asked = await anyio.to_thread.run_sync(inbox.elicit, who, args, responses, state)
            return inbox.counted(params.name, asked)
        result = await anyio.to_thread.run_sync(inbox.tool, who, params.name, args)
        return inbox.counted(params.name, result)

    async def list_resources(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        who = caller_of(ctx)
        cursor = params.cursor if params is not None else None
        try:
            page = await anyio.to_thread.run_sync(
                inbox.list_page, who, {"cursor": cursor, "limit": PAGE_MAX}
            )
        except ApiError as e:
            raise MCPError(-32602, f"{e.code}: {e}") from None
        return types.ListResourcesResult(
            resources=[resource_of(d) for d in page.get("requests", [])],
            next_cursor=page.get("next"),
        )

    async def read_resource(
        ctx: ServerRequestContext[Any, Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        who = caller_of(ctx)
        try:
            rid, workspace = parse_uri(str(params.uri))
            doc = await anyio.to_thread.run_sync(inbox.get_request, who, rid, workspace)
        except ValueError as e:
            raise MCPError(-32602, str(e)) from None
        except ApiError as e:
            raise MCPError(-32002, f"{e.code}: {e}") from None
        return types.ReadResourceResult(
            contents=[
                types.TextResourceContents(
                    uri=str(params.uri),
                    mime_type="application/json",
                    text=json.dumps(question(doc), ensure_ascii=False),
                )
            ]
        )

    async def listen(
        ctx: ServerRequestContext[Any, Any], params: types.SubscriptionsListenRequestParams
    ) -> types.SubscriptionsListenResult:
        """One stream of hints for this token: the SDK's handler over this token's view."""
        handler = ListenHandler(hub.view(inbox.who(ctx)), max_buffered_events=LISTEN_BACKLOG)
        return await handler(ctx, params)

    def principal(ctx: ServerRequestContext[Any, Any]) -> str:
        return inbox.who(ctx).name  # a form's state answers only for the token it was asked of

    server: Server[Any] = _Server(
        "deltad",
        version=__version__,
        title="deltad inbox",
        instructions="The questions agents are waiting on. list_questions, get_question, then "
        "answer_question; the agent's run resumes with the answer.",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_read_resource=read_resource,
        on_subscriptions_listen=listen,
    )
    # The key lives in this process only: a form asked before the inbox restarted is refused
    # ("Invalid or expired requestState") and asked again.
    security = RequestStateSecurity(
        keys=[os.urandom(32)], ttl=STATE_SECONDS, bind_principal=principal
    )
    server.middleware.append(RequestStateBoundary(security, default_audience="deltad"))
    tasks = Tasks(inbox)
    for binding in tasks.methods():
        server.add_request_handler(binding.method, binding.params_type, binding.handler)
    # tools/call through the extension's interceptor (the SDK's composition, as MCPServer does).
    called = compose_tool_call_handler([tasks], call_tool)
    server.add_request_handler("tools/call", types.CallToolRequestParams, called)
    server.extensions[tasks.identifier] = tasks.settings()  # advertised at server/discover
    return server


class Endpoint:
    """The SDK's session manager for `http.mcp.path`, started on the first request (the
    inbox's server runs no lifespan); the bearer token was checked from the headers before
    (deltad/http/mcp_gate.py)."""

    def __init__(self, inbox: Inbox, config: McpConfig) -> None:
        self.inbox = inbox
        self.hub = Hub(inbox.tokens, config.max_listeners, config.max_sessions)
        self.server = build_server(inbox, self.hub)
        self.manager = StreamableHTTPSessionManager(
            self.server,
            max_request_body_size=limits.ANSWER_BODY_MAX,
            session_idle_timeout=config.session_idle_seconds,
            max_sessions=config.max_sessions,
        )
        self._started: asyncio.Event | None = None
        self._runner: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A request whose bearer token `mcp_gate.admit` has let in (app.LazyMcp)."""
        await self._start()
        await self.manager.handle_request(scope, receive, send)

    async def _start(self) -> None:
        if self._started is None:
            self._started = asyncio.Event()
            self._loop = asyncio.get_running_loop()
            self._runner = asyncio.create_task(self._run(self._started))
        await self._started.wait()

    async def _run(self, started: asyncio.Event) -> None:
        async with self.manager.run():
            started.set()
            await anyio.sleep_forever()

    def changed(self, e: FeedEvent) -> None:
        """A feed event (on the feed's thread): a question came or went, listeners are told
        (on the loop: the SDK's listeners must be called there)."""
        loop = self._loop
        if e.type not in CHANGED or loop is None:
            return
        ws = e.data.get("workspace")
        with contextlib.suppress(RuntimeError):  # the loop has ended: nobody listens
            loop.call_soon_threadsafe(self.hub.changed, str(ws) if ws is not None else None)


def endpoint(
    calls: Caller,
    tokens: TokenStore,
    config: McpConfig,
    metrics: McpMetrics | None = None,
    session_key: bytes | None = None,
    provider: oidc.Provider | None = None,
) -> Endpoint:
    """`session_key`: the inbox's session key, which the task ids' key is derived from (None:
    a key of this process only; task ids then change when it restarts). `provider`: the OIDC
    provider whose JWTs are taken beside the tokens (None: tokens only)."""
    key = mcp_tasks.task_key(session_key) if session_key else os.urandom(32)
    return Endpoint(Inbox(calls, tokens, metrics, key, provider), config)


Subscribe = Callable[[Callable[[FeedEvent], None]], Callable[[], None]]
