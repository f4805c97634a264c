"""The answering package, the root core's question service: one path for every way of seeing
and answering a question. Besides the functions below, the core's side of every API operation
lives here (ops: the table of operations; handlers, paging, history; schemas: the documents),
with the token store, scopes, signed links, idempotency keys and the `http:`/`notify:`
configuration (config). The inbox process imports the light part of it (ops, context,
answer_body, schemas, tokens, feed, ...), never the answering code below.

    pending(ws)            the open question as a person sees it (options, calls, deadline)
    status(ws)             the run's status document (`delta status --json`)
    guidance(ws, id, req)  what to tell a person, with commands to paste
    submit(ws, request_id, body, answered_by=..., channel=...)
                           check the answer as the engine will, write it atomically
                           (a compare-and-set on request_id); raises a SubmitError
    run_outcome(ws, meta)  a finished run's final message, duration and who answered what
    refuse_respondent(ws, request_id, who)
                           why `who` may not answer over HTTP (the question's respondents
                           and those it was handed to)
    delegate(ws, request_id, to, who=..., known=..., note=...)
                           hand a question to a token, group or person (delegation.json)

`delta respond`, `delta status`, the HTTP API and the web page all call these.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .answer_body import (
        AlreadyAnswered,
        AnswerIn,
        AnswerWaiting,
        Expired,
        Misfit,
        NotPending,
        SubmitError,
        TooLarge,
    )
    from .answering import (
        Submitted,
        agent_and_problem,
        agent_of,
        check,
        open_question,
        submit,
    )
    from .bulk import shape, waiting_under
    from .delegation import delegate, refuse_respondent
    from .handover import Delegation
    from .handover import shown as shown_delegations
    from .outcome import run_outcome
    from .respondents import GROUP, Answerer
    from .views import NoRun, Pending, guidance, load_run, pending, status

# Loaded on first use (PEP 562), not by `import deltad.inbox.<module>`: the unprivileged
# inbox process imports this package's light modules (ops, context, answer_body, tokens, feed,
# ...) and must not load the answering code with them (tests/unit/test_inbox_imports.py).
_FROM: dict[str, tuple[str, str]] = {
    **{
        n: ("answer_body", n)
        for n in (
            "AlreadyAnswered",
            "AnswerIn",
            "AnswerWaiting",
            "Expired",
            "Misfit",
            "NotPending",
            "SubmitError",
            "TooLarge",
        )
    },
    **{
        n: ("answering", n)
        for n in ("Submitted", "agent_and_problem", "agent_of", "check", "open_question", "submit")
    },
    "shape": ("bulk", "shape"),
    "waiting_under": ("bulk", "waiting_under"),
    "delegate": ("delegation", "delegate"),
    "refuse_respondent": ("delegation", "refuse_respondent"),
    "Delegation": ("handover", "Delegation"),
    "shown_delegations": ("handover", "shown"),
    "run_outcome": ("outcome", "run_outcome"),
    "GROUP": ("respondents", "GROUP"),
    "Answerer": ("respondents", "Answerer"),
    **{n: ("views", n) for n in ("NoRun", "Pending", "guidance", "load_run", "pending", "status")},
}


def __getattr__(name: str) -> Any:
    if name not in _FROM:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = _FROM[name]
    value = getattr(importlib.import_module(f"{__name__}.{module}"), attr)
    globals()[name] = value  # once: later lookups do not come here
    return value


__all__ = [
    "GROUP",
    "AlreadyAnswered",
    "AnswerIn",
    "AnswerWaiting",
    "Answerer",
    "Delegation",
    "Expired",
    "Misfit",
    "NoRun",
    "NotPending",
    "Pending",
    "SubmitError",
    "Submitted",
    "TooLarge",
    "agent_and_problem",
    "agent_of",
    "check",
    "delegate",
    "guidance",
    "load_run",
    "open_question",
    "pending",
    "refuse_respondent",
    "run_outcome",
    "shape",
    "shown_delegations",
    "status",
    "submit",
    "waiting_under",
]
