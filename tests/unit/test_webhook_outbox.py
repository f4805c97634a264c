"""The webhook rules in-process: signing (checked against the `standardwebhooks` package), the
secret file's one newline, the retry rule from a table, and the outbox directory."""

from __future__ import annotations

import base64
import json
import time
from datetime import datetime
from pathlib import Path

import pytest
import standardwebhooks
from pydantic import ValidationError

from deltad.api import webhooks
from deltad.api.config import NotifyConfig, Secret, Webhook, one_newline_less
from deltad.api.notify import _WebhookWorker
from deltad.api.outbox import (
    Dead,
    Delivery,
    Outbox,
    Policy,
    Retry,
    after_failure,
    bury_orphans,
    target_key,
    too_old,
)
from deltad.daemon.backoff import exponential, jittered
from deltad.testing.webhooks import Receiver

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
    assert exponential(2.0, 10.0, failures) == delay


@pytest.mark.parametrize(("r", "delay"), [(0.0, 4.0), (0.5, 6.0), (0.999, 7.996)])
def test_equal_jitter(r: float, delay: float) -> None:
    assert jittered(8.0, r) == pytest.approx(delay)


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


def test_deliveries_of_a_removed_target_go_to_the_dead_letter(tmp_path: Path) -> None:
    kept, gone = Outbox(tmp_path, "http://127.0.0.1:1/"), Outbox(tmp_path, "http://127.0.0.1:2/")
    kept.save(_delivery(1))
    gone.save(_delivery(1))
    assert bury_orphans(tmp_path, ["http://127.0.0.1:1/"]) == 1
    assert not gone.pending_dir.exists()
    assert [p.name for p in gone.dead_dir.iterdir()] == [_delivery(1).file_name]
    assert [p.name for p in kept.pending_dir.iterdir()] == [_delivery(1).file_name]
    assert target_key("http://127.0.0.1:1/") == kept.pending_dir.name


def test_two_webhooks_may_not_share_a_url() -> None:
    hook = {"url": "http://127.0.0.1:1/"}
    with pytest.raises(ValidationError, match="entry 1 has the same url as entry 0"):
        NotifyConfig.model_validate({"webhooks": [hook, hook]})


def test_a_disk_that_fails_parks_the_delivery_instead_of_a_busy_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:

    with Receiver(default=503) as receiver:
        hook = Webhook(url=receiver.url, backoff_seconds=0.01, backoff_max_seconds=600)
        worker = _WebhookWorker(hook, "webhook0", [], tmp_path)  # its thread is not started
        worker.submit({"id": 1, "type": "run.status", "workspace": "/w"})
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
        worker.client.close()


def test_a_full_outbox_pushes_its_oldest_delivery_to_the_dead_letter(tmp_path: Path) -> None:

    hook = Webhook(url="http://127.0.0.1:9/hook", outbox_max=2)
    worker = _WebhookWorker(hook, "webhook0", [], tmp_path)  # its thread is not started
    for event_id in (3, 1, 2):
        worker.submit({"id": event_id, "type": "run.status", "workspace": "/w"})
    assert sorted(d.event_id for d in worker._pending.values()) == [2, 3]
    waiting = sorted(int(p.name.split("-")[0]) for p in worker.outbox.pending_dir.iterdir())
    assert waiting == [2, 3]
    [dead] = worker.outbox.dead_dir.iterdir()
    doc = json.loads(dead.read_text())
    assert doc["event_id"] == 1 and doc["dead_reason"] == "outbox_full"
    # A new worker on the same state dir finds what is waiting, under the same ids.
    again = _WebhookWorker(hook, "webhook0", [], tmp_path)
    assert again._pending.keys() == worker._pending.keys()
    worker.client.close()
    again.client.close()
