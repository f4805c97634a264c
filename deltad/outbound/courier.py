"""The one delivery queue (Postfix's qmgr): a target's durable outbox and the thread that
empties it, with the outbox's files, retry rule and dead letter (deltad/outbound/outbox.py) and
the sending left to a transport, a function from a delivery to why it failed or None
(`Send`: the HTTP POST of a webhook, SMTP, Slack's Web API and commands in
deltad/outbound/senders.py; a plain function in tests).

Every message is a file before it is attempted, so a stop or a crash loses nothing queued; the
due one with the oldest event goes first; a target whose server is down retries on its own
thread with backoff and never holds up another target (nor, waiting for its retry, the other
messages of its own); what is given up goes to the dead letter with the reason. Layout:

    <dir>/outbox/<key>/...json       waiting
    <dir>/dead-letter/<key>/...json  given up

The sending is the unprivileged inbox process's (deltad/privsep): the core's channel puts each
message through `Handed`, which writes it into the channel's `new/` in the inbox's outbox
(deltad/outbound/handoff.py, as the notifier does a webhook delivery); the inbox's `Courier`
(`handed=True`) takes it from there into its own outbox and sends it with the credential it
was handed (deltad/outbound/senders.py). The core never sends: one outbox, one retry rule,
one dead letter.
"""

from __future__ import annotations

import os
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import structlog

from deltad.outbound.config import OutboxConfig
from deltad.outbound.outbox import (
    DEAD_LETTER,
    NEW,
    Dead,
    Delivery,
    Outbox,
    Policy,
    after_failure,
    load_capped,
    too_old,
)

log = structlog.get_logger("deltad.channels")


@dataclass(frozen=True)
class Voice:
    """How a courier's log lines are named (documented in docs/inbox.md): `notify_*` with
    `target=` and `webhook_id=` for a webhook, `channel_*` with `channel=` for a channel."""

    prefix: str  # <prefix>_sent, _retry, _dead_letter, _dead_letter_pruned, _replay
    who: str  # the field naming the target
    msg_id: str  # the field naming the message
    failed: str  # an unexpected error's event


CHANNEL = Voice("channel", "channel", "msg_id", "channel_send_failed")
WEBHOOK = Voice("notify", "target", "webhook_id", "notify_failed")


@dataclass(frozen=True)
class Failed:
    """Why an attempt failed; `permanent` (a 5xx from a mail server, say) goes straight to the
    dead letter."""

    why: str
    permanent: bool = False


# Sends one delivery: None once it is accepted, else why not.
Send = Callable[[Delivery], Failed | None]
RESCAN_SECONDS = 30.0  # a handed courier looks in `new/` this often even without a hint


