"""The Think-Act-Observe loop, driven from the journal.

The engine keeps no state of its own between steps: every step asks the journal what is
pending (the last THOUGHT's tool calls without a result), so a resumed process and the one that
paused make the same decision. Every tool_call id gets exactly one ACTION_RESULT.
"""

from __future__ import annotations

import json
import re
import shlex
import signal
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Any

from deltad.protocol import (
    ActionStatus,
    AnswerState,
    CorruptFile,
    EventType,
    InputType,
    InteractionRequest,
    Journal,
    Mailbox,
    RunMetadata,
    RunPaths,
    RunStatus,
    UnsafeFile,
    Workspace,
    atomic_write_json,
    atomic_write_text,
    current_owner,
    save_metadata,
    transition,
    utcnow,
)

from .agent import Agent
from .console import Console, normalize_confirmation
from .errors import LLMError
from .faults import fault
from .llm import ChatModel
from .secrets import SecretStore, handle
from .tools import kill_orphan, run_tool, write_record

ASK_HUMAN = "ask_human"
ASK_HUMAN_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": ASK_HUMAN,
        "description": (
            "Ask the human a question and wait for the answer: missing information, a "
            "confirmation before a risky step, or a secret. For secrets set sensitive=true; "
            "you then get a handle like ${secret:ID} to pass in tool arguments, never the value."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "prompt": {"type": "string", "description": "The question shown to the human."},
                "input_type": {
                    "type": "string",
                    "enum": [t.value for t in InputType],
                    "description": "text (default), password (hidden), confirmation (yes/no).",
                },
                "sensitive": {
                    "type": "boolean",
                    "description": "True when the answer must never be shown or logged.",
                },
            },
            "required": ["prompt"],
        },
    },
}
_SAFE_ID = re.compile(r"[^A-Za-z0-9_.-]")


