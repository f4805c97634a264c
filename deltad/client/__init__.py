"""The `delta` one-shot client: run an agent, pause for a human, resume from disk.

Library use::

    from deltad.client import CallbackInterviewer, RunOptions, run

    def decide(question):            # an InteractionRequest; return text, a Reply, or None
        return "yes"

    code = run(RunOptions(work_dir, agent="agents/release", task="ship 1.4",
                          interviewer=CallbackInterviewer(decide)))
"""

from deltad.engine.interviewers import (
    AutoApproveInterviewer,
    CallbackInterviewer,
    Chain,
    ConsoleInterviewer,
    Interviewer,
    MailboxInterviewer,
    QueueInterviewer,
)
from deltad.errors import ConfigError, DeltaError, LLMError, UsageError
from deltad.protocol.questions import CallDecision, Decision, Reply

from .runner import RunOptions, run

__all__ = [
    "AutoApproveInterviewer",
    "CallDecision",
    "CallbackInterviewer",
    "Chain",
    "ConfigError",
    "ConsoleInterviewer",
    "Decision",
    "DeltaError",
    "Interviewer",
    "LLMError",
    "MailboxInterviewer",
    "QueueInterviewer",
    "Reply",
    "RunOptions",
    "UsageError",
    "run",
]
