"""A channel's own durable outbox and the thread that empties it: the webhook outbox's files,
retry rule and dead letter (deltad/api/outbox.py), with the sending left to the channel.

Every message is a file before it is attempted, so a stop or a crash loses nothing queued; a
channel whose server is down retries on its own thread with backoff and never holds up
another channel; what is given up goes to the dead letter with the reason. Layout:

    <channel dir>/outbox/<key>/...json       waiting
    <channel dir>/dead-letter/<key>/...json  given up
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import structlog
from prometheus_client import Counter

from deltad.api.outbox import Dead, Delivery, Outbox, Policy, after_failure, too_old

from .config import OutboxConfig

log = structlog.get_logger("deltad.channels")


@dataclass(frozen=True)
class Failed:
    """Why an attempt failed; `permanent` (a 5xx from a mail server, say) goes straight to the
    dead letter."""

    why: str
    permanent: bool = False


# Sends one delivery: None once it is accepted, else why not.
Send = Callable[[Delivery], Failed | None]


class Courier:
    """One channel's outbox and its sending thread."""

    def __init__(
        self,
        name: str,
        channel_dir: Path,
        config: OutboxConfig,
        send: Send,
        counted: Counter | None = None,
    ) -> None:
        self.name, self.config, self.send = name, config, send
        self.counted = counted  # sends by (channel, result): deltad_channel_sends
        self.policy = Policy(
            config.max_attempts,
            config.max_age_seconds,
            config.backoff_seconds,
            config.backoff_max_seconds,
        )
        self.outbox = Outbox(channel_dir, name)
        self._cond = threading.Condition()
        self._pending: dict[str, Delivery] = {}
        self._stopping = threading.Event()
        self._event = 0
        self.thread = threading.Thread(target=self._run, name=f"deltad-{name}-out", daemon=True)
        found, bad = self.outbox.load()
        for path in bad:
            self.outbox.bury_file(path)
        latest = time.time() + self.policy.backoff_max  # a clock set back parks nothing long
        self._pending = {d.msg_id: replace(d, next_at=min(d.next_at, latest)) for d in found}
        self._event = max((d.event_id for d in found), default=0)

    def put(self, to: str, kind: str, body: str) -> Delivery:
        """Queue `body` (a whole message) for `to`: on disk before this returns."""
        now = time.time()
        with self._cond:
            self._event = max(self._event + 1, time.time_ns() // 1000)
            d = Delivery(
                msg_id=f"msg_{uuid.uuid4().hex}",
                event_id=self._event,
                event=kind,
                url=to,
                body=body,
                created_at=now,
                next_at=now,
            )
            while len(self._pending) >= self.config.outbox_max:
                self._bury(min(self._pending.values(), key=lambda x: x.event_id), "outbox_full")
            self.outbox.save(d)
            self._pending[d.msg_id] = d
            self._cond.notify()
        return d

    def waiting(self) -> int:
        with self._cond:
            return len(self._pending)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stopping.set()
        with self._cond:
            self._cond.notify()
        self.thread.join(5)

    def _run(self) -> None:
        while (d := self._next_due()) is not None:
            try:
                self._attempt(d)
            except Exception as err:  # a channel must never take the daemon down
                log.error("channel_send_failed", channel=self.name, error=str(err))
                with self._cond:
                    if d.msg_id in self._pending:
                        later = time.time() + self.policy.backoff_max
                        self._pending[d.msg_id] = replace(d, next_at=later)

    def _next_due(self) -> Delivery | None:
        with self._cond:
            while not self._stopping.is_set():
                now = time.time()
                due = [d for d in self._pending.values() if d.next_at <= now]
                if due:
                    return min(due, key=lambda d: d.event_id)
                soonest = min((d.next_at for d in self._pending.values()), default=now + 60)
                self._cond.wait(max(0.01, soonest - now))
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
            log.info("channel_sent", channel=self.name, kind=d.event, attempt=d.attempts + 1)
            self._count("sent")
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
        log.warning(
            "channel_retry", channel=self.name, kind=d.event, attempt=d.attempts, error=failed.why
        )

    def _bury(self, d: Delivery, reason: str) -> None:
        with self._cond:
            if self._pending.pop(d.msg_id, None) is None:
                return
            self.outbox.bury(d, reason)
            self.outbox.prune_dead(self.config.outbox_max)
        self._count("dead")
        log.error(
            "channel_dead_letter",
            channel=self.name,
            kind=d.event,
            attempts=d.attempts,
            reason=reason,
            error=d.last_error,
        )

    def _count(self, result: str) -> None:
        if self.counted is not None:
            self.counted.labels(self.name, result).inc()
