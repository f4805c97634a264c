"""The channels' messages handed to the inbox process (deltad/outbound/courier.py `Handed`,
deltad/outbound/handoff.py, deltad/outbound/senders.py): the core writes each into its
channel's `new/`; the inbox's courier takes it from there, refuses what is not a message, and
sends it; the counts it tells grow the core's metrics, never shrink them."""

from __future__ import annotations

import json
import os
import ssl
import sys
from pathlib import Path

import pytest

from deltad import wire
from deltad.outbound import senders
from deltad.outbound.config import OutboxConfig
from deltad.outbound.courier import Courier, Failed, Handed
from deltad.outbound.handoff import Handoff
from deltad.outbound.outbox import DEAD_LETTER, NEW, OUTBOX, Delivery, target_key
from deltad.privsep import core

from ..conftest import wait_for

FAST = OutboxConfig(max_attempts=2, backoff_seconds=0.01, backoff_max_seconds=0.02)


def _handoff(tmp: Path, cap: int = 10, counted: object = None) -> Handoff:
    (tmp / "inbox").mkdir(exist_ok=True)
    return Handoff(tmp / "inbox", tmp, [], [], None, counted, [("email", cap)])  # type: ignore[arg-type]


def test_a_handed_message_is_sent_by_the_inbox_courier_once(tmp_path: Path) -> None:
    box = _handoff(tmp_path)
    key = target_key("email")
    hinted: list[str] = []
    box.hint = hinted.append
    d = Handed("email", lambda m: box.put(m, key)).put("alice@example.org", "question", "hi")
    assert hinted == [key]
    assert os.listdir(tmp_path / "inbox" / OUTBOX / key / NEW) == [d.file_name]
    sent: list[Delivery] = []

    def ok(m: Delivery) -> Failed | None:
        sent.append(m)
        return None

    inbox = Courier("email", tmp_path / "inbox", FAST, ok, handed=True)  # takes it at start
    inbox.start()
    try:
        wait_for(lambda: sent, "the message sent")
        wait_for(lambda: inbox.waiting() == 0, "the outbox empty")
    finally:
        inbox.stop()
        box.close()
    assert [(m.msg_id, m.url, m.body) for m in sent] == [(d.msg_id, "alice@example.org", "hi")]
    assert os.listdir(tmp_path / "inbox" / OUTBOX / key / NEW) == []


def test_what_is_not_a_message_in_new_goes_to_the_dead_letter(tmp_path: Path) -> None:
    box = _handoff(tmp_path)
    key = target_key("email")
    new = tmp_path / "inbox" / OUTBOX / key / NEW
    secret = tmp_path / "secret"
    secret.write_text("{}")
    (new / "00000000000000000001-a.json").symlink_to(secret)  # a planted link
    (new / "00000000000000000002-b.json").write_text("not json")
    good = Delivery("c", 3, "question", "bob@example.org", "x", 0.0)
    (new / "00000000000000000009-wrong.json").write_text(json.dumps(good.__dict__))  # misnamed
    told: list[str] = []
    inbox = Courier(
        "email", tmp_path / "inbox", FAST, lambda m: None, handed=True, tally=told.append
    )
    box.close()
    assert inbox.waiting() == 0 and told == ["dead", "dead", "dead"]
    dead = sorted(os.listdir(tmp_path / "inbox" / DEAD_LETTER / key))
    assert len(dead) == 3 and secret.read_text() == "{}"


def test_channel_counts_grow_the_cores_metrics_and_an_unknown_channel_is_ignored(
    tmp_path: Path,
) -> None:
    from deltad.metrics import CoreMetrics

    raw = b'{"op": "deliveries", "target": "email", "sent": 4, "retry": 1, "dead": 0, "depth": 2}'
    assert isinstance(core.decode(raw), str)  # never answered as a call
    counts = core.decode_message(raw)
    assert isinstance(counts, wire.Deliveries)
    counted = CoreMetrics().deliveries
    box = _handoff(tmp_path, counted=counted)
    box.report(counts)
    box.report(counts.model_copy(update={"sent": 1, "depth": 0}))  # 4 → 1: kept
    box.report(counts.model_copy(update={"target": "pager", "sent": 99}))
    box.connected()  # a new inbox counts from zero
    box.report(counts.model_copy(update={"sent": 2, "retry": 0, "dead": 1}))
    box.close()
    by = {
        (s.labels["target"], s.labels["kind"], s.labels["result"]): s.value
        for s in counted.collect()[0].samples
        if "_total" in s.name
    }
    assert by == {
        ("email", "email", "sent"): 6.0,
        ("email", "email", "retry"): 1.0,
        ("email", "email", "dead"): 1.0,
    }
    assert box.channel_depth == {"email": 2} and box.depth == 0