def new_message(to: str, kind: str, body: str, last_event: int) -> Delivery:
    """A message for `to`, its id and order (`event_id`: after `last_event`, in microseconds
    of the wall clock) fixed for its life."""
    now = time.time()
    return Delivery(
        msg_id=f"msg_{uuid.uuid4().hex}",
        event_id=max(last_event + 1, time.time_ns() // 1000),
        event=kind,
        url=to,
        body=body,
        created_at=now,
        next_at=now,
    )


class Handed:
    """A channel's outbox as the core holds it under the daemon: `put` hands the message to
    the inbox process (`hand`: deltad/outbound/handoff.py's `Handoff.put` for this channel's
    key), which sends it. The core sends nothing and reads nothing back."""

    def __init__(self, name: str, hand: Callable[[Delivery], None]) -> None:
        self.name, self.hand = name, hand
        self._lock = threading.Lock()
        self._event = 0

    def put(self, to: str, kind: str, body: str) -> Delivery:
        """On disk in the inbox's `new/` before this returns."""
        with self._lock:
            d = new_message(to, kind, body, self._event)
            self._event = d.event_id
        self.hand(d)
        return d

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


class Courier:
    """One target's outbox and its sending thread."""

    def __init__(
        self,
        name: str,
        channel_dir: Path,
        config: OutboxConfig,
        send: Send,
        *,
        handed: bool = False,
        tally: Callable[[str], None] | None = None,
        queued: Callable[[Delivery], None] | None = None,
        keyed: str | None = None,
        accepts: Callable[[Delivery], bool] | None = None,
        voice: Voice = CHANNEL,
        named: Path | None = None,
    ) -> None:
        """`handed`: in the inbox process, taking what the core handed over from `new/` (on
        `hint()`, at start and every RESCAN_SECONDS); `tally` is told each result; `queued`
        each message as it enters the outbox (the sender's own bookkeeping). `keyed`: what
        names the outbox's directories (default `name`; a webhook's URL); `accepts`: whether a
        handed-over file is this target's (else the dead letter); `named`: `channel_dir` as an
        operator names it, in log lines."""
        self.queued = queued
        self.name, self.config, self.send = name, config, send
        self.tally = tally
        self.handed = handed
        self.accepts = accepts
        self.voice = voice
        self.policy = Policy(
            config.max_attempts,
            config.max_age_seconds,
            config.backoff_seconds,
            config.backoff_max_seconds,
        )
        self.outbox = Outbox(channel_dir, keyed if keyed is not None else name)
        self.named_dead = (named or channel_dir) / DEAD_LETTER / self.outbox.dead_dir.name
        self._cond = threading.Condition()
        self._pending: dict[str, Delivery] = {}
        self._stopping = threading.Event()
        self._hinted = False
        self._event = 0
        self.thread = threading.Thread(target=self._run, name=f"deltad-{name}-out", daemon=True)
        found, bad = self.outbox.load()
        for path in bad:
            self.outbox.bury_file(path)
            self._said_unreadable(path.name)
        latest = time.time() + self.policy.backoff_max  # a clock set back parks nothing long
        self._pending = {d.msg_id: replace(d, next_at=min(d.next_at, latest)) for d in found}
        self._event = max((d.event_id for d in found), default=0)
        if found:
            # events: notify_replay channel_replay
            log.info(f"{voice.prefix}_replay", **{voice.who: name}, deliveries=len(found))
        if handed:
            self.take_new()

    def _said_unreadable(self, file: str) -> None:
        v = self.voice
        # events: notify_dead_letter channel_dead_letter
        log.error(f"{v.prefix}_dead_letter", **{v.who: self.name}, file=file, reason="unreadable")

    def put(self, to: str, kind: str, body: str) -> Delivery:
        """Queue `body` (a whole message) for `to`: on disk before this returns."""
        with self._cond:
            d = new_message(to, kind, body, self._event)
            self._event = d.event_id
            self._make_room()
            self.outbox.save(d)
            self._pending[d.msg_id] = d
            self._cond.notify()
        if self.queued is not None:
            self.queued(d)
        return d

    def _make_room(self) -> None:
        while len(self._pending) >= self.config.outbox_max:
            self._bury(min(self._pending.values(), key=lambda x: x.event_id), "outbox_full")

    # -- what the core handed over (the inbox process) ----------------------------------------
    def hint(self) -> None:
        """The core wrote into `new/` (from the thread reading the core's socket)."""
        with self._cond:
            self._hinted = True
            self._cond.notify()

    def take_new(self) -> int:
        """Move what waits in `new/` into this outbox, oldest first; how many. A file that is
        not a message (a link, too large, not JSON, misnamed) goes to the dead letter."""
        new_dir = self.outbox.pending_dir / NEW
        try:
            names = sorted(n for n in os.listdir(new_dir) if n.endswith(".json"))
        except FileNotFoundError:
            return 0
        taken = 0
        for name in names:
            path = self.outbox.pending_dir / name
            try:
                os.rename(new_dir / name, path)
            except FileNotFoundError:
                continue
            try:
                d = load_capped(path)
                if d.file_name != name or (self.accepts is not None and not self.accepts(d)):
                    raise ValueError("not this target's")
            except (OSError, ValueError, TypeError):
                self.outbox.bury_file(path)
                self._said_unreadable(name)
                self._count("dead")
                continue
            with self._cond:
                if d.msg_id not in self._pending:
                    self._make_room()
                    self._pending[d.msg_id] = d
                    self._event = max(self._event, d.event_id)
                    taken += 1
                    self._cond.notify()
            if self.queued is not None:
                self.queued(d)
        return taken

    def waiting(self) -> int:
        return len(self._pending)  # a plain length: read by the counts' report

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stopping.set()
        with self._cond:
            self._cond.notify()
        self.thread.join(5)
        close = getattr(self.send, "close", None)
        if close is not None and not self.thread.is_alive():  # else the process exit ends it
            close()

    def _run(self) -> None:
        v = self.voice
        while (d := self._next_due()) is not None:
            try:
                self._attempt(d)
            except Exception as err:  # a delivery must never take the process down
                # events: notify_failed channel_send_failed
                log.error(v.failed, **{v.who: self.name}, event_id=d.event_id, error=str(err))
                self._park(d)

    def _park(self, d: Delivery) -> None:
        """After an unexpected error (a full disk, say), wait the longest backoff: never a busy
        loop of attempts."""
        with self._cond:
            if (held := self._pending.get(d.msg_id)) is not None:
                later = time.time() + self.policy.backoff_max
                self._pending[d.msg_id] = replace(held, next_at=later)

    def _next_due(self) -> Delivery | None:
        look_at = time.monotonic() + RESCAN_SECONDS
        while not self._stopping.is_set():
            if self.handed:
                with self._cond:
                    hinted, self._hinted = self._hinted, False
                if hinted or time.monotonic() >= look_at:
                    look_at = time.monotonic() + RESCAN_SECONDS
                    try:
                        self.take_new()
                    except OSError as err:
                        # events: notify_failed channel_send_failed
                        log.error(self.voice.failed, **{self.voice.who: self.name}, error=str(err))
            with self._cond:
                if self._hinted or self._stopping.is_set():
                    continue
                now = time.time()
                due = [d for d in self._pending.values() if d.next_at <= now]
                if due:
                    return min(due, key=lambda d: d.event_id)
                soonest = min((d.next_at for d in self._pending.values()), default=now + 60)
                wait = soonest - now
                if self.handed:
                    wait = min(wait, look_at - time.monotonic())
                self._cond.wait(max(0.01, wait))
        return None

    def _attempt(self, d: Delivery) -> None:
        if too_old(d, time.time(), self.policy):
            self._bury(d, "max_age")
            return
        failed = self.send(d)
        if failed is None:
            with self._cond:
                self.outbox.remove(d)  # first: what was accepted is never sent again
                self._pending.pop(d.msg_id, None)
            self._count("sent")
            v = self.voice
            # events: notify_sent channel_sent
            log.info(f"{v.prefix}_sent", **self._about(d), attempt=d.attempts + 1)
            return
        d = replace(d, attempts=d.attempts + 1, last_error=failed.why)
        step = (
            Dead("rejected")
            if failed.permanent
            else after_failure(d, time.time(), self.policy, random.random())
        )
        if isinstance(step, Dead):
            self._bury(d, step.reason)
            return
        with self._cond:
            if d.msg_id not in self._pending:
                return
            d = replace(d, next_at=step.at)
            self._pending[d.msg_id] = d
            self.outbox.save(d)
        self._count("retry")
        v = self.voice
        # events: notify_retry channel_retry
        log.warning(
            f"{v.prefix}_retry",
            **self._about(d),
            attempt=d.attempts,
            error=failed.why,
            retry_in_s=round(step.at - time.time(), 3),
        )

    def _bury(self, d: Delivery, reason: str) -> None:
        with self._cond:
            if self._pending.pop(d.msg_id, None) is None:
                return
            self.outbox.bury(d, reason)
            pruned = self.outbox.prune_dead(self.config.outbox_max)
        self._count("dead")
        v = self.voice
        # events: notify_dead_letter channel_dead_letter
        log.error(
            f"{v.prefix}_dead_letter",
            **self._about(d),
            attempts=d.attempts,
            reason=reason,
            error=d.last_error,
            file=str(self.named_dead / d.file_name),
        )
        if pruned:
            v = self.voice
            # events: notify_dead_letter_pruned channel_dead_letter_pruned
            log.warning(f"{v.prefix}_dead_letter_pruned", **{v.who: self.name}, deleted=pruned)

    def _about(self, d: Delivery) -> dict[str, Any]:
        """A delivery's log fields, in this target's voice."""
        v = self.voice
        return {v.who: self.name, v.msg_id: d.msg_id, "event_id": d.event_id, "kind": d.event}

    def _count(self, result: str) -> None:
        if self.tally is not None:
            self.tally(result)
