"""Webhooks end to end: a real `deltad serve` notifies a real receiver on 127.0.0.1, every
delivery checked with the `standardwebhooks` package; the outbox (the inbox process's, in the
state dir) outlives a SIGTERM and a kill -9; a delivery keeps its webhook-id; the dead letter
takes what is given up. Most daemons here have no `http:`: the inbox process is started for
the deliveries alone."""

from __future__ import annotations

import base64
import json
import os
import pwd
import signal
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import standardwebhooks
from standardwebhooks import webhooks as sw_module

from deltad.protocol import InputType, InteractionRequest, Mailbox, Workspace
from tests.support.daemon import Daemon, answer, paused_workspace, wait_for
from tests.support.webhooks import Call, Receiver

WHSEC = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as r:
        yield r


def _secret(tmp: Path, text: str) -> Path:
    path = tmp / f"hook-{len(list(tmp.glob('hook-*')))}.secret"
    path.write_text(text)
    path.chmod(0o600)
    return path


def _hook(url: str, secret: Path | None = None, **settings: Any) -> dict[str, Any]:
    hook: dict[str, Any] = {"url": url, "events": ["request.created"], **settings}
    if secret is not None:
        hook["signing"] = {"secret_file": str(secret)}
    return hook


def _daemon(tmp: Path, hooks: list[dict[str, Any]], **settings: Any) -> Daemon:
    root = tmp / "root"
    root.mkdir(exist_ok=True)
    return Daemon(tmp, [root], notify={"webhooks": hooks}, **settings)


def _verify(secret: str | bytes, call: Call) -> dict[str, Any]:
    doc = standardwebhooks.Webhook(secret).verify(call.body, call.headers)
    assert isinstance(doc, dict)
    return doc


def _pending(state_dir: Path) -> list[Path]:
    """What waits in the inbox's outbox (handed over by the core, or taken by the inbox)."""
    box = state_dir / "inbox" / "outbox"
    return sorted([*box.glob("*/*.json"), *box.glob("*/new/*.json")])


def _dead(state_dir: Path) -> list[Path]:
    return sorted((state_dir / "inbox" / "dead-letter").glob("*/*.json"))