class Interrupted(BaseException):
    """SIGINT/SIGTERM. A BaseException so that no `except Exception` swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Paused(Exception):
    def __init__(self, request: InteractionRequest, note: str = "") -> None:
        super().__init__(request.prompt)
        self.request = request
        self.note = note


class InterruptGuard:
    """Signals interrupt only inside `window()` (a tool, the model call, a terminal read);
    elsewhere they are held until the next `checkpoint()`, so no state write is torn."""

    def __init__(self) -> None:
        self.pending: int | None = None
        self._open = False

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.pending = signum
        if self._open:
            self._open = False
            raise Interrupted(signum)

    def checkpoint(self) -> None:
        if self.pending is not None:
            raise Interrupted(self.pending)

    @contextmanager
    def window(self) -> Iterator[None]:
        self.checkpoint()
        self._open = True
        try:
            yield
        finally:
            self._open = False


@dataclass
class Outcome:
    status: RunStatus
    exit_code: int
    message: str = ""
    request: InteractionRequest | None = None


@dataclass
class _Call:
    id: str
    name: str
    arguments: str

    @classmethod
    def of(cls, raw: dict[str, Any]) -> _Call:
        fn = raw.get("function") or {}
        args = fn.get("arguments")
        return cls(raw["id"], str(fn.get("name", "")), args if isinstance(args, str) else "{}")


class Engine:
    def __init__(
        self,
        ws: Workspace,
        paths: RunPaths,
        meta: RunMetadata,
        journal: Journal,
        agent: Agent,
        model: ChatModel,
        *,
        console: Console | None,
        guard: InterruptGuard,
        warn: Callable[[str], None],
    ) -> None:
        self.ws, self.paths, self.meta, self.journal = ws, paths, meta, journal
        self.agent, self.model, self.console, self.guard, self.warn = (
            agent,
            model,
            console,
            guard,
            warn,
        )
        self.mailbox = Mailbox(ws)
        self.secrets = SecretStore(paths.secrets)
        self.max_iterations = meta.max_iterations or agent.config.max_iterations

    # -- status ---------------------------------------------------------------------------
    def set_status(self, to: RunStatus, **changes: Any) -> None:
        transition(self.paths.metadata, self.meta, to, workspace=str(self.ws.root), **changes)

    def ensure_running(self) -> None:
        if self.meta.status != RunStatus.RUNNING:
            self.set_status(RunStatus.RUNNING, owner=current_owner(), end_time=None)

    def note(self, content: str, level: str = "INFO") -> None:
        self.journal.append(EventType.SYSTEM_MESSAGE, {"level": level, "content": content})

    # -- the loop -------------------------------------------------------------------------
    def drive(self) -> Outcome:
        events = self.journal.events
        if not any(e.type == EventType.RUN_START for e in events):
            self.journal.append(
                EventType.RUN_START,
                {
                    "run_id": self.meta.run_id,
                    "task": self.meta.task,
                    "agent_ref": self.meta.agent_ref,
                },
            )
        self._drop_answered_request()
        try:
            return self._loop()
        except Paused as p:
            return self._pause(p)
        except LLMError as e:
            return self.finish(RunStatus.FAILED, str(e))

    def _loop(self) -> Outcome:
        while True:
            self.guard.checkpoint()
            last = self._last(EventType.THOUGHT, EventType.RUN_END)
            if last is not None and last.type == EventType.RUN_END:
                # Crashed after RUN_END but before the status write: finish that write.
                return self.finish(
                    RunStatus(last.payload["status"]), last.payload.get("reason", ""), journal=False
                )
            if pending := self._pending_calls():
                for call in pending:
                    self._dispatch(call)
                    self.guard.checkpoint()
                self._count_iteration()
                continue
            if last is not None and not last.payload.get("tool_calls"):
                return self.finish(RunStatus.COMPLETED, last.payload.get("content") or "")
            if self.meta.iterations_completed >= self.max_iterations:
                return self.finish(
                    RunStatus.FAILED, f"stopped after max_iterations ({self.max_iterations})"
                )
            if not self._think().get("tool_calls"):
                self._count_iteration()

    def _last(self, *types: EventType) -> Any:
        return next((e for e in reversed(self.journal.events) if e.type in types), None)

    def _since_last_thought(self) -> tuple[list[_Call], set[str], set[str]]:
        calls: list[_Call] = []
        requested: set[str] = set()
        answered: set[str] = set()
        for e in self.journal.events:
            if e.type == EventType.THOUGHT:
                calls = [_Call.of(c) for c in e.payload.get("tool_calls") or []]
                requested, answered = set(), set()
            elif e.type == EventType.ACTION_REQUEST:
                requested.add(e.payload["action_id"])
            elif e.type == EventType.ACTION_RESULT:
                answered.add(e.payload["action_id"])
        return calls, requested, answered

    def _pending_calls(self) -> list[_Call]:
        calls, _, answered = self._since_last_thought()
        return [c for c in calls if c.id not in answered]

    def _count_iteration(self) -> None:
        self.meta.iterations_completed += 1
        save_metadata(self.paths.metadata, self.meta)

    def finish(self, status: RunStatus, reason: str, *, journal: bool = True) -> Outcome:
        self.ensure_running()
        if journal:
            self.journal.append(EventType.RUN_END, {"status": str(status), "reason": reason})
        failed = status != RunStatus.COMPLETED
        self.set_status(status, end_time=utcnow(), error=reason if failed else None)
        return Outcome(status, 0 if not failed else 1, reason)

    # -- think ----------------------------------------------------------------------------
    def messages(self) -> list[dict[str, Any]]:
        msgs: list[dict[str, Any]] = [
            {"role": "system", "content": self.agent.system_prompt},
            {"role": "user", "content": self.meta.task},
        ]
        for e in self.journal.events:
            if e.type == EventType.THOUGHT:
                m: dict[str, Any] = {"role": "assistant", "content": e.payload.get("content")}
                if e.payload.get("tool_calls"):
                    m["tool_calls"] = e.payload["tool_calls"]
                msgs.append(m)
            elif e.type == EventType.ACTION_RESULT:
                msgs.append(
                    {
                        "role": "tool",
                        "tool_call_id": e.payload["action_id"],
                        "content": e.payload["observation_content"],
                    }
                )
        return msgs

    def _think(self) -> dict[str, Any]:
        self.ensure_running()
        messages = self.messages()
        tools = [t.schema() for t in self.agent.tools.values()] + [ASK_HUMAN_TOOL]
        ref = f"{self.journal.next_seq:05d}_{uuid.uuid4().hex[:8]}"
        record = self.paths.invocations / ref
        record.mkdir(parents=True, exist_ok=True)
        atomic_write_json(record / "request.json", self.model.request_body(messages, tools))
        with self.guard.window():
            reply = self.model.complete(messages, tools)
        atomic_write_json(record / "response.json", reply.raw)
        payload = {
            "content": reply.content or "",
            "tool_calls": self._unique_ids(reply.tool_calls),
            "llm_invocation_ref": ref,
        }
        self.journal.append(EventType.THOUGHT, payload)
        return payload

    def _unique_ids(self, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Some local servers reuse ids like "call_0" every turn; results and secret handles
        need ids unique within the run, so rename clashes here, once, before journaling."""
        seen = {
            e.payload.get("action_id")
            for e in self.journal.events
            if e.type == EventType.ACTION_REQUEST
        }
        out = []
        for i, c in enumerate(calls):
            cid = str(c.get("id") or "")
            if not cid or cid in seen or len(cid) > 100:
                cid = f"call_{self.journal.next_seq}_{i}"
            seen.add(cid)
            fn = c.get("function") or {}
            out.append(
                {
                    "id": cid,
                    "type": "function",
                    "function": {
                        "name": fn.get("name", ""),
                        "arguments": fn.get("arguments") or "{}",
                    },
                }
            )
        return out

    # -- act ------------------------------------------------------------------------------
    def _result(self, call: _Call, status: ActionStatus, observation: str) -> None:
        self.journal.append(
            EventType.ACTION_RESULT,
            {
                "action_id": call.id,
                "status": str(status),
                "observation_content": observation,
                "execution_ref": call.id,
            },
        )

    def _request(self, call: _Call, args: Any, command: str) -> None:
        self.journal.append(
            EventType.ACTION_REQUEST,
            {
                "action_id": call.id,
                "tool_name": call.name,
                "tool_args": args,
                "resolved_command": command,
            },
        )

    def _record_dir(self, call: _Call) -> Any:
        d = self.paths.tool_executions / _SAFE_ID.sub("_", call.id)
        d.mkdir(parents=True, exist_ok=True)
        return d

    def _dispatch(self, call: _Call) -> None:
        _, requested, _ = self._since_last_thought()
        if call.name == ASK_HUMAN:
            return self._ask_human(call, already_requested=call.id in requested)
        self.ensure_running()
        if call.id in requested:
            killed = kill_orphan(self._record_dir(call))
            self._result(
                call,
                ActionStatus.ERROR,
                "Error: this action was interrupted before it finished and was not "
                "re-run"
                + (" (its leftover process was stopped)" if killed else "")
                + ". Check the workspace state before deciding whether to retry.",
            )
            return None
        try:
            args = json.loads(call.arguments or "{}")
        except ValueError as e:
            self._request(call, call.arguments, call.name)
            self._result(call, ActionStatus.ERROR, f"Error: arguments are not valid JSON: {e}")
            return None
        tool = self.agent.tools.get(call.name)
        if tool is None:
            self._request(call, args, call.name)
            known = ", ".join([*self.agent.tools, ASK_HUMAN])
            self._result(
                call, ActionStatus.ERROR, f"Error: no tool named {call.name!r}. Available: {known}"
            )
            return None
        try:
            values = tool.check_args(args)
        except ValueError as e:
            self._request(call, args, call.name)
            self._result(call, ActionStatus.ERROR, f"Error: {e}")
            return None
        shown = tool.invocation(values, self.agent.home)
        real = tool.invocation(self.secrets.reveal(values), self.agent.home)
        record = self._record_dir(call)
        self._request(call, args, shlex.join(shown.argv))
        outcome = run_tool(real, self.ws.root, tool.timeout_seconds, record, self.guard.window)
        redact = self.secrets.redactor()
        outcome.stdout, outcome.stderr = redact(outcome.stdout), redact(outcome.stderr)
        write_record(record, shlex.join(shown.argv), outcome, redact)
        status = (
            ActionStatus.ERROR
            if outcome.error
            else ActionStatus.SUCCESS
            if outcome.exit_code == 0
            else ActionStatus.FAILED
        )
        self._result(call, status, redact(outcome.observation()))
        return None

    # -- ask_human ------------------------------------------------------------------------
    def _question(self, call: _Call) -> InteractionRequest | str:
        try:
            args = json.loads(call.arguments or "{}")
        except ValueError as e:
            return f"Error: arguments are not valid JSON: {e}"
        if (
            not isinstance(args, dict)
            or not isinstance(args.get("prompt"), str)
            or not args["prompt"].strip()
        ):
            return "Error: ask_human needs a non-empty string 'prompt'"
        kind = args.get("input_type") or "text"
        if kind not in {t.value for t in InputType}:
            return f"Error: input_type must be one of {', '.join(t.value for t in InputType)}"
        return InteractionRequest(
            prompt=args["prompt"],
            input_type=InputType(kind),
            sensitive=args.get("sensitive") in (True, "true"),
            run_id=self.meta.run_id,
            action_id=call.id,
        )

    def _ask_human(self, call: _Call, *, already_requested: bool) -> None:
        question = self._question(call)
        if not already_requested:
            self._request(call, _safe_args(call.arguments), ASK_HUMAN)
        if isinstance(question, str):
            self.ensure_running()
            self._result(call, ActionStatus.ERROR, question)
            return
        posted = self._posted_request(call)
        request = posted or question
        answer = self._mailbox_answer(posted) if posted else None
        if answer is None and self.console is not None:
            self.ensure_running()
            with self.guard.window():
                answer = self.console.ask(request)
        if answer is None:
            if posted is None:
                self.ensure_running()
                self.mailbox.post(request)
            raise Paused(request)
        self._ingest(call, request, answer)

    def _posted_request(self, call: _Call) -> InteractionRequest | None:
        try:
            req = self.mailbox.read_request()
        except (CorruptFile, UnsafeFile) as e:
            where = self.mailbox.set_aside_request("corrupt")
            self.warn(f"{e}; set aside as {where.name} and asking again")
            return None
        if req and req.run_id == self.meta.run_id and req.action_id == call.id:
            return req
        return None

    def _mailbox_answer(self, req: InteractionRequest) -> str | None:
        answer = self.mailbox.read_answer(req, secret=req.is_secret)
        if answer.state in (AnswerState.STALE, AnswerState.REFUSED):
            self.warn(f"response not taken: {answer.reason}")
            return None
        if answer.state != AnswerState.READY:
            return None
        if req.input_type == InputType.CONFIRMATION:
            yes_no = normalize_confirmation(answer.text)
            if yes_no is None:
                self.warn(
                    f"response not taken: {self.ws.response_file} must say yes or no "
                    f"to this confirmation"
                )
                return None
            return yes_no
        return answer.text

    def _ingest(self, call: _Call, req: InteractionRequest, answer: str) -> None:
        """The exactly-once hand-off. Order matters: secret, journal, status, then the files.
        A crash before the journal write repeats the whole step; after it, the journal says
        the action is answered and the next resume only tidies the mailbox."""
        if req.is_secret:
            self.secrets.put(call.id, answer)
            fault("after_secret")
            observation = (
                f"The human answered. The answer is sensitive and is kept as {handle(call.id)}: "
                "pass that handle in tool arguments where the value is needed; it is "
                "substituted when the tool runs."
            )
        else:
            observation = answer
        fault("before_journal")
        self._result(call, ActionStatus.SUCCESS, observation)
        fault("after_journal")
        self.ensure_running()
        fault("after_status")
        record = self._record_dir(call)
        atomic_write_text(record / "command.txt", f"ask_human ({req.request_id})\n")
        atomic_write_text(record / "stdout.log", observation)
        self.mailbox.discard_answer()
        fault("after_discard_answer")
        self.mailbox.withdraw()

    def _drop_answered_request(self) -> None:
        """Tidy a mailbox a crash left behind: its action already has a journaled result."""
        try:
            req = self.mailbox.read_request()
        except (CorruptFile, UnsafeFile):
            return
        if req is None or req.run_id != self.meta.run_id:
            return
        answered = {
            e.payload.get("action_id")
            for e in self.journal.events
            if e.type == EventType.ACTION_RESULT
        }
        if req.action_id in answered:
            self.mailbox.discard_answer()
            self.mailbox.withdraw()

    def _pause(self, p: Paused) -> Outcome:
        if self.meta.status != RunStatus.WAITING_FOR_INPUT:
            self.ensure_running()
            self.set_status(RunStatus.WAITING_FOR_INPUT)
            self.note(f"paused: waiting for human input (request {p.request.request_id})")
        return Outcome(RunStatus.WAITING_FOR_INPUT, 101, p.request.prompt, p.request)


def _safe_args(raw: str) -> Any:
    try:
        return json.loads(raw or "{}")
    except ValueError:
        return raw
