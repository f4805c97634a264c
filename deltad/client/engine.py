"""The Think-Act-Observe loop, driven from the journal.

The engine keeps no state of its own between steps: every step asks the journal what is
pending (the last THOUGHT's tool calls without a result), so a resumed process and the one that
paused make the same decision. Every tool_call id gets exactly one ACTION_RESULT.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from deltad.protocol import (
    ActionStatus,
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
    exitcodes,
    iso,
    safefs,
    save_metadata,
    transition,
    utcnow,
)
from deltad.protocol.models import GatedCall
from deltad.protocol.questions import AnswerRejected, CallDecision, Decision, Reply

from .agent import Agent
from .asking import (
    ASK_HUMAN,
    ASK_HUMAN_TOOL,
    Asking,
    Paused,
    answer_observation,
    approval_request,
    question_from_args,
    refusal_observation,
)
from .errors import LLMError
from .faults import fault
from .interviewers import Interviewer, settle_mailbox
from .llm import ChatModel, ModelRefused, ModelUnavailable
from .secrets import HANDLE, SecretStore
from .signals import InterruptGuard
from .tools import kill_orphan, run_tool, write_record

log = structlog.get_logger("deltad.client")

_SAFE_ID = re.compile(r"[^A-Za-z0-9_.-]")
EXIT_BY_STATUS = {
    RunStatus.COMPLETED: exitcodes.COMPLETED,
    RunStatus.FAILED: exitcodes.FAILED,
    RunStatus.CANCELED: exitcodes.CANCELED,
    RunStatus.WAITING_FOR_INPUT: exitcodes.WAITING,
}


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
        interviewer: Interviewer,
        guard: InterruptGuard,
        warn: Callable[[str], None],
    ) -> None:
        self.ws, self.paths, self.meta, self.journal = ws, paths, meta, journal
        self.agent, self.model, self.guard, self.warn = agent, model, guard, warn
        self.mailbox = Mailbox(ws)
        self.secrets = SecretStore(paths.secrets)
        self.asking = Asking(journal, interviewer, self.secrets, self.validate_reply)
        self.max_iterations = meta.max_iterations or agent.config.max_iterations

    # -- status ---------------------------------------------------------------------------
    def set_status(self, to: RunStatus, **changes: Any) -> None:
        transition(self.paths.metadata, self.meta, to, workspace=str(self.ws.root), **changes)

    def ensure_running(self) -> None:
        if self.meta.status != RunStatus.RUNNING:
            self.set_status(
                RunStatus.RUNNING, owner=current_owner(), end_time=None, error=None, error_kind=None
            )

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
        except Canceled as c:
            return self._cancel(c.by)
        except ModelUnavailable as e:
            return self._stop_resumable(str(e), e.kind, exitcodes.MODEL_UNAVAILABLE)
        except CutOff as e:
            return self._stop_resumable(str(e), "model_output", exitcodes.FAILED)
        except ModelRefused as e:
            out = self.finish(RunStatus.FAILED, str(e), error_kind=e.kind)
            if e.config_var:  # a configuration problem, like a missing key
                out.exit_code = exitcodes.USAGE
            return out
        except LLMError as e:
            return self.finish(RunStatus.FAILED, str(e), error_kind="model_refused")

    def _stop_resumable(self, reason: str, kind: str, code: int) -> Outcome:
        """The model could not give a usable answer now: nothing recorded is lost, and the run
        waits, INTERRUPTED, for `delta run` (or deltad's model retries, for outages)."""
        self.note(f"stopped: {reason}", "WARN")
        since = self.meta.model_failing_since or utcnow()
        self.set_status(
            RunStatus.INTERRUPTED, error=reason, error_kind=kind, model_failing_since=since
        )
        return Outcome(RunStatus.INTERRUPTED, code, reason)

    def _loop(self) -> Outcome:
        while True:
            self.guard.checkpoint()
            last = self._last(EventType.THOUGHT, EventType.RUN_END)
            if last is not None and last.type == EventType.RUN_END and not self._retried(last):
                # Crashed after RUN_END but before the status write: finish that write.
                return self.finish(
                    RunStatus(last.payload["status"]), last.payload.get("reason", ""), journal=False
                )
            calls, started, answered = self._since_last_thought()  # one scan per turn
            if pending := [c for c in calls if c.id not in answered]:
                gated = self._gated(pending, started)
                for call in pending:
                    if call not in gated:
                        self._dispatch(call, started)
                        self.guard.checkpoint()
                if gated:
                    self._run_gated(gated)
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

    def _retried(self, end: Any) -> bool:
        """A RUN_END followed by a retry marker (delta run --retry) no longer ends the run."""
        return any(
            e.seq > end.seq and e.type == EventType.SYSTEM_MESSAGE and e.payload.get("retry")
            for e in reversed(self.journal.events)
        )

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

    def finish(
        self, status: RunStatus, reason: str, *, journal: bool = True, error_kind: str | None = None
    ) -> Outcome:
        self.ensure_running()
        if journal:
            self.journal.append(EventType.RUN_END, {"status": str(status), "reason": reason})
        failed = status != RunStatus.COMPLETED
        self.set_status(
            status, end_time=utcnow(), error=reason if failed else None, error_kind=error_kind
        )
        return Outcome(status, EXIT_BY_STATUS.get(status, exitcodes.FAILED), reason)

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
        safefs.mkdirs(record)
        atomic_write_json(record / "request.json", self.model.request_body(messages, tools))
        try:
            with self.guard.window():
                reply = self.model.complete(messages, tools)
        except LLMError as e:
            atomic_write_json(record / "error.json", _error_record(e))
            raise
        atomic_write_json(record / "response.json", reply.raw)
        if self.meta.model_failing_since is not None:  # the outage is over
            self.meta.model_failing_since = None
            save_metadata(self.paths.metadata, self.meta)
        if reply.finish_reason in CUT_OFF:
            # Not journaled as a THOUGHT: a resume asks the model again instead of replaying a
            # cut-off message, and a cut-off tool call (truncated arguments) never runs.
            self.journal.append(
                EventType.SYSTEM_MESSAGE,
                {
                    "level": "ERROR",
                    "content": CUT_OFF[reply.finish_reason],
                    "finish_reason": reply.finish_reason,
                    "llm_invocation_ref": ref,
                },
            )
            raise CutOff(CUT_OFF[reply.finish_reason])
        payload = {
            "content": reply.content or "",
            "tool_calls": self._unique_ids(reply.tool_calls),
            "llm_invocation_ref": ref,
            "finish_reason": reply.finish_reason,
        }
        self.journal.append(EventType.THOUGHT, payload)
        return payload

    def _unique_ids(self, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Some local servers reuse ids like "call_0" every turn; results and secret handles
        need ids unique within the run, so rename clashes here, once, before journaling."""
        seen = {
            str(c.get("id"))
            for e in self.journal.events
            if e.type == EventType.THOUGHT
            for c in e.payload.get("tool_calls") or []
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
        safefs.mkdirs(d)
        return d

    def _dispatch(self, call: _Call, requested: set[str]) -> None:
        """`requested`: calls with an ACTION_REQUEST before this turn began (started earlier)."""
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
        return self._run(call, args, "")

    def _run(self, call: _Call, args: Any, note: str) -> None:
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
        if exposed := [n for n in tool.argv_parameters() if HANDLE.search(values.get(n, ""))]:
            if not tool.secrets_in_argv:
                self._request(call, args, shown.display())
                self._result(call, ActionStatus.ERROR, _argv_refusal(tool.name, exposed))
                return None
            self.warn(
                f"tool {tool.name} receives a secret in its command line ({', '.join(exposed)}); "
                "other users can read it while it runs (secrets_in_argv: true)"
            )
            log.warning("secret_in_argv", run_id=self.meta.run_id, tool=tool.name)
        real = tool.invocation(self.secrets.reveal(values), self.agent.home)
        record = self._record_dir(call)
        self._request(call, args, shown.display())
        outcome = run_tool(real, self.ws.root, tool.timeout_seconds, record, self.guard.window)
        redact = self.secrets.redactor()
        outcome.stdout, outcome.stderr = redact(outcome.stdout), redact(outcome.stderr)
        write_record(record, shown.display(), outcome, redact)
        status = (
            ActionStatus.ERROR
            if outcome.error
            else ActionStatus.SUCCESS
            if outcome.exit_code == 0
            else ActionStatus.FAILED
        )
        self._result(call, status, note + redact(outcome.observation()))
        return None

    # -- ask_human ------------------------------------------------------------------------
    def _ask_human(self, call: _Call, *, already_requested: bool) -> None:
        req = self.asking.asked(call.id) or question_from_args(
            call.arguments, self.meta.run_id, call.id
        )
        if not already_requested:
            self._request(call, _safe_args(call.arguments), ASK_HUMAN)
        if isinstance(req, str):
            self.ensure_running()
            self._result(call, ActionStatus.ERROR, req)
            return
        if self.asking.asked(call.id) is None:
            self.asking.record_asked(req)
        reply = self.asking.obtain(req)
        self.ensure_running()
        fault("after_status")
        status, observation = answer_observation(req, reply)
        self._result(call, status, observation)
        fault("after_result")
        record = self._record_dir(call)
        atomic_write_text(record / "command.txt", f"ask_human ({req.request_id})\n")
        atomic_write_text(record / "stdout.log", observation)
        self.asking.settle(req)

    # -- approvals ------------------------------------------------------------------------
    def _gated(self, calls: list[_Call], requested: set[str]) -> list[_Call]:
        return [
            c
            for c in calls
            if c.name != ASK_HUMAN
            and c.name in self.agent.tools
            and c.id not in requested
            and self.agent.needs_approval(c.name)
        ]

    def _gated_call(self, call: _Call) -> GatedCall:
        try:
            args = json.loads(call.arguments or "{}")
            tool = self.agent.tools[call.name]
            command = tool.invocation(tool.check_args(args), self.agent.home).display()
        except (ValueError, TypeError):
            args, command = {"_raw": call.arguments}, "(arguments do not fit the tool)"
        return GatedCall(
            action_id=call.id,
            tool_name=call.name,
            arguments=args if isinstance(args, dict) else {"_raw": args},
            resolved_command=command,
        )

    def _decide(self, gated: list[_Call]) -> tuple[InteractionRequest, Reply]:
        """One approval request for every gated call of the turn; its reply, decided per call."""
        first = gated[0].id
        req = self.asking.asked(first, InputType.APPROVAL)
        if req is None:
            policy = self.agent.config.approval
            req = self.asking.record_asked(
                approval_request(
                    self.meta.run_id,
                    [self._gated_call(c) for c in gated],
                    policy.timeout_seconds if policy else None,
                )
            )
        return req, self.asking.obtain(req)

    def _run_gated(self, gated: list[_Call]) -> None:
        req, reply = self._decide(gated)
        self.ensure_running()
        self.asking.settle(req)
        decisions = {d.action_id: d for d in reply.decisions}
        if any(d.decision == Decision.CANCEL for d in decisions.values()):
            raise Canceled(reply.answered_by or reply.source)
        for call in gated:
            d = decisions.get(call.id)
            if d is None or d.decision == Decision.REJECT:
                why = d or CallDecision(action_id=call.id, decision=Decision.REJECT)
                self._request(call, _safe_args(call.arguments), call.name)
                self._result(
                    call, ActionStatus.FAILED, refusal_observation(reply, why, req.timeout_seconds)
                )
            elif d.decision == Decision.EDIT:
                note = f"Note: the human edited the arguments to {json.dumps(d.arguments)}.\n"
                self._run(call, d.arguments or {}, note)
            else:
                self._run(call, _safe_args(call.arguments), "")
            self.guard.checkpoint()

    def validate_reply(self, req: InteractionRequest, reply: Reply) -> None:
        """Edited arguments must fit the tool's schema before anything runs."""
        for d in reply.decisions:
            if d.decision != Decision.EDIT:
                continue
            call = next((c for c in req.calls if c.action_id == d.action_id), None)
            tool = self.agent.tools.get(call.tool_name) if call else None
            if tool is None:
                raise AnswerRejected(f"edit of {d.action_id!r}: no such gated call")
            try:
                tool.check_args(d.arguments)
            except ValueError as e:
                raise AnswerRejected(f"edit of {d.action_id!r} ({tool.name}): {e}") from None

    def _cancel(self, by: str) -> Outcome:
        for call in self._pending_calls():
            self._result(call, ActionStatus.ERROR, f"Not run: the run was canceled by {by}.")
        return self.finish(RunStatus.CANCELED, f"canceled by {by}")

    def _drop_answered_request(self) -> None:
        """Tidy a mailbox a crash left behind: its question already has a recorded reply."""
        try:
            req = self.mailbox.read_request()
        except (CorruptFile, UnsafeFile):
            return
        if req is None or req.run_id != self.meta.run_id:
            return
        if self.asking.recorded_reply(req.request_id) is None:
            return
        answered = {
            e.payload.get("action_id")
            for e in self.journal.events
            if e.type == EventType.ACTION_RESULT
        }
        ids = [c.action_id for c in req.calls] or [req.action_id]
        if all(a in answered for a in ids) or req.input_type == InputType.APPROVAL:
            reply = self.asking.recorded_reply(req.request_id)
            if reply is not None and reply.source == "mailbox":
                self.mailbox.discard_answer()  # the very answer that was recorded
            else:  # answered elsewhere: a file here is a second answer, kept and reported
                settle_mailbox(self.mailbox, None, self.warn)
            self.mailbox.withdraw()

    def _pause(self, p: Paused) -> Outcome:
        if self.meta.status != RunStatus.WAITING_FOR_INPUT:
            self.ensure_running()
            self.set_status(RunStatus.WAITING_FOR_INPUT)
            self.note(f"paused: waiting for human input (request {p.request.request_id})")
        return Outcome(RunStatus.WAITING_FOR_INPUT, exitcodes.WAITING, p.request.prompt, p.request)


CUT_OFF = {
    "length": (
        "the model's answer was cut off at llm.max_tokens (finish_reason: length); raise "
        "max_tokens in the agent's config and run `delta run` to ask again"
    ),
    "content_filter": (
        "the model's answer was withheld by the provider's content filter (finish_reason: "
        "content_filter); `delta run` asks again"
    ),
}


class CutOff(LLMError):
    """The model stopped before a usable answer (finish_reason length or content_filter)."""


def _error_record(e: LLMError) -> dict[str, Any]:
    return {
        "kind": getattr(e, "kind", "model_error"),
        "status": getattr(e, "status", None),
        "attempts": getattr(e, "attempts", None),
        "message": str(e),
        "at": iso(utcnow()),
    }


class Canceled(Exception):
    def __init__(self, by: str) -> None:
        super().__init__(by)
        self.by = by


def _argv_refusal(tool: str, params: list[str]) -> str:
    return (
        f"Error: not run: tool {tool!r} would put a secret ({', '.join(params)}) in its command "
        "line, which every user of the machine can read. It is not set up to receive secrets "
        "safely (the agent's author can pass it through inject_as: env, stdin or fd, use a "
        "shell: tool, or opt in with secrets_in_argv: true)."
    )


def _safe_args(raw: str) -> Any:
    try:
        return json.loads(raw or "{}")
    except ValueError:
        return raw
