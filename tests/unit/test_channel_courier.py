"""A channel's own outbox (deltad/outbound/courier.py): on disk before it is sent, kept across a
restart, retried, given up to the dead letter, and one channel's hung server never delays
another's."""

from __future__ import annotations

import threading
from pathlib import Path

from deltad.outbound.config import OutboxConfig
from deltad.outbound.courier import Courier, Failed
from deltad.outbound.outbox import Delivery

from ..conftest import wait_for

FAST = OutboxConfig(max_attempts=3, backoff_seconds=0.01, backoff_max_seconds=0.02)


def test_a_message_waits_on_disk_until_sent_and_survives_a_restart(tmp_path: Path) -> None:
    down = Courier("email", tmp_path, FAST, lambda d: Failed("connection refused"))
    d = down.put("alice@example.org", "question", "body")
    assert [x.msg_id for x in down.outbox.load()[0]] == [d.msg_id]  # before any attempt
    sent: list[Delivery] = []

    def ok(x: Delivery) -> Failed | None:
        sent.append(x)
        return None

    up = Courier("email", tmp_path, FAST, ok)  # the next daemon finds it waiting
    up.start()
    try:
        wait_for(lambda: sent, "the message to go out")
        wait_for(lambda: up.waiting() == 0, "the outbox to empty")
    finally:
        up.stop()
    assert [x.msg_id for x in sent] == [d.msg_id] and up.outbox.load() == ([], [])


def test_what_cannot_be_sent_goes_to_the_dead_letter(tmp_path: Path) -> None:
    tries: list[int] = []

    def failing(x: Delivery) -> Failed | None:
        tries.append(x.attempts)
        return Failed("SMTP 451")

    c = Courier("email", tmp_path, FAST, failing)
    c.put("a@example.org", "question", "body")
    c.put("b@example.org", "question", "body")
    rejected = Courier("other", tmp_path, FAST, lambda d: Failed("SMTP 550", permanent=True))
    rejected.put("c@example.org", "question", "body")
    for x in (c, rejected):
        x.start()
    try:
        wait_for(lambda: c.waiting() == 0 and rejected.waiting() == 0, "both to give up")
    finally:
        c.stop()
        rejected.stop()
    assert sorted(tries) == [0, 0, 1, 1, 2, 2]  # max_attempts each
    assert len(list(c.outbox.dead_dir.iterdir())) == 2
    assert len(list(rejected.outbox.dead_dir.iterdir())) == 1  # a 5xx: at once


def test_one_channel_hanging_never_delays_another(tmp_path: Path) -> None:
    release = threading.Event()

    def hang(x: Delivery) -> Failed | None:
        release.wait(30)
        return None

    sent: list[str] = []

    def ok(x: Delivery) -> Failed | None:
        sent.append(x.url)
        return None

    hung = Courier("slack", tmp_path / "slack", FAST, hang)
    fine = Courier("email", tmp_path / "email", FAST, ok)
    for c in (hung, fine):
        c.start()
    try:
        hung.put("#ops", "question", "body")
        for i in range(3):
            fine.put(f"p{i}@example.org", "question", "body")
        wait_for(lambda: len(sent) == 3, "the email channel's mail, while slack hangs")
        assert hung.waiting() == 1
    finally:
        release.set()
        hung.stop()
        fine.stop()
