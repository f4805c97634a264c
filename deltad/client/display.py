"""How `delta status` shows a question's context and a finished run's outcome: compact lines,
every text from the run (the model's words, tool output, answers) with its control characters
escaped, so nothing an agent wrote can move the cursor or recolour the terminal."""

from __future__ import annotations

import json
from typing import Any

from deltad.protocol.printable import show

LINE_CHARS = 200  # one tool call, one answer
BLOCK_CHARS = 1200  # a message or a reviewed output, shown over several lines
BLOCK_LINES = 12


def escaped(text: str) -> str:
    """`text` with control characters escaped as everywhere else (`printable.show`); newlines
    and tabs kept, since a message or a reviewed output is shown over several lines."""
    return "\n".join("\t".join(map(show, line.split("\t"))) for line in text.split("\n"))


def one_line(text: str, limit: int = LINE_CHARS) -> str:
    flat = " ".join(escaped(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def block(text: str, indent: str) -> list[str]:
    """A longer text over a few indented lines, cut with a marker."""
    body = escaped(text.strip())
    cut = len(body) > BLOCK_CHARS
    lines = body[:BLOCK_CHARS].splitlines()
    if len(lines) > BLOCK_LINES:
        lines, cut = lines[:BLOCK_LINES], True
    shown = [indent + line.replace("\t", "  ") for line in lines]
    return (
        [*shown, f"{indent}… (cut; the whole text is in request.json or the journal)"]
        if cut
        else shown
    )


def question_lines(request: dict[str, Any]) -> list[str]:
    """What `delta status` adds to a pending question's guidance: who may answer, and its
    context."""
    out = []
    if who := request.get("respondents"):
        names = one_line(", ".join(str(n) for n in who))
        out.append(f"  Who:      {names} (over the inbox; delta respond here is not checked)")
    return out + context_lines(request.get("context"))


def context_lines(context: dict[str, Any] | None) -> list[str]:
    """A pending question's context: task, the agent's last message, the recent tool calls
    (one line each), and a gate's reviewed output."""
    if not context:
        return []
    out = ["  Context:"]
    if context.get("task"):
        out.append(f"    Task:     {one_line(context['task'])}")
    if context.get("last_message"):
        out += ["    Agent said:", *block(context["last_message"], "      ")]
    calls = context.get("tool_calls") or []
    if calls or context.get("tool_calls_omitted"):
        omitted = context.get("tool_calls_omitted") or 0
        more = f" ({omitted} earlier not shown)" if omitted else ""
        out.append(f"    Tool calls since the last question{more}:")
        out += [f"      {tool_call_line(c)}" for c in calls]
    if context.get("reviewed_output"):
        node = one_line(str(context.get("reviewed_node") or "?"), 60)
        out += [
            f"    Output of {node} (under review):",
            *block(context["reviewed_output"], "      "),
        ]
    return out


def tool_call_line(call: dict[str, Any]) -> str:
    raw = call.get("arguments")  # a string when the context had to cut them
    args = one_line(raw if isinstance(raw, str) else json.dumps(raw, ensure_ascii=False), 60)
    head = f"{call.get('tool_name')} {args} -> {call.get('status') or 'no result'}"
    result = call.get("result") or ""
    return one_line(f"{head}: {result}" if result else head)


def outcome_lines(outcome: dict[str, Any] | None) -> list[str]:
    """A finished run: its final message, how long it took, who answered what."""
    if not outcome:
        return []
    out = []
    if outcome.get("duration_seconds") is not None:
        out.append(f"Duration:   {duration(outcome['duration_seconds'])}")
    # A run that failed or was canceled already shows its reason (`Reason:`).
    if outcome.get("final_message") and outcome.get("status") == "COMPLETED":
        out += ["Final message:", *block(outcome["final_message"], "  ")]
    answers = outcome.get("answers") or []
    if answers:
        total = outcome.get("answers_total", len(answers))
        more = f" (the last {len(answers)} of {total})" if total > len(answers) else ""
        out.append(f"Answers{more}:")
        for a in answers:
            out.append(f"  {answer_line(a)}")
            out += ["  " + line for line in follow_up_lines(a.get("follow_up"))]
    return out


def follow_up_lines(doc: dict[str, Any] | None) -> list[str]:
    """A question's reminders, escalation and SLA (protocol/followup.py), as `delta status`
    shows them: "reminded 2 times, last at ...", "escalated to X at ...", "due at ..."."""
    if not doc:
        return []
    out = []
    reminders = doc.get("reminders") or []
    if reminders:
        times = "once" if len(reminders) == 1 else f"{len(reminders)} times"
        via = _via(doc.get("reminders_via"))
        out.append(f"  Reminded: {times}, last at {show(str(reminders[-1]))}{via}")
    if esc := doc.get("escalated"):
        to = ", ".join(show(str(t)) for t in esc.get("to") or [])
        out.append(f"  Escalated: to {to} at {show(str(esc.get('at')))}{_via(esc.get('via'))}")
    if doc.get("sla_due_at"):
        late = " (SLA; overdue)" if doc.get("overdue_at") else " (SLA)"
        out.append(f"  Due:      {show(str(doc['sla_due_at']))}{late}")
    return out


def _via(via: object) -> str:
    """What carried a reminder or an escalation: "" when not recorded (an older record)."""
    if not isinstance(via, list):
        return ""
    if not via:
        return " (nobody was told: no channel is configured)"
    return f" (by {', '.join(show(str(v)) for v in via)})"


def answer_line(a: dict[str, Any]) -> str:
    who = a.get("answered_by") or a.get("source") or "?"
    via = a.get("channel") or a.get("source")
    where = f" ({via})" if via and via != who else ""
    asked = one_line(str(a.get("prompt") or a.get("node_id") or "?"), 60)
    return one_line(f"{a.get('at') or '-'}  {who}{where}: {asked} -> {a.get('answer')}")


def duration(seconds: float) -> str:
    s = round(seconds)
    if s < 60:
        return f"{seconds:.1f} s"
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h} h {m:02d} min {s:02d} s" if h else f"{m} min {s:02d} s"


def approvals_line(approvals: dict[str, Any] | None) -> str | None:
    """Four eyes: "  Approvals: 1 of 2 (alice); the owner may not approve", or None."""
    if not approvals:
        return None
    given = approvals.get("given") or []
    who = ", ".join(f"{show(v['by'])}" for v in given) or "none yet"
    line = f"  Approvals: {len(given)} of {approvals['required']} ({who})"
    if not approvals.get("owner_may_approve", True):
        line += "; the workspace's owner may not approve"
    return line
