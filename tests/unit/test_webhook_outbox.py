"""The webhook rules in-process: signing (checked against the `standardwebhooks` package), the
secret file's one newline, the retry rule from a table, the outbox directory, and the core's
hand-off into it (deltad/outbound/handoff.py) as the inbox's worker takes it."""

from __future__ import annotations

import base64
import json
import time
from datetime import datetime
from pathlib import Path

import pytest
import standardwebhooks
from pydantic import ValidationError

from deltad.inbox.config import NotifyConfig, Secret, Webhook, one_newline_less
from deltad.outbound import webhooks
from deltad.outbound.courier import Courier
from deltad.outbound.handoff import Handoff, HandoffError
from deltad.outbound.notify import new_delivery, webhook_target
from deltad.outbound.outbox import (
    Dead,
    Delivery,
    Outbox,
    Policy,
    Retry,
    after_failure,
    target_key,
    too_old,
)
from deltad.outbound.senders import WebhookSender, webhook_courier
from deltad.pacing import Pacing, equal_jitter
from tests.support.webhooks import Receiver

KEY = b"0123456789abcdef"
WHSEC = "whsec_" + base64.b64encode(KEY).decode()


@pytest.mark.parametrize(
    ("secret", "key"),
    [
        (WHSEC.encode(), KEY),  # the spec's form: base64 after the prefix
        (b"plain bytes", b"plain bytes"),  # anything else: the bytes themselves
        (b" spaced ", b" spaced "),  # inner and outer spaces are part of the secret
    ],
)
def test_signing_key(secret: bytes, key: bytes) -> None:
    assert webhooks.signing_key(secret) == key


@pytest.mark.parametrize(
    ("secret", "message"),
    [(b"", "empty"), (b"whsec_", "empty"), (b"whsec_not base64!", "base64")],
)
def test_unusable_secrets(secret: bytes, message: str) -> None:
    with pytest.raises(webhooks.SecretError, match=message):
        webhooks.signing_key(secret)


@pytest.mark.parametrize(
    ("data", "secret"),
    [
        (b"abc\n", b"abc"),
        (b"abc\r\n", b"abc"),
        (b"abc\n\n", b"abc\n"),  # one newline only
        (b"abc", b"abc"),
        (b" abc \n", b" abc "),
    ],
)
def test_one_newline_less(data: bytes, secret: bytes) -> None:
    assert one_newline_less(data) == secret


def test_a_secret_file_loses_only_its_last_newline(tmp_path: Path) -> None:
    path = tmp_path / "s"
    path.write_bytes(b"  key  \n")
    assert Secret(secret_file=path).read() == b"  key  "


def test_headers_verify_with_the_reference_package() -> None:
    body = b'{"id": 1, "type": "request.created"}'
    ts = int(time.time())
    headers = webhooks.headers("msg_1", ts, body, KEY, "request.created")
    assert standardwebhooks.Webhook(WHSEC).verify(body, headers) == json.loads(body)
    assert headers["webhook-signature"] == standardwebhooks.Webhook(WHSEC).sign(
        "msg_1", datetime.fromtimestamp(ts), body.decode()
    )
    unsigned = webhooks.headers("msg_1", ts, body, None, "request.created")
    assert "webhook-signature" not in unsigned and unsigned["webhook-id"] == "msg_1"


@pytest.mark.parametrize(
    ("failures", "delay"), [(1, 2.0), (2, 4.0), (3, 8.0), (4, 10.0), (50, 10.0)]
)
def test_exponential_is_capped(failures: int, delay: float) -> None:
    assert Pacing(2.0, 10.0).delay(failures) == delay


@pytest.mark.parametrize(("r", "delay"), [(0.0, 4.0), (0.5, 6.0), (0.999, 7.996)])
def test_equal_jitter(r: float, delay: float) -> None:
    assert equal_jitter(8.0, r) == pytest.approx(delay)


POLICY = Policy(max_attempts=4, max_age=100.0, backoff=2.0, backoff_max=10.0)


def _delivery(attempts: int, created_at: float = 0.0) -> Delivery:
    return Delivery("msg_x", 7, "run.status", "http://127.0.0.1:1/", "{}", created_at, attempts)


@pytest.mark.parametrize(
    ("attempts", "now", "r", "step"),
    [
        (1, 10.0, 0.0, Retry(11.0)),  # 2 s, jittered down to half
        (1, 10.0, 0.5, Retry(11.5)),
        (2, 10.0, 0.0, Retry(12.0)),
        (3, 10.0, 0.0, Retry(14.0)),
        (3, 10.0, 0.999, Retry(10.0 + 7.996)),
        (4, 10.0, 0.0, Dead("max_attempts")),
        (5, 10.0, 0.0, Dead("max_attempts")),
        (1, 99.5, 0.0, Dead("max_age")),  # the retry would come after max_age
        (3, 96.0, 0.0, Retry(100.0)),  # exactly at max_age: still worth it
    ],
)
def test_after_failure(attempts: int, now: float, r: float, step: Retry | Dead) -> None:
    got = after_failure(_delivery(attempts), now, POLICY, r)
    if isinstance(step, Retry):
        assert isinstance(got, Retry) and got.at == pytest.approx(step.at)
    else:
        assert got == step