@pytest.mark.parametrize(
    "raw",
    [
        b'{"op": "deliveries", "target": "", "sent": 0, "retry": 0, "dead": 0, "depth": 0}',
        b'{"op": "deliveries", "target": "e", "sent": -1, "retry": 0, "dead": 0, "depth": 0}',
        b'{"op": "deliveries", "target": "e", "sent": 0, "retry": 0, "dead": 0}',
        b'{"op": "channel_sends", "channel": "e", "sent": 0, "retry": 0, "dead": 0, "depth": 0}',
    ],
)
def test_a_bad_channel_count_is_refused(raw: bytes) -> None:
    assert isinstance(core.decode_message(raw), str)


def test_beyond_its_cap_the_oldest_waiting_message_goes_to_the_dead_letter(tmp_path: Path) -> None:
    from deltad.metrics import CoreMetrics

    sends = CoreMetrics().deliveries
    box = _handoff(tmp_path, cap=2, counted=sends)
    key = target_key("email")
    hand = Handed("email", lambda m: box.put(m, key))
    first = hand.put("a@example.org", "question", "1")
    for n in "23":
        hand.put("a@example.org", "question", n)
    box.close()
    assert first.file_name in os.listdir(tmp_path / "inbox" / DEAD_LETTER / key)
    assert len(os.listdir(tmp_path / "inbox" / OUTBOX / key / NEW)) == 2
    [dead] = [s.value for s in sends.collect()[0].samples if s.name.endswith("_total")]
    assert dead == 1.0


def test_an_old_channel_outbox_is_handed_over_at_start(tmp_path: Path) -> None:
    """A deltad from before kept the channel's outbox in its own state dir: moved in as is."""
    key = target_key("email")
    old = tmp_path / "channels" / "email" / OUTBOX / key
    old.mkdir(parents=True)
    (old / "00000000000000000001-m.json").write_text("{}")
    box = _handoff(tmp_path)
    box.close()
    assert os.listdir(tmp_path / "inbox" / OUTBOX / key / NEW) == ["00000000000000000001-m.json"]


def _target(**settings: object) -> wire.ChannelTarget:
    return senders.command_target("command0", [sys.executable, "-c", "x"], 30).model_copy(
        update={
            "settings": {"argv": [sys.executable, "-c", "x"], "timeout_seconds": 30, **settings}
        }
    )


@pytest.mark.spawns  # the command's runs
@pytest.mark.parametrize(
    ("argv", "timeout", "said"),
    [
        ([sys.executable, "-c", "import sys; sys.stdin.read()"], 30, None),
        ([sys.executable, "-c", "raise SystemExit(3)"], 30, "exit status 3"),
        (["/nonexistent/page-oncall"], 30, "cannot run it"),
        ([sys.executable, "-c", "import time; time.sleep(60)"], 0.2, "timed out"),
    ],
)
def test_a_command_runs_once_and_a_failed_run_is_not_retried(
    argv: list[str], timeout: float, said: str | None
) -> None:
    run = senders.sender(_target(argv=argv, timeout_seconds=timeout), Path("/nonexistent"))
    got = run(Delivery("m", 1, "request.created", "command0", '{"type": "request.created"}', 0))
    if said is None:
        assert got is None
    else:
        assert got is not None and got.permanent and said in got.why


@pytest.mark.parametrize(
    "settings",
    [{"argv": []}, {"argv": None}, {"timeout_seconds": "soon"}],
)
def test_a_command_the_inbox_cannot_run_is_said_in_one_line(settings: dict[str, object]) -> None:
    with pytest.raises(senders.SenderError, match="command0: the command's settings"):
        senders.sender(_target(**settings), Path("/nonexistent"))


def _a_certificate() -> str:
    """One real CA certificate: the system bundle's first (any will do)."""
    bundle = ssl.get_default_verify_paths().cafile or "/etc/ssl/certs/ca-certificates.crt"
    try:
        text = Path(bundle).read_text()
    except OSError:
        pytest.skip("no system CA bundle to take a certificate from")
    end = "-----END CERTIFICATE-----"
    return text[text.index("-----BEGIN CERTIFICATE-----") : text.index(end) + len(end)] + "\n"


def test_the_smtp_target_carries_the_ca_and_the_password_never_the_file_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deltad.outbound.config import EmailConfig

    monkeypatch.setenv("SMTP_PASSWORD", "pw")
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    config = EmailConfig.model_validate(
        {
            "from_address": "deltad@d.example",
            "reply_domain": "d.example",
            "maildir": str(tmp_path / "Maildir"),
            "smtp": {
                "username": "u",
                "password": {"secret_env": "SMTP_PASSWORD"},
                "ca_file": str(ca),
            },
        }
    )
    with pytest.raises(ValueError, match=r"^email\.smtp\.ca_file: .*no CA certificate"):
        senders.email_target(config)  # in the core, at start (and `deltad check`): one line
    ca.write_text(_a_certificate())
    t = senders.email_target(config)
    assert (t.kind, t.key, t.secret) == ("smtp", target_key("email"), "pw")
    assert t.settings["ca"] == ca.read_text() and str(ca) not in json.dumps(t.settings)
    senders.sender(t, tmp_path)  # the inbox can send with it
