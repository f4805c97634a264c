"""The inbox's side of a channel in a test: the core's real hand-off (deltad/outbound/handoff.py)
into `<tmp>/inbox`, and the inbox's Courier taking each message from it at once, with a
transport (the real sender of deltad/outbound/senders.py, or a function)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from deltad import wire
from deltad.outbound import senders
from deltad.outbound.courier import Courier, Failed, Send
from deltad.outbound.handoff import Handoff
from deltad.outbound.outbox import Delivery, target_key


@dataclass
class Inbox:
    handoff: Handoff
    courier: Courier

    def hand(self, d: Delivery) -> None:
        """A channel's `ctx.hand`: into `new/`, then taken into the courier's outbox."""
        self.handoff.put(d, target_key(self.courier.name))
        self.courier.take_new()

    def waiting(self) -> list[Delivery]:
        found, _ = self.courier.outbox.load()
        return sorted(found, key=lambda d: d.event_id)

    def drain(self) -> list[Failed | None]:
        """Every waiting delivery sent once, in order, and taken away: what each said."""
        out = []
        for d in self.waiting():
            out.append(self.courier.send(d))
            self.courier.outbox.remove(d)
            self.courier._pending.pop(d.msg_id, None)
        return out


def inbox_side(tmp: Path, target: wire.ChannelTarget, send: Send | None = None) -> Inbox:
    """`target`'s courier under `tmp/inbox` (its thread not started); `send` replaces the
    target's own sender."""
    where = tmp / "inbox"
    where.mkdir(parents=True, exist_ok=True, mode=0o700)
    handoff = Handoff(where, tmp, [], [], None, channels=[(target.name, target.outbox_max)])
    send = send if send is not None else senders.sender(target, where)
    courier = Courier(
        target.name,
        where,
        senders.outbox_config(target),
        send,
        handed=True,
        queued=senders.queued_hook(send),
    )
    return Inbox(handoff, courier)
