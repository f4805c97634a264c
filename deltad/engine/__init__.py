"""The engine: a Think-Act-Observe loop that can pause for a human and resume from disk.

    loop.py         Engine: one turn after another, from the journal's read model
    think.py        a model call → a THOUGHT (cut-offs never taken for answers)
    act.py          a tool call → an ACTION_RESULT (secrets never in argv)
    gate.py         approvals of gated tool calls
    ask_human.py    the built-in question tool
    asking.py       the commit protocol of a human reply (one ingestion order)
    interviewers.py who answers: Mailbox, Console, AutoApprove, Queue, Callback, Chain
    context.py      what the parts share about the run being driven
    hooks.py        Checkpoints: named points for crash tests, injected
    limits.py       what bounds a run: model calls, node visits (from the journal)
    llm.py          the ChatModel seam and the OpenAI-compatible model
    tools.py        running one external command
    secrets.py      the 0600 secret store and redaction
    signals.py      SIGINT/SIGTERM only where it is safe to stop

`deltad.testing.ScriptedModel` drives it in-process without a server.
"""

from .context import RunContext
from .hooks import Checkpoints, EnvCheckpoints, NoCheckpoints, Point
from .loop import Engine, Outcome

__all__ = [
    "Checkpoints",
    "Engine",
    "EnvCheckpoints",
    "NoCheckpoints",
    "Outcome",
    "Point",
    "RunContext",
]