@pytest.mark.parametrize(("now", "old"), [(0.0, False), (100.0, False), (100.5, True)])
def test_too_old(now: float, old: bool) -> None:
    assert too_old(_delivery(0), now, POLICY) is old


def test_the_outbox_saves_loads_and_buries(tmp_path: Path) -> None:
    box = Outbox(tmp_path, "http://127.0.0.1:9/hook")
    first, second = _delivery(0), Delivery("msg_y", 8, "run.status", "u", "{}", 1.0)
    box.save(second)
    box.save(first)
    (box.pending_dir / "junk.json").write_text("{not json")
    (box.pending_dir / ".x.json.0123abcd.tmp").write_text("{")  # a crash mid-write
    found, bad = box.load()
    assert found == [first, second]  # oldest event first
    assert [p.name for p in bad] == ["junk.json"]
    assert not (box.pending_dir / ".x.json.0123abcd.tmp").exists()
    assert (box.pending_dir / first.file_name).stat().st_mode & 0o777 == 0o600
    assert box.pending_dir.stat().st_mode & 0o777 == 0o700
    box.bury(first, "max_attempts")
    buried = json.loads((box.dead_dir / first.file_name).read_text())
    assert buried["dead_reason"] == "max_attempts" and buried["msg_id"] == "msg_x"
    box.remove(second)
    box.bury_file(bad[0])
    assert list(box.pending_dir.iterdir()) == []
    assert box.prune_dead(keep=1) == 1  # the oldest event goes (names sort by event id)
    assert [p.name for p in box.dead_dir.iterdir()] == ["junk.json"]


def _handoff(tmp: Path, *hooks: Webhook) -> Handoff:
    """The core's side, as one user (no owner to hand files to): the inbox's directory is
    `tmp/inbox`, the state dir `tmp`."""
    (tmp / "inbox").mkdir(exist_ok=True, mode=0o700)
    return Handoff(tmp / "inbox", tmp, [h.url for h in hooks], [h.outbox_max for h in hooks], None)


def _worker(tmp: Path, hook: Webhook) -> Courier:
    """The inbox's side of one target (its thread not started): its courier, with the HTTP
    POST transport."""
    return webhook_courier(webhook_target(hook, "webhook0"), tmp / "inbox")


def _close(c: Courier) -> None:
    assert isinstance(c.send, WebhookSender)
    c.send.close()


def _put(box: Handoff, hook: Webhook, event_id: int) -> Delivery:
    d = new_delivery(
        {"id": event_id, "type": "run.status", "workspace": "/w"}, hook.url, time.time()
    )
    box.put(d)
    return d


def test_deliveries_of_a_removed_target_go_to_the_dead_letter(tmp_path: Path) -> None:
    kept, gone = Webhook(url="http://127.0.0.1:1/"), Webhook(url="http://127.0.0.1:2/")
    box = _handoff(tmp_path, kept, gone)
    _put(box, kept, 1)
    taken = _worker(tmp_path, gone)
    d = _put(box, gone, 1)
    assert taken.take_new() == 1  # one waits in the inbox's own directory, one in `new/`
    _put(box, gone, 2)
    box.close()
    box = _handoff(tmp_path, kept)  # the next start, without the second target
    outbox, dead = tmp_path / "inbox" / "outbox", tmp_path / "inbox" / "dead-letter"
    assert not (outbox / target_key(gone.url)).exists()
    buried = sorted(p.name for p in (dead / target_key(gone.url)).iterdir())
    assert len(buried) == 2 and d.file_name in buried
    assert len(list((outbox / target_key(kept.url) / "new").iterdir())) == 1
    box.close()


def test_an_older_deltads_outbox_is_handed_to_the_inbox(tmp_path: Path) -> None:
    hook, gone = Webhook(url="http://127.0.0.1:1/"), Webhook(url="http://127.0.0.1:2/")
    old, old_gone = Outbox(tmp_path, hook.url), Outbox(tmp_path, gone.url)
    waiting, given_up, orphan = (
        Delivery(f"msg_{i}", i, "run.status", "u", "{}", 1.0) for i in (1, 2, 3)
    )
    old.save(waiting)
    old.bury(given_up, "max_attempts")
    old_gone.save(orphan)
    box = _handoff(tmp_path, hook)
    assert not (tmp_path / "outbox").exists() and not (tmp_path / "dead-letter").exists()
    inbox = tmp_path / "inbox"
    new = inbox / "outbox" / target_key(hook.url) / "new"
    assert [p.name for p in new.iterdir()] == [waiting.file_name]
    assert [p.name for p in (inbox / "dead-letter" / target_key(hook.url)).iterdir()] == [
        given_up.file_name
    ]
    assert [p.name for p in (inbox / "dead-letter" / target_key(gone.url)).iterdir()] == [
        orphan.file_name
    ]
    box.close()


