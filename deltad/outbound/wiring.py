"""Delivery, composed for the daemon's lifecycle: what the inbox process is handed to send
(`sending`: each webhook's, channel's and notify command's target, their secrets read here, and
the email channel's Maildir for it to read) and the core's side beside the loop (`Outbound`:
the notifier's intake and the channels' hub, fed by the feed's events). What cannot be made is
`Unusable`, one line naming the key (`deltad serve` says it and exits 2).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deltad.validation import unusable

if TYPE_CHECKING:
    from deltad.inbox.config import NotifyConfig
    from deltad.inbox.feed import Feed
    from deltad.inbox.handlers import Context
    from deltad.metrics import CoreMetrics
    from deltad.outbound.config import ChannelsConfig, EmailConfig
    from deltad.outbound.handoff import Handoff
    from deltad.outbound.hub import Hub
    from deltad.outbound.intake import Intake
    from deltad.outbound.mail import Received
    from deltad.outbound.notify import Notifier
    from deltad.wire import ChannelTarget, MailIntake, WebhookTarget


@dataclass(frozen=True)
class Sending:
    """What the inbox process delivers for the core (none of it is sent as root)."""

    webhooks: list[WebhookTarget]
    caps: list[int]  # each webhook's outbox_max
    channels: list[ChannelTarget]  # the channels' and the notify commands'
    mail: MailIntake | None  # the email channel's Maildir, read by the inbox
    where: str  # the key an inbox started for these alone is named by, in an error

    @property
    def needs_inbox(self) -> bool:
        return bool(self.webhooks or self.channels or self.mail is not None)


def sending(notify: NotifyConfig | None, channels: ChannelsConfig | None) -> Sending:
    """What the inbox process is handed to send (the secrets read now, by the core)."""
    targets: list[ChannelTarget] = []
    if channels is not None:
        from deltad.outbound.hub import targets as channel_targets

        try:
            targets = channel_targets(channels)
        except (OSError, ValueError) as e:
            raise unusable("channels", e) from None
    hooks = notify.webhooks if notify is not None else []
    if notify is not None:
        from deltad.outbound.senders import command_target

        targets += [
            command_target(f"command{i}", c.argv, c.timeout_seconds)
            for i, c in enumerate(notify.commands)
        ]
    webhooks: list[WebhookTarget] = []
    if hooks:
        from deltad.outbound.notify import webhook_target

        try:
            webhooks = [webhook_target(w, f"webhook{i}") for i, w in enumerate(hooks)]
        except (OSError, ValueError) as e:
            raise unusable("notify", e, named=("notify", "channels")) from None
    where = "notify.webhooks" if hooks else "notify.commands"
    where = "channels" if channels is not None and not hooks else where
    email = channels.email if channels is not None else None
    mail = mail_intake(email) if email is not None else None
    return Sending(webhooks, [w.outbox_max for w in hooks], targets, mail, where)


def mail_intake(email: EmailConfig) -> MailIntake:
    """What the inbox process is told of the email channel's Maildir (privsep/wire.py)."""
    from deltad.wire import MailIntake

    return MailIntake(
        maildir=str(email.maildir),
        reply_local=email.reply_local,
        reply_domain=email.reply_domain,
        max_message_bytes=email.max_message_bytes,
        max_per_pass=email.max_per_pass,
        poll_seconds=email.poll_seconds,
    )


class Outbound:
    """The core's side of delivery, on threads beside the loop: the notifier (the feed's
    events as webhook documents, handed to the inbox process, and notify commands) and the
    channels' hub (questions to email and Slack, their answers taken in). Made before the
    first reconcile (what cannot be is a config error), started after the inbox, stopped
    before it."""

    def __init__(
        self,
        notify: NotifyConfig | None,
        channels: ChannelsConfig | None,
        feed: Feed,
        quiet_roots: list[Path],
        state_dir: Path,
        metrics: CoreMetrics,
        context: Context | None = None,
        handoff: Handoff | None = None,
        audit: Path | None = None,
    ) -> None:
        self.channels_config, self.feed, self.quiet = channels, feed, quiet_roots
        self.audit = audit  # the log the channels' votes are receipts in (None: not kept)
        self.state_dir, self.metrics = state_dir, metrics
        self.context, self.handoff = context, handoff
        self.notifier: Notifier | None = None
        self.hub: Hub | None = None
        self.intake: Intake | None = None
        if notify is not None and (notify.webhooks or notify.commands) and handoff is not None:
            from deltad.outbound.notify import Notifier

            try:
                self.notifier = Notifier(notify, quiet_roots, context, handoff)
            except (OSError, ValueError) as e:
                raise unusable("notify", e, named=("notify",)) from None

    def start(self) -> None:
        """The intake thread, fed by the registry's changes from now on (started before the
        first reconcile, which it never waits for)."""
        from deltad.outbound.intake import Intake

        if self.channels_config is not None:
            from deltad.outbound import hub

            try:
                self.hub = hub.start(
                    self.channels_config,
                    self.quiet,
                    self.context,
                    self.state_dir,
                    self.handoff,
                    self.metrics.channel_replies,
                    self.audit,
                )
            except (OSError, ValueError) as e:
                raise unusable("channels", e) from None
        consumers = [c for c in (self.notifier, self.hub) if c is not None]
        if consumers:
            self.intake = Intake(self.feed, consumers)
            self.intake.start()

    def mail(self) -> Callable[[Received], dict[str, Any]] | None:
        """The email channel's `receive`, which decides on what the inbox relays from the
        Maildir (None: no email channel, or not started)."""
        if self.hub is None:
            return None
        from deltad.outbound.email import EmailChannel

        return next((c.receive for c in self.hub.channels if isinstance(c, EmailChannel)), None)

    def outbox_depth(self) -> int | None:
        """Webhook deliveries waiting in the inbox's outbox, as it last told (metrics)."""
        return None if self.notifier is None else int(self.notifier.outbox_depth())

    def stop(self) -> None:
        if self.intake is not None:
            self.intake.stop()
        if self.hub is not None:
            self.hub.stop()
