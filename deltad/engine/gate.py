"""The approval gate: tool calls that need a human decision before they run.

When the model calls gated tools, the turn's ungated calls run first; then one `approval`
request lists every gated call (name, arguments, resolved command) and the decisions are per
call: approve runs it, edit runs it with new arguments (checked against the tool's schema
first), reject tells the model, cancel ends the run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta

from deltad.protocol import ActionStatus, InputType, InteractionRequest, utcnow
from deltad.protocol.calldigest import approved_digest, call_digest
from deltad.protocol.history import Call
from deltad.protocol.kinds import NOT_CONSENT
from deltad.protocol.models import GatedCall
from deltad.protocol.replies import CallDecision, Decision, Reply

from .act import run
from .asking import Asking
from .context import ASK_HUMAN, RunContext, parse_args


@dataclass(frozen=True)
class Canceled:
    """A human canceled the run in an approval decision."""

    by: str


def gated(ctx: RunContext, calls: list[Call]) -> list[Call]:
    """The calls of this turn that wait for a decision (not started before a crash)."""
    return [
        c
        for c in calls
        if c.name != ASK_HUMAN
        and c.name in ctx.agent.tools
        and c.id not in ctx.history.requested
        and ctx.agent.needs_approval(c.name)
    ]


def approval_request(
    run_id: str,
    calls: list[GatedCall],
    timeout: float | None,
    respondents: list[str] | None = None,
    approvals_required: int = 1,
    owner_may_approve: bool = True,
) -> InteractionRequest:
    now = utcnow()
    names = ", ".join(c.tool_name for c in calls)
    return InteractionRequest(
        timestamp=now,
        prompt=f"Approve {len(calls)} tool call(s): {names}?",
        input_type=InputType.APPROVAL,
        run_id=run_id,
        action_id=calls[0].action_id,
        calls=calls,
        timeout_seconds=timeout,
        expires_at=now + timedelta(seconds=timeout) if timeout else None,
        respondents=respondents or [],
        approvals_required=approvals_required,
        owner_may_approve=owner_may_approve,
    )


def _gated_call(ctx: RunContext, call: Call) -> GatedCall:
    try:
        args = json.loads(call.arguments or "{}")
        tool = ctx.agent.tools[call.name]
        command = tool.invocation(tool.check_args(args), ctx.agent.home).display()
    except (ValueError, TypeError):
        args, command = {"_raw": call.arguments}, "(arguments do not fit the tool)"
    return GatedCall(
        action_id=call.id,
        tool_name=call.name,
        arguments=args if isinstance(args, dict) else {"_raw": args},
        resolved_command=command,
    )


def decide(
    ctx: RunContext, asking: Asking, calls: list[Call]
) -> InteractionRequest | Canceled | None:
    """Ask about `calls` (once, durably), then act on the decisions. Returns the request when
    the run must pause for it, Canceled when a human canceled, None when all is done."""
    req = ctx.history.asked(calls[0].id, InputType.APPROVAL)
    if req is None:
        policy = ctx.agent.config.approval
        timeout = policy.timeout_seconds if policy else None
        who = policy.respondents if policy else []
        fresh = approval_request(
            ctx.meta.run_id,
            [_gated_call(ctx, c) for c in calls],
            timeout,
            who,
            policy.approvals_required if policy else 1,
            policy.owner_may_approve if policy else True,
        )
        req = asking.record_asked(fresh)
    reply = asking.take(req)
    if reply is None:
        return req
    decisions = {d.action_id: d for d in reply.decisions}
    if any(d.decision == Decision.CANCEL for d in decisions.values()):
        return Canceled(reply.answered_by or reply.source)
    asked = {c.action_id: c for c in req.calls}
    for call in calls:
        d = decisions.get(call.id)
        if d is not None and (why_not := unbound(ctx, asked, call, d)) is not None:
            ctx.note(why_not, "WARNING")
            ctx.request(call, parse_args(call.arguments), call.name)
            ctx.result(call, ActionStatus.FAILED, why_not)
        elif d is None or d.decision == Decision.REJECT:
            why = d or CallDecision(action_id=call.id, decision=Decision.REJECT)
            ctx.request(call, parse_args(call.arguments), call.name)
            ctx.result(call, ActionStatus.FAILED, refusal(reply, why, req.timeout_seconds))
        elif d.decision == Decision.EDIT:
            note = f"Note: the human edited the arguments to {json.dumps(d.arguments)}.\n"
            run(ctx, call, d.arguments or {}, note)
        else:
            run(ctx, call, parse_args(call.arguments), "")
        ctx.guard.checkpoint()
    return None


def unbound(
    ctx: RunContext, asked: dict[str, GatedCall], call: Call, d: CallDecision
) -> str | None:
    """Why an approving decision does not cover the call about to run (None: it does). The
    digest the answer carries (else the one of the call as asked, in the journal) must be the
    digest of this call, as its arguments now read (after an edit: the edit's). Fail closed: a
    call that changed since it was approved is refused, like a rejection, and the run goes on
    (docs/inbox.md, "Approvals bound to the call")."""
    if d.decision not in (Decision.APPROVE, Decision.EDIT):
        return None
    was = asked.get(call.id)
    want = d.digest or (approved_digest(was, d) if was is not None else None)
    now = _gated_call(ctx, call)
    args = now.arguments if d.decision == Decision.APPROVE else (d.arguments or {})
    have = call_digest(now.tool_name, args)
    if want == have:
        return None
    return (
        f"Refused at resume: call {call.id} ({call.name}) is not the call that was approved "
        f"(approved {want or 'no call by this id'}, about to run {have}); it was not run. "
        "Do not retry it unless the human asks again."
    )


def refusal(reply: Reply, decision: CallDecision, timeout: float | None) -> str:
    """What the model is told about a call that was not approved."""
    if reply.outcome == "timeout":
        return (
            f"Not approved: no decision within {timeout or 0:g} seconds, so the call was "
            f"rejected. {NOT_CONSENT}."
        )
    if reply.outcome == "skipped":
        return "Not approved: nobody answered the approval (skipped), so the call was not run."
    who = f" ({reply.answered_by})" if reply.answered_by else ""
    return (
        f"rejected by the human{who}: {decision.reason or 'no reason given'}. Do not retry "
        "this call unless the human asks for it."
    )
