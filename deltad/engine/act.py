"""Acting: one tool call, from the model's arguments to a journaled ACTION_RESULT.

Every tool_call id gets exactly one result. A call that started before a crash (an
ACTION_REQUEST without a result) is not run again: it gets an ERROR result saying so, and its
leftover process group is stopped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import structlog

from deltad.protocol import ActionStatus
from deltad.protocol.history import Call

from .context import ASK_HUMAN, RunContext
from .sandbox import plan
from .secrets import HANDLE
from .tools import kill_orphan, run_tool, write_record

log = structlog.get_logger("deltad.client")


def act(ctx: RunContext, call: Call) -> None:
    """Run a (non-ask_human, not gated) call of the current turn."""
    ctx.ensure_running()
    if call.id in ctx.history.requested:
        killed = kill_orphan(ctx.record_dir(call))
        ctx.result(
            call,
            ActionStatus.ERROR,
            "Error: this action was interrupted before it finished and was not re-run"
            + (" (its leftover process was stopped)" if killed else "")
            + ". Check the workspace state before deciding whether to retry.",
        )
        return
    try:
        args = json.loads(call.arguments or "{}")
    except ValueError as e:
        ctx.request(call, call.arguments, call.name)
        ctx.result(call, ActionStatus.ERROR, f"Error: arguments are not valid JSON: {e}")
        return
    run(ctx, call, args, "")


def run(ctx: RunContext, call: Call, args: Any, note: str) -> None:
    """Check the arguments against the tool, run it, record and journal what it did."""
    tool = ctx.agent.tools.get(call.name)
    if tool is None:
        ctx.request(call, args, call.name)
        known = ", ".join([*ctx.agent.tools, ASK_HUMAN])
        ctx.result(
            call, ActionStatus.ERROR, f"Error: no tool named {call.name!r}. Available: {known}"
        )
        return
    try:
        values = tool.check_args(args)
    except ValueError as e:
        ctx.request(call, args, call.name)
        ctx.result(call, ActionStatus.ERROR, f"Error: {e}")
        return
    shown = tool.invocation(values, ctx.agent.home)
    if exposed := [n for n in tool.argv_parameters() if HANDLE.search(values.get(n, ""))]:
        if not tool.secrets_in_argv:
            ctx.request(call, args, shown.display())
            ctx.result(call, ActionStatus.ERROR, _argv_refusal(tool.name, exposed))
            return
        ctx.warn(
            f"tool {tool.name} receives a secret in its command line ({', '.join(exposed)}); "
            "other users can read it while it runs (secrets_in_argv: true)"
        )
        log.warning("secret_in_argv", run_id=ctx.meta.run_id, tool=tool.name)
    real = tool.invocation(ctx.secrets.reveal(values), ctx.agent.home)
    record = ctx.record_dir(call)
    ctx.request(call, args, shown.display())
    sandbox = plan(ctx.agent, ctx.ws.root, tool.network, protect=(Path(ctx.meta.agent_ref),))
    outcome = run_tool(
        real, ctx.ws.root, tool.timeout_seconds, record, ctx.guard.window, sandbox=sandbox
    )
    redact = ctx.secrets.redactor()
    outcome.stdout, outcome.stderr = redact(outcome.stdout), redact(outcome.stderr)
    write_record(record, shown.display(), outcome, redact)
    status = (
        ActionStatus.ERROR
        if outcome.error
        else ActionStatus.SUCCESS
        if outcome.exit_code == 0
        else ActionStatus.FAILED
    )
    ctx.result(call, status, note + redact(outcome.observation()))


def _argv_refusal(tool: str, params: list[str]) -> str:
    return (
        f"Error: not run: tool {tool!r} would put a secret ({', '.join(params)}) in its command "
        "line, which every user of the machine can read. It is not set up to receive secrets "
        "safely (the agent's author can pass it through inject_as: env, stdin or fd, use a "
        "shell: tool, or opt in with secrets_in_argv: true)."
    )
