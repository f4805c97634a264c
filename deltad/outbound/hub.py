"""The channels beside the daemon's loop: the one intake thread (deltad/outbound/intake.py)
turns the feed's events into questions (read from the disk, never on the loop) and tells each
channel; each channel sends and takes answers in on threads of its own
(deltad/outbound/base.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import structlog
from prometheus_client import Counter

from deltad import inbox, tracing
from deltad.inbox import auditnotes, quorum
from deltad.inbox.feed import FeedEvent
from deltad.inbox.outcome import answers_of
from deltad.outbound.base import Answer, Channel, Closed, Context, Question, Refused
from deltad.outbound.config import ChannelsConfig
from deltad.outbound.outbox import Delivery, target_key
from deltad.protocol import Workspace, viewing

if TYPE_CHECKING:
    from deltad.outbound.handoff import Handoff
    from deltad.wire import ChannelTarget

log = structlog.get_logger("deltad.channels")
JOURNAL_TAIL_BYTES = 256 * 1024  # of a journal read to learn who answered
JOURNAL_TAIL_EVENTS = 200
WANTED = (
    "request.created",
    "request.answered",
    "request.expired",
    "request.reminder",  # the question again, to everyone allowed to answer it
    "request.escalated",  # the question to the people it was escalated to
)


def targets(config: ChannelsConfig) -> list[ChannelTarget]:
    """What the inbox process sends for the configured channels: each channel's settings and
    credential (read here, by the core; ValueError or OSError, one line, if one cannot be)."""
    from deltad.outbound import senders

    out = []
    if config.email is not None:
        out.append(senders.email_target(config.email))
    if config.slack is not None:
        out.append(senders.slack_target(config.slack))
    if config.pagerduty is not None:
        out.append(senders.pagerduty_target(config.pagerduty))
    if config.teams is not None:
        out.append(senders.teams_target(config.teams))
    return out


# Messages handed off on this thread (the intake's): a channel told of a question may send
# nothing (PagerDuty pages escalations only; a card already posted), and its `deliver` span
# says only what was handed.
_handed = threading.local()


def handed() -> int:
    return getattr(_handed, "count", 0)


def _hand(handoff: Handoff, name: str) -> Callable[[Delivery], None]:
    """A channel's messages into its outbox in the inbox process, which sends them."""
    key = target_key(name)
    if key not in handoff.channel_of:
        raise ValueError(f"{name}: the inbox process was not given the channel to send")

    def hand(d: Delivery) -> None:
        handoff.put(d, key)
        _handed.count = handed() + 1

    return hand


def build(
    config: ChannelsConfig,
    state_dir: Path,
    answer: Answer,
    handoff: Handoff,
    link: Callable[[str, str], str] | None = None,
    page: Callable[[str], str] | None = None,
    replies: Counter | None = None,
    audit: Path | None = None,
) -> list[Channel]:
    """The configured channels (ValueError or OSError, one line, if one cannot start); what a
    channel sends is handed to the inbox process through `handoff`."""
    out: list[Channel] = []
    if config.email is not None:
        from deltad.outbound.email import EmailChannel

        ctx = Context(
            state_dir / "channels" / "email",
            answer,
            _hand(handoff, "email"),
            link,
            page,
            replies=replies,
            refused=noting(audit, "email"),
        )
        out.append(EmailChannel(config.email, ctx))
    if config.slack is not None:
        from deltad.outbound.slack import SlackChannel

        ctx = Context(
            state_dir / "channels" / "slack",
            answer,
            _hand(handoff, "slack"),
            link,
            page,
            refused=noting(audit, "slack"),
        )
        out.append(SlackChannel(config.slack, ctx))
    if config.pagerduty is not None:
        from deltad.outbound.pagerduty import PagerDutyChannel

        ctx = Context(
            state_dir / "channels" / "pagerduty", answer, _hand(handoff, "pagerduty"), link, page
        )
        out.append(PagerDutyChannel(config.pagerduty, ctx))
    if config.teams is not None:
        from deltad.outbound.teams import TeamsChannel

        ctx = Context(
            state_dir / "channels" / "teams",
            answer,
            _hand(handoff, "teams"),
            link,
            page,
            refused=noting(audit, "teams"),
        )
        out.append(TeamsChannel(config.teams, ctx))
    return out


def answerer(ws: Path, run_id: object, request_id: str) -> tuple[str | None, str | None]:
    """Who answered `request_id` and through what, if the run's journal says so yet (the
    feed's event may come before the resumed run has recorded the answer)."""
    if not isinstance(run_id, str) or not run_id or "/" in run_id or run_id in (".", ".."):
        return None, None
    events = viewing.tail(
        Workspace(ws).run(run_id).journal, JOURNAL_TAIL_BYTES, JOURNAL_TAIL_EVENTS
    )
    answers, _ = answers_of(events)
    for a in reversed(answers):
        if a["request_id"] == request_id:
            return a["answered_by"], a["channel"] or a["source"]
    return None, None