def test_the_core_never_follows_what_the_inbox_plants(tmp_path: Path) -> None:
    """The inbox's user can put anything in its outbox: a link where `new/` was is refused
    at the next start (one line), never written through."""
    hook = Webhook(url="http://127.0.0.1:1/")
    _handoff(tmp_path, hook).close()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    new = tmp_path / "inbox" / "outbox" / target_key(hook.url) / "new"
    new.rmdir()
    new.symlink_to(elsewhere)
    with pytest.raises(HandoffError, match=r"new: .*not a directory of the daemon's"):
        _handoff(tmp_path, hook)
    assert list(elsewhere.iterdir()) == []


def test_without_an_inbox_the_core_keeps_at_most_outbox_max(tmp_path: Path) -> None:
    hook = Webhook(url="http://127.0.0.1:9/hook", outbox_max=2)
    box = _handoff(tmp_path, hook)
    for event_id in (1, 2, 3, 4):
        _put(box, hook, event_id)
    new = tmp_path / "inbox" / "outbox" / target_key(hook.url) / "new"
    assert sorted(int(p.name.split("-")[0]) for p in new.iterdir()) == [3, 4]
    dead = tmp_path / "inbox" / "dead-letter" / target_key(hook.url)
    assert sorted(int(p.name.split("-")[0]) for p in dead.iterdir()) == [1, 2]
    assert box.buried == 2
    box.close()


def test_two_webhooks_may_not_share_a_url() -> None:
    hook = {"url": "http://127.0.0.1:1/"}
    with pytest.raises(ValidationError, match="entry 1 has the same url as entry 0"):
        NotifyConfig.model_validate({"webhooks": [hook, hook]})


def test_a_disk_that_fails_parks_the_delivery_instead_of_a_busy_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:

    with Receiver(default=503) as receiver:
        hook = Webhook(url=receiver.url, backoff_seconds=0.01, backoff_max_seconds=600)
        box = _handoff(tmp_path, hook)
        worker = _worker(tmp_path, hook)
        _put(box, hook, 1)
        worker.take_new()
        due = worker._next_due()
        assert due is not None

        def full(d: Delivery) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(worker.outbox, "save", full)
        with pytest.raises(OSError):
            worker._attempt(due)
        worker._park(due)
        [held] = worker._pending.values()
        assert held.attempts == 1 and held.next_at > time.time() + 500
        assert len(receiver.calls()) == 1
        _close(worker)
        box.close()


def test_a_full_outbox_pushes_its_oldest_delivery_to_the_dead_letter(tmp_path: Path) -> None:

    hook = Webhook(url="http://127.0.0.1:9/hook", outbox_max=2)
    box = _handoff(tmp_path, hook)
    worker = _worker(tmp_path, hook)
    for event_id in (3, 1, 2):
        _put(box, hook, event_id)
        worker.take_new()
    assert sorted(d.event_id for d in worker._pending.values()) == [2, 3]
    waiting = sorted(int(p.name.split("-")[0]) for p in worker.outbox.pending_dir.glob("*.json"))
    assert waiting == [2, 3]
    [dead] = worker.outbox.dead_dir.iterdir()
    doc = json.loads(dead.read_text())
    assert doc["event_id"] == 1 and doc["dead_reason"] == "outbox_full"
    # A new worker on the same state dir finds what is waiting, under the same ids.
    again = _worker(tmp_path, hook)
    assert again._pending.keys() == worker._pending.keys()
    _close(worker)
    _close(again)
    box.close()


def test_a_file_in_new_that_is_not_this_targets_delivery_goes_to_the_dead_letter(
    tmp_path: Path,
) -> None:
    hook = Webhook(url="http://127.0.0.1:9/hook")
    box = _handoff(tmp_path, hook)
    worker = _worker(tmp_path, hook)
    new = worker.outbox.pending_dir / "new"
    (new / "00000000000000000001-msg_a.json").write_text("{not json")
    (new / "00000000000000000002-msg_b.json").write_bytes(b"x" * (2 * 1024 * 1024))
    other = new_delivery({"id": 3, "type": "run.status"}, "http://127.0.0.1:1/", 1.0)
    (new / other.file_name).write_text(json.dumps(other.__dict__))
    assert worker.take_new() == 0
    assert len(list(worker.outbox.dead_dir.iterdir())) == 3 and not worker._pending
    _close(worker)
    box.close()
