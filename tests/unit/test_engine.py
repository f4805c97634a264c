"""The engine in-process: a ScriptedModel instead of a server, interviewers instead of files,
a Checkpoints recorder instead of killing processes. Real workspaces on a temp dir."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from deltad.agent import load_agent
from deltad.engine import Engine, Point, RunContext
from deltad.engine.interviewers import (
    CallbackInterviewer,
    Chain,
    Interviewer,
    MailboxInterviewer,
    QueueInterviewer,
)
from deltad.protocol import (
    Mailbox,
    RunStatus,
)
from deltad.protocol.replies import CallDecision, Decision, Reply
from deltad.testing import ScriptedModel
from tests.unit.helpers import resumed, running_run

from ..conftest import write_agent

GATED = """
  - name: deploy
    exec: "echo deploying ${env}"
    approval: required
    parameters: [{name: env}]
  - name: echo
    exec: "echo ${text}"
"""


class Recorder:
    def __init__(self) -> None:
        self.points: list[Point] = []

    def reached(self, point: Point) -> None:
        self.points.append(point)


def _ctx(tmp_path: Path, model: ScriptedModel, hooks: Recorder | None = None) -> RunContext:
    ctx = running_run(tmp_path, load_agent(write_agent(tmp_path, GATED)), model, "t")
    if hooks is not None:
        ctx.hooks = hooks
    return ctx


def _drive(ctx: RunContext, interviewer: Interviewer) -> Any:
    return Engine(ctx, interviewer).drive()


def test_completes_on_a_final_message(tmp_path: Path) -> None:
    model = ScriptedModel().reply("all done")
    out = _drive(_ctx(tmp_path, model), QueueInterviewer([]))
    assert out.status == RunStatus.COMPLETED and out.message == "all done"


def test_a_question_answered_in_process_goes_back_to_the_model(tmp_path: Path) -> None:
    model = ScriptedModel().call("ask_human", {"prompt": "Name?"}, id="q").reply("hi")
    out = _drive(_ctx(tmp_path, model), CallbackInterviewer(lambda req: "Ada"))
    assert out.status == RunStatus.COMPLETED
    tool_msgs = [m for m in model.calls[-1] if m["role"] == "tool"]
    assert tool_msgs == [{"role": "tool", "tool_call_id": "q", "content": "Ada"}]


@pytest.mark.spawns  # a tool node runs its command
def test_one_ingestion_order_for_questions_and_approvals(tmp_path: Path) -> None:
    model = ScriptedModel().call("ask_human", {"prompt": "Env?"}, id="q")
    model.call("deploy", {"env": "beta"}, id="d").reply("done")
    hooks = Recorder()
    ctx = _ctx(tmp_path, model, hooks)
    mailbox = Mailbox(ctx.ws)
    post = MailboxInterviewer(mailbox, print, hooks=hooks)
    assert _drive(ctx, Chain(post)).status == RunStatus.WAITING_FOR_INPUT
    mailbox.write_answer("beta")
    ctx = resumed(ctx)
    assert _drive(ctx, Chain(MailboxInterviewer(mailbox, print, hooks=hooks))).status == (
        RunStatus.WAITING_FOR_INPUT
    )
    req = mailbox.read_request()
    assert req is not None and req.input_type == "approval"
    mailbox.write_answer("approve")
    ctx = resumed(ctx)
    out = _drive(ctx, Chain(MailboxInterviewer(mailbox, print, hooks=hooks)))
    assert out.status == RunStatus.COMPLETED
    commit = [Point.BEFORE_JOURNAL, Point.AFTER_JOURNAL, Point.AFTER_STATUS]
    tidy = [Point.AFTER_DISCARD_ANSWER]
    seq = [p for p in hooks.points if p != Point.AFTER_POST]
    # The question: commit, tidy, its result. The approval: commit, tidy (then the tool runs).
    assert seq == [*commit, *tidy, Point.AFTER_RESULT, *commit, *tidy]


def test_a_reply_is_recorded_once_and_reused_after_a_crash(tmp_path: Path) -> None:
    model = ScriptedModel().call("ask_human", {"prompt": "Name?"}, id="q").reply("hi")
    ctx = _ctx(tmp_path, model)
    asked: list[str] = []

    def once(req: Any) -> str:
        asked.append(req.request_id)
        return "Ada"

    class Crash(Exception):
        pass

    class CrashAfterCommit:
        def reached(self, point: Point) -> None:
            if point == Point.AFTER_JOURNAL:
                raise Crash

    ctx.hooks = CrashAfterCommit()
    with pytest.raises(Crash):
        _drive(ctx, CallbackInterviewer(once))
    ctx = resumed(ctx)
    ctx.hooks = Recorder()
    assert _drive(ctx, CallbackInterviewer(once)).status == RunStatus.COMPLETED
    assert len(asked) == 1  # the second process used the journaled reply


@pytest.mark.spawns  # a tool node runs its command
def test_an_edit_that_does_not_fit_the_tool_is_refused_before_anything_runs(
    tmp_path: Path,
) -> None:
    model = ScriptedModel().call("deploy", {"env": "beta"}, id="d").reply("done")
    replies = iter(
        [
            Reply(decisions=[CallDecision(action_id="d", decision=Decision.EDIT, arguments={})]),
            Reply(decisions=[CallDecision(action_id="d", decision=Decision.APPROVE)]),
        ]
    )
    refused: list[str] = []

    class Once(CallbackInterviewer):
        def reject(self, req: Any, reason: str) -> bool:
            refused.append(reason)
            return True  # ask again

    out = _drive(_ctx(tmp_path, model), Once(lambda req: next(replies)))
    assert out.status == RunStatus.COMPLETED
    assert refused and "missing required argument: env" in refused[0]


def test_cancel_ends_the_run_and_leaves_no_call_without_a_result(tmp_path: Path) -> None:
    model = ScriptedModel().call("deploy", {"env": "prod"}, id="d")
    cancel = Reply(decisions=[CallDecision(action_id="d", decision=Decision.CANCEL)])
    ctx = _ctx(tmp_path, model)
    out = _drive(ctx, CallbackInterviewer(lambda req: cancel))
    assert out.status == RunStatus.CANCELED and out.exit_code == 4
    assert ctx.history.pending_calls() == []


def test_model_outcomes(tmp_path: Path) -> None:
    out = _drive(_ctx(tmp_path / "a", ScriptedModel().unavailable()), QueueInterviewer([]))
    assert (out.status, out.exit_code) == (RunStatus.INTERRUPTED, 69)
    out = _drive(_ctx(tmp_path / "b", ScriptedModel().refuse()), QueueInterviewer([]))
    assert (out.status, out.exit_code) == (RunStatus.FAILED, 1)
    ctx = _ctx(tmp_path / "c", ScriptedModel().cut_off("length", "The ans"))
    out = _drive(ctx, QueueInterviewer([]))
    assert out.status == RunStatus.INTERRUPTED and ctx.meta.error_kind == "model_output"
    assert ctx.history.last_thought is None


def test_an_exhausted_queue_is_skipped_never_guessed(tmp_path: Path) -> None:
    model = ScriptedModel().call("ask_human", {"prompt": "Name?"}, id="q").reply("ok")
    ctx = _ctx(tmp_path, model)
    assert _drive(ctx, QueueInterviewer([])).status == RunStatus.COMPLETED
    [result] = [m for m in model.calls[-1] if m["role"] == "tool"]
    assert "skipped" in result["content"]