class Hub:
    """The channels, a consumer of the intake (deltad/outbound/intake.py): each event they want
    is told to every channel, on the intake's thread; a channel that fails keeps no other from
    hearing."""

    def __init__(self, channels: list[Channel], quiet_roots: list[Path]) -> None:
        self.channels, self.quiet = channels, quiet_roots

    def start(self) -> None:
        for c in self.channels:
            c.start()

    def wants(self, e: FeedEvent) -> bool:
        return e.type in WANTED and not any(Path(e.workspace).is_relative_to(r) for r in self.quiet)

    def take(self, e: FeedEvent) -> None:
        for c in self.channels:
            try:
                self._tell(c, e)
            except Exception as err:  # a channel must never take the daemon down
                log.error("channel_failed", channel=c.name, event_id=e.id, error=str(err))

    def dropped(self, e: FeedEvent) -> None:
        log.error("channel_dropped", event_id=e.id, detail="queue full")

    def failed(self, e: FeedEvent, err: Exception) -> None:
        log.error("channel_failed", event_id=e.id, error=str(err))

    def _tell(self, c: Channel, e: FeedEvent) -> None:
        ws, request_id = Path(e.workspace), str(e.data.get("request_id"))
        if e.type == "request.expired":
            c.withdraw(Closed(ws, request_id, "expired"))
            return
        if e.type == "request.answered":
            who, via = answerer(ws, e.data.get("run_id"), request_id)
            c.withdraw(Closed(ws, request_id, "answered", who, via))
            return
        p = inbox.pending(ws)
        if p is None or p.request.request_id != request_id or p.answer_waiting:
            return  # answered or gone meanwhile: nothing to ask
        started, before = tracing.now(), handed()
        if e.type == "request.reminder":
            c.send(q := Question(ws, p.request, p.task, follow_up="reminder"))
        elif e.type == "request.escalated":
            to = e.data.get("escalated_to")
            only = tuple(str(t) for t in to) if isinstance(to, list) else ()
            c.send(q := Question(ws, p.request, p.task, follow_up="escalation", only=only))
        else:
            c.send(q := Question(ws, p.request, p.task))
        if (tracer := tracing.current).on and (messages := handed() - before) > 0:
            # Composed and handed to the inbox process's outbox, which sends it.
            attrs: dict[str, str | int | bool] = {"deltad.channel": c.name}
            attrs["deltad.messages"] = messages
            if q.follow_up:
                attrs["deltad.follow_up"] = q.follow_up
            where = tracing.Question(str(ws), request_id, tracing.checked(p.request.traceparent))
            tracer.record(where, tracing.Stage("deliver", started, tracing.now(), attrs))

    def stop(self) -> None:
        for c in self.channels:
            c.stop()


def noting(audit: Path | None, channel: str) -> Refused | None:
    """A channel's refusals into `audit` (inbox/auditnotes.py: bounded, a secret's reason
    left out), as the answering path records its own."""
    if audit is None:
        return None

    def refused(
        ws: Path, request_id: str, code: str, reason: str, by: str, origin: dict[str, str]
    ) -> None:
        auditnotes.refused(
            audit, ws, request_id, code, reason, channel=channel, by=by, origin=origin
        )

    return refused


def voting(audit: Path | None) -> Answer:
    """The channels' answering path: `quorum.answer_or_vote`, its votes' receipts in `audit`."""

    def answer(
        ws: Path,
        request_id: str | None,
        body: inbox.AnswerIn,
        *,
        answered_by: str | None = None,
        channel: str | None = None,
        voter: str | None = None,
        origin: dict[str, str] | None = None,
    ) -> inbox.Submitted | None:
        return quorum.answer_or_vote(
            ws,
            request_id,
            body,
            answered_by=answered_by,
            channel=channel,
            voter=voter,
            origin=origin,
            audit=audit,
        )

    return answer


def start(
    config: ChannelsConfig,
    quiet_roots: list[Path],
    http: object,
    state_dir: Path,
    handoff: Handoff | None,
    replies: Counter | None = None,
    audit: Path | None = None,
) -> Hub:
    """The daemon's channels, started: answers go through `deltad.inbox.submit` (by way of
    `quorum.answer_or_vote`), the function
    the HTTP API delivers through; links and the page's URL come from the HTTP server's
    context when it runs (`http`: a `deltad.inbox.handlers.Context` or None)."""
    from deltad.inbox import handlers

    link = page = None
    if isinstance(http, handlers.Context):
        ctx = http

        def link(request_id: str, workspace: str) -> str:
            return handlers.link_for(ctx, request_id, workspace)

        def page(request_id: str) -> str:
            return f"{ctx.base_url}/#request={request_id}"

    # Four eyes: a reply is a vote where the question needs several (inbox/quorum.py).
    if handoff is None:
        raise ValueError("no inbox process to hand the channels' messages to")
    # Each vote is a receipt in `audit` (None: not kept), as over HTTP: `quorum.cast` writes it.
    made = build(config, state_dir, voting(audit), handoff, link, page, replies, audit)
    hub = Hub(made, quiet_roots)
    hub.start()
    if isinstance(http, handlers.Context):
        # What the inbox relays from a channel's own endpoint (Slack's interactions) reaches
        # the channel here, in the core (deltad/privsep/core.py: `ChannelInteraction`).
        for c in hub.channels:
            if (take := getattr(c, "interaction", None)) is not None:
                http.interactions[c.name] = take
    return hub
