"""The one channel model: each channel (email, slack) is a plug-in of this small interface.

A channel is told of questions and of their end by the hub (deltad/outbound/hub.py), which
listens to the daemon's feed on a thread of its own, and takes answers in on threads of its
own. Three duties, one method each:

    send(question)     a question is open: queue it to the people allowed to answer it.
                       Called on the hub's thread; must not touch the network: put what goes
                       out in the channel's own durable outbox (deltad/outbound/courier.py)
                       and return. Whatever sends from that outbox is the channel's thread,
                       so one channel's outage never delays another.
    withdraw(closed)   the question was answered (on any channel) or expired: tell the people
                       it went to, and refuse what they send for it from now on. Same rules.
    start() / stop()   the channel's threads: its courier, and whatever takes answers in (a
                       Maildir poller, a socket). stop() returns within a few seconds.

An answer is never written by a channel: it calls `ctx.answer(workspace, request_id, body,
answered_by=..., channel=...)`, which is `deltad.inbox.submit` (the same function the HTTP API
delivers through), so it is checked like every other answer and is a compare-and-set on the
request id: the first answer wins on every channel. A channel refuses in its own words
(`SubmitError.code` says which kind) and changes nothing.

Clocks: `time.time()` (wall) for expiries that are written to disk; nothing here waits on the
daemon's loop, and the loop never waits on a channel.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol

from prometheus_client import Counter

from deltad.inbox import AnswerIn, Submitted, open_question
from deltad.outbound.outbox import Delivery
from deltad.protocol import InteractionRequest, Workspace


class Answer(Protocol):
    """The answering path as a channel sees it: `deltad.inbox.submit`, or (in a process that
    holds no privileges) a call that reaches it. Raises `deltad.inbox.SubmitError`; None when
    the answer was a vote on a question needing several (four eyes) that still waits.
    `origin`: where the answer came from on the channel (a mail's Message-ID, a Slack user and
    message), kept in a vote's receipt."""

    def __call__(
        self,
        ws: Path,
        request_id: str | None,
        body: AnswerIn,
        *,
        answered_by: str | None = None,
        channel: str | None = None,
        voter: str | None = None,
        origin: dict[str, str] | None = None,
    ) -> Submitted | None: ...


@dataclass(frozen=True)
class Question:
    """An open question as a channel needs it."""

    workspace: Path
    request: InteractionRequest
    task: str | None = None  # the run's task, for context
    page_url: str | None = None  # the question on the inbox page (None: no page configured)
    link_url: str | None = None  # a signed single-use link answering it (None: no page)
    # A follow-up (protocol/followup.py): "reminder" (again, to everyone allowed, escalated-to
    # people included) or "escalation" (to the people in `only`); None: the first asking.
    follow_up: str | None = None
    only: tuple[str, ...] = ()  # send to these respondents (token names, group:NAME) only


@dataclass(frozen=True)
class Closed:
    """A question no longer open: answered (by whom, through what, when known) or expired."""

    workspace: Path
    request_id: str
    how: str  # "answered" | "expired"
    answered_by: str | None = None
    channel: str | None = None


@dataclass(frozen=True)
class Context:
    """What the hub gives every channel."""

    state_dir: Path  # the channel's own directory in the daemon's state dir (0700)
    answer: Answer
    # Hands a composed message to the inbox process, which sends it (deltad/outbound/
    # courier.py's `Handed`, into deltad/outbound/handoff.py): the core sends nothing itself.
    hand: Callable[[Delivery], None]
    # A signed single-use link for (request id, workspace), when the page is served.
    link: Callable[[str, str], str] | None = None
    page: Callable[[str], str] | None = None  # the page's URL for a request id
    # The question a reply answers, if it can still be answered (SubmitError if not): read to
    # parse the reply by its kind and check its respondents, as the HTTP API does before it
    # delivers. A process without privileges is given a function that asks the core.
    question: Callable[[Workspace, str], InteractionRequest] = open_question
    # Replies a channel took in by (channel, result): deltad_channel_replies (metrics.py).
    replies: Counter | None = None
    # A reply refused before the answering path saw it (a forged or unauthenticated sender, a
    # sender no respondent), into the audit log: (workspace, request id, code, reason, who,
    # origin). The answering path records its own refusals (quorum.cast). None: not kept.
    refused: Refused | None = None


class Refused(Protocol):
    def __call__(
        self, ws: Path, request_id: str, code: str, reason: str, by: str, origin: dict[str, str]
    ) -> None: ...


class Channel(ABC):
    """One way questions reach people and their answers come back."""

    name: ClassVar[str]  # recorded as the answer's `channel`

    @abstractmethod
    def send(self, question: Question) -> None: ...

    @abstractmethod
    def withdraw(self, closed: Closed) -> None: ...

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def stop(self) -> None: ...
