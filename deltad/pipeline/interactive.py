"""Interactive codergen nodes (`agent.mode="interactive"`): the words that end the conversation."""

from __future__ import annotations

from .outcome import Status

ENDINGS = {"/done": Status.SUCCESS, "/approve": Status.SUCCESS, "/reject": Status.FAIL}
AUTO_APPROVE_REPLY = "/approve"  # under --auto-approve: end after the agent's first message


def ending(reply: str) -> Status | None:
    """The node's status when the human's reply ends it; None sends the reply to the agent."""
    return ENDINGS.get(reply.strip().lower())