def test_deliveries_verify_with_standard_webhooks_and_a_replay_does_not(
    tmp_path: Path, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Receiver() as raw_receiver:
        # One target with a `whsec_` secret, one with raw bytes; both files end in a newline,
        # which is the only thing taken off.
        hooks = [
            _hook(receiver.url, _secret(tmp_path, WHSEC + "\n")),
            _hook(raw_receiver.url, _secret(tmp_path, " raw secret \n")),
        ]
        d = _daemon(tmp_path, hooks).start()
        try:
            ws = d.tmp / "root" / "ws1"
            request_id = paused_workspace(ws, prompt="Ship it?")
            [call] = wait_for(receiver.delivered, "a delivery")
            [raw_call] = wait_for(raw_receiver.delivered, "a delivery to the second target")
        finally:
            d.stop()
    doc = _verify(WHSEC, call)
    assert doc["type"] == "request.created" and doc["workspace"] == str(ws)
    assert doc["request_id"] == Mailbox(Workspace.at(ws)).read_request().request_id
    assert request_id and call.headers["x-deltad-event"] == "request.created"
    assert call.headers["webhook-id"].startswith("msg_")
    assert "x-deltad-signature" not in call.headers
    assert _verify(base64.b64encode(b" raw secret ").decode(), raw_call)["id"] == doc["id"]

    # The same bytes ten minutes later: the package refuses the timestamp (replay).
    later = datetime.now(tz=UTC) + timedelta(minutes=10)

    class _Later(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> datetime:
            return later

    monkeypatch.setattr(sw_module, "datetime", _Later)
    with pytest.raises(standardwebhooks.WebhookVerificationError):
        _verify(WHSEC, call)
    monkeypatch.undo()
    # Another timestamp (within the tolerance) put on the captured body does not verify.
    moved = str(int(call.headers["webhook-timestamp"]) - 1)
    with pytest.raises(standardwebhooks.WebhookVerificationError):
        _verify(WHSEC, Call({**call.headers, "webhook-timestamp": moved}, call.body, 0))


def test_a_failing_receiver_gets_the_same_webhook_id_until_it_answers(
    tmp_path: Path,
) -> None:
    with Receiver(answers=[503, 500, 503]) as receiver:
        hook = _hook(receiver.url, _secret(tmp_path, WHSEC), backoff_seconds=0.05)
        d = _daemon(tmp_path, [hook]).start()
        try:
            paused_workspace(d.tmp / "root" / "ws1")
            [sent] = d.wait_event("notify_sent")
            calls = receiver.calls()
        finally:
            d.stop()
    assert [c.status for c in calls] == [503, 500, 503, 204]
    assert len({c.webhook_id for c in calls}) == 1 and sent["webhook_id"] == calls[0].webhook_id
    assert len({c.body for c in calls}) == 1  # the same bytes every time
    _verify(WHSEC, calls[-1])
    assert sent["attempt"] == 4
    assert len(d.events("notify_retry")) == 3
    assert _pending(d.state_dir) == [] and _dead(d.state_dir) == []


@pytest.mark.parametrize("stop", ["sigterm", "sigkill"])
def test_the_outbox_outlives_a_stop_and_delivers_once(tmp_path: Path, stop: str) -> None:
    with Receiver(default=503) as receiver:
        hook = _hook(
            receiver.url,
            _secret(tmp_path, WHSEC),
            backoff_seconds=0.2,
            max_attempts=50,
        )
        d = _daemon(tmp_path, [hook]).start()
        try:
            paused_workspace(d.tmp / "root" / "ws1")
            d.wait_event("notify_retry")
            [waiting] = _pending(d.state_dir)
            assert waiting.stat().st_mode & 0o777 == 0o600
            msg_id = json.loads(waiting.read_text())["msg_id"]
            if stop == "sigkill":
                d.signal(signal.SIGKILL)
        finally:
            d.stop()
        assert _pending(d.state_dir) == [waiting]  # still there after the stop
        receiver.default = 204
        settings = {k: v for k, v in d.settings.items() if k != "roots"}
        again = Daemon(d.tmp, d.settings["roots"], **settings).start()
        try:
            [sent] = again.wait_event("notify_sent")
            assert again.events("notify_replay")[0]["deliveries"] == 1
            assert _pending(d.state_dir) == []
        finally:
            again.stop()
    [delivered] = receiver.delivered()
    assert delivered.webhook_id == msg_id == sent["webhook_id"]
    assert {c.webhook_id for c in receiver.calls()} == {msg_id}
    _verify(WHSEC, delivered)


def test_a_delivery_goes_to_the_dead_letter_after_max_attempts(tmp_path: Path) -> None:
    with Receiver(default=500) as receiver:
        hook = _hook(receiver.url, None, backoff_seconds=0.05, max_attempts=3)
        d = _daemon(tmp_path, [hook]).start()
        try:
            paused_workspace(d.tmp / "root" / "ws1")
            [dead] = d.wait_event("notify_dead_letter")
        finally:
            d.stop()
        calls = receiver.calls()
    assert [c.status for c in calls] == [500, 500, 500]
    assert "webhook-signature" not in calls[0].headers  # no `signing:`: unsigned
    assert dead["reason"] == "max_attempts" and dead["attempts"] == 3
    assert dead["error"] == "HTTP 500"
    [buried] = _dead(d.state_dir)
    assert str(buried) == dead["file"] and buried.stat().st_mode & 0o777 == 0o600
    doc = json.loads(buried.read_text())
    assert doc["dead_reason"] == "max_attempts" and doc["msg_id"] == calls[0].webhook_id
    assert json.loads(doc["body"])["type"] == "request.created"
    assert _pending(d.state_dir) == []


def _password_question(ws: Path, staging: Path) -> None:
    """A run waiting on a password, moved into the root whole (one question, never two)."""
    paused_workspace(staging, prompt="Password?")
    mailbox = Mailbox(Workspace.at(staging))
    old = mailbox.read_request()
    assert old is not None
    mailbox.post(
        InteractionRequest(
            prompt="Password?",
            input_type=InputType.PASSWORD,
            run_id=old.run_id,
            action_id=old.action_id,
        )
    )
    os.rename(staging, ws)


def test_a_secret_answer_never_reaches_the_outbox(tmp_path: Path) -> None:
    secret = "hunter2-outbox-secret"
    with Receiver(default=503) as receiver:
        hook = _hook(
            receiver.url,
            _secret(tmp_path, WHSEC),
            events=["request.created", "request.answered", "run.status"],
            backoff_seconds=60,
            max_attempts=50,
        )
        d = _daemon(tmp_path, [hook], http={"listen": "127.0.0.1:0"}).start()
        try:
            ws = d.tmp / "root" / "ws1"
            _password_question(ws, tmp_path / "staging")
            wait_for(lambda: receiver.calls(), "the question's first delivery")
            answer(ws, secret)
            d.wait_resumed(ws)

            def events() -> set[str] | None:
                kinds = {json.loads(p.read_text())["event"] for p in _pending(d.state_dir)}
                return kinds if "request.answered" in kinds else None

            wait_for(events, "the answer's delivery in the outbox")
            files = [p.read_text() for p in _pending(d.state_dir)]
        finally:
            d.stop()
    created = [json.loads(json.loads(f)["body"]) for f in files]
    assert any(c.get("request", {}).get("input_type") == "password" for c in created)
    seen = files + [c.body.decode() for c in receiver.calls()]
    assert all(secret not in text for text in seen)
    assert secret not in d.log_path.read_text()


def test_a_hanging_receiver_times_out_per_attempt_and_slows_no_other_target(
    tmp_path: Path,
) -> None:
    with Receiver(hang_first=1) as hanging, Receiver() as other:
        hooks = [
            _hook(hanging.url, _secret(tmp_path, WHSEC), timeout_seconds=1, backoff_seconds=0.05),
            _hook(other.url, _secret(tmp_path, WHSEC)),
        ]
        d = _daemon(tmp_path, hooks).start()
        try:
            paused_workspace(d.tmp / "root" / "ws1")
            [first] = wait_for(other.delivered, "the other target's delivery")
            [retry] = d.wait_event("notify_retry", target="webhook0")
            assert retry["error"] in ("ReadTimeout", "WriteTimeout", "deadline")
            wait_for(hanging.delivered, "the hanging target's delivery after its timeout")
        finally:
            d.stop()
    calls = hanging.calls()
    assert calls[0].status == 0 and 200 <= calls[-1].status < 300
    assert {c.webhook_id for c in calls} == {calls[0].webhook_id}
    assert first.webhook_id != calls[0].webhook_id  # one delivery per target
    _verify(WHSEC, calls[-1])


def test_an_unusable_secret_stops_the_daemon_with_one_line(tmp_path: Path) -> None:
    hook = _hook("http://127.0.0.1:9/hook", _secret(tmp_path, "whsec_not base64!\n"))
    d = _daemon(tmp_path, [hook]).start(wait=False)
    assert d.proc is not None
    try:
        assert d.proc.wait(60) == 2
    finally:
        d.stop()
    errors = [x for x in d.log_path.read_text().splitlines() if x.startswith("deltad: error")]
    [error] = errors  # refused before it starts (deltad check says the same)
    assert error.endswith(
        ": notify.webhooks.0.signing: a whsec_ secret must be base64 after the prefix"
    )


@pytest.mark.parametrize("http", [False, True], ids=["webhooks-only", "with-http"])
def test_deliveries_are_sent_by_the_inbox_user_never_root(tmp_path: Path, http: bool) -> None:
    """The socket that reaches the receiver is the inbox process's (its uid in /proc/net/tcp),
    whether the daemon serves HTTP or starts the inbox for its webhooks alone."""
    inbox_uid = pwd.getpwnam("deltad-inbox").pw_uid
    with Receiver(answers=[503]) as receiver:
        settings: dict[str, Any] = {"http": {"listen": "127.0.0.1:0"}} if http else {}
        hook = _hook(receiver.url, _secret(tmp_path, WHSEC), backoff_seconds=0.05)
        d = _daemon(tmp_path, [hook], **settings).start()
        try:
            paused_workspace(d.tmp / "root" / "ws1")
            wait_for(receiver.delivered, "a delivery after one retry")
            said = d.events("inbox_for_webhooks")
        finally:
            d.stop()
    calls = receiver.calls()
    assert [c.uid for c in calls] == [inbox_uid, inbox_uid] and inbox_uid != 0
    _verify(WHSEC, calls[-1])
    assert len(said) == (0 if http else 1)  # without http: one line says why it runs


def test_a_killed_inbox_loses_no_delivery(tmp_path: Path) -> None:
    """kill -9 of the inbox process in the middle of an attempt: the core starts another,
    which sends the same delivery (the same webhook-id) from the outbox."""
    with Receiver(hang_first=1) as receiver:
        hook = _hook(receiver.url, _secret(tmp_path, WHSEC), timeout_seconds=600)
        d = _daemon(tmp_path, [hook]).start()
        try:
            paused_workspace(d.tmp / "root" / "ws1")
            [hanging] = wait_for(receiver.calls, "the first attempt, left hanging")
            [started] = d.events("inbox_started")
            os.kill(started["pid"], signal.SIGKILL)
            [sent] = d.wait_event("notify_sent")
            restarted = d.events("inbox_started")
        finally:
            d.stop()
    [delivered] = receiver.delivered()
    assert delivered.webhook_id == hanging.webhook_id == sent["webhook_id"]
    assert len(restarted) == 2 and restarted[1]["pid"] != started["pid"]
    assert d.events("inbox_exited")[0]["pid"] == started["pid"]
    _verify(WHSEC, delivered)


def test_a_notify_command_runs_as_the_inbox_user_in_a_clean_environment(
    tmp_path: Path, notify_out: Path
) -> None:
    """`notify.commands` alone (no http:, no webhook): the inbox process starts for them and
    runs each command as its user, never root, with PATH and LANG only, the event on stdin; a
    command that fails goes to the dead letter, counted, and is not run again."""
    import sys

    got = notify_out / "ran.jsonl"
    record = (
        "import json, os, sys; doc = json.load(sys.stdin); "
        f"open({str(got)!r}, 'a').write(json.dumps("
        "{'uid': os.getuid(), 'env': sorted(os.environ), 'type': doc['type']}) + '\\n')"
    )
    commands = [
        {"argv": [sys.executable, "-c", record], "events": ["request.created"]},
        {"argv": ["/bin/false"], "events": ["request.created"]},
    ]
    root = tmp_path / "root"
    root.mkdir()
    d = Daemon(tmp_path, [root], notify={"commands": commands}).start()
    try:
        paused_workspace(root / "ws1")
        [ran] = wait_for(lambda: [json.loads(x) for x in got.read_text().splitlines()]
                         if got.exists() else [], "the command's run")  # fmt: skip
        [dead] = d.wait_event("channel_dead_letter", channel="command1")
        said = d.events("inbox_for_webhooks")
    finally:
        d.stop()
    assert ran["uid"] == pwd.getpwnam("deltad-inbox").pw_uid != 0
    assert ran["type"] == "request.created"
    assert {k for k in ran["env"] if k != "LC_CTYPE"} == {"PATH", "LANG"}
    assert dead["reason"] == "rejected" and dead["error"] == "exit status 1"
    assert len(said) == 1 and len(d.events("channel_sent", channel="command0")) == 1
