"""The email channel end to end: a real `deltad serve` mails a question through a real
Postfix on 127.0.0.1 (STARTTLS, the test's own certificate), people's replies go back
through the same MTA with `smtplib` into the Maildir the daemon reads, and a real `delta run`
resumes. Nothing is sent beyond 127.0.0.1 (tests/mta.py).

The Maildir is read and parsed by the unprivileged inbox process, which relays what it found to
the root core over the protocol; the last three tests show which process opens the mail, that
a kill -9 of either process mid-message loses nothing and answers once, and that relays forged
by a compromised inbox are refused by the core."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import secrets
import signal
import socket
import subprocess
import time
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import httpx

from deltad.outbound.grants import Grants
from deltad.testing import FakeLLM
from tests.mta import (
    AUTHSERV_ID,
    DELTAD_DOMAIN,
    PEOPLE_DOMAIN,
    Dkim,
    Mta,
    Tap,
    postfix,  # noqa: F401  (the fixture)
    postfix_dkim,  # noqa: F401  (the fixture)
)
from tests.support.daemon import DELTAD, Daemon, metadata_status
from tests.support.inbox import client, make_token

from ..conftest import Delta, llm_env, wait_for, write_agent
from .test_privsep import HOOK, _inbox_pid, _status

REAL_CLIENT = ["delta", "run", "--work-dir", "{workspace}"]
ALICE, BOB, MALLORY = (f"{p}@{PEOPLE_DOMAIN}" for p in ("alice", "bob", "mallory"))


def _daemon(tmp: Path, mta: Mta, root: Path, *, http: bool = True, **email: Any) -> Daemon:
    root.mkdir(parents=True, exist_ok=True)
    channel = {
        "from_address": f"deltad@{DELTAD_DOMAIN}",
        "reply_domain": DELTAD_DOMAIN,
        "maildir": str(mta.deltad_maildir),
        "smtp": {"host": "127.0.0.1", "port": mta.port, "ca_file": str(mta.cert)},
        "people": {ALICE: "alice", BOB: {"name": "bob", "groups": ["ops"]}},
        "poll_seconds": 0.2,
        **email,
    }
    return Daemon(
        tmp,
        [root],
        resume_command=REAL_CLIENT,
        **({"http": {"listen": "127.0.0.1:0"}} if http else {}),
        channels={"email": channel},
    )


def _mail(mta: Mta, person: str, request_id: str, subject: str = "") -> list[EmailMessage]:
    """`person`'s mail about question `request_id` whose subject holds `subject`."""
    return [
        m
        for m in mta.messages(person)
        if request_id in (str(m["Subject"]) + m.get_content()) and subject in str(m["Subject"])
    ]


def _reply(to: str, sender: str, text: str, subject: str = "Re: your question") -> EmailMessage:
    msg = EmailMessage()
    msg["From"], msg["To"], msg["Subject"] = sender, to, subject
    msg.set_content(text)
    return msg


def _ask(tmp: Path, fake: FakeLLM, **question: Any) -> tuple[Delta, str]:
    """A run in a watched workspace asks `question` (after the daemon is ready: a restart
    does not announce the questions already waiting)."""
    ws = tmp / "root" / "ws"
    ws.mkdir(parents=True)
    d = Delta(ws, fake, write_agent(tmp))
    fake.call("ask_human", question, id="q")
    fake.reply("done")
    assert d.start().code == 101
    return d, d.request()["request_id"]


def test_a_reply_answers_once_and_the_others_are_told(
    tmp_path: Path,
    fake: FakeLLM,
    postfix: Mta,  # noqa: F811  (the fixture imported above)
) -> None:
    mta = postfix
    prompt = "Which release channel?"
    daemon = _daemon(tmp_path, mta, tmp_path / "root").start(env=llm_env(fake))
    try:
        d, request_id = _ask(
            tmp_path, fake, prompt=prompt, input_type="choice", options=["[s] stable", "[b] beta"]
        )
        [question] = wait_for(lambda: _mail(mta, ALICE, request_id, "[deltad]"), "alice's mail")
        wait_for(lambda: _mail(mta, BOB, request_id, "[deltad]"), "bob's mail")
        text = question.get_content()
        assert prompt in text and "[B] beta" in text
        assert re.search(r"Answer in one click \(single use\): http://127\.0\.0\.1:\d+/a/", text)
        reply_to = str(question["Reply-To"])
        assert re.fullmatch(rf"reply\+[0-9a-f]{{36}}@{DELTAD_DOMAIN}", reply_to)

        # The answer by its label, above the quoted question and a signature.
        quoted = "\n".join("> " + line for line in text.splitlines())
        body = f"beta\n\n-- \nAlice\n\nOn Monday, deltad wrote:\n{quoted}\n"
        mta.send(_reply(reply_to, ALICE, body))
        wait_for(lambda: metadata_status(d.ws) == "COMPLETED", "the run to finish")
        assert "beta" in fake.tool_results()["q"]
        [answered] = daemon.events("email_answered", request_id=request_id)
        assert answered["answered_by"] == ALICE

        # Bob is told who answered; a replay of alice's reply is refused and changes nothing.
        [told] = wait_for(lambda: _mail(mta, BOB, request_id, "Closed"), "bob's notice")
        assert f"answered by {ALICE} by email" in told.get_content()
        # It names the question and sits in the thread of bob's mail of it.
        [asked] = _mail(mta, BOB, request_id, "[deltad] Which")
        assert str(told["Subject"]) == f"[deltad] Closed: {prompt}"
        assert f"> {prompt}" in told.get_content() and f"Workspace: {d.ws}" in told.get_content()
        assert str(told["In-Reply-To"]) == str(asked["Message-ID"]) == str(told["References"])
        mta.send(_reply(reply_to, ALICE, "stable"))
        [replay] = daemon.wait_event("email_reply_refused", code="replayed")
        assert replay["request_id"] == request_id
        wait_for(lambda: _mail(mta, ALICE, request_id, "not taken"), "alice's refusal")
        assert len(daemon.events("resume_spawned", workspace=str(d.ws))) == 1
    finally:
        daemon.stop()
    status = d("status")
    assert status.code == 0 and f"{ALICE} (email)" in status.out, status.out
    doc = json.loads(d("status", "--json").out)
    [got] = doc["outcome"]["answers"]
    assert got["channel"] == "email" and got["answered_by"] == ALICE
    # The run's history (its journal) keeps who answered and through what.
    [reply] = [
        e["payload"]["reply"]
        for e in d.events("HUMAN_INTERACTION")
        if e["payload"].get("phase") == "answered"
    ]
    assert (reply["channel"], reply["answered_by"], reply["key"]) == ("email", ALICE, "B")
    assert metadata_status(d.ws) == "COMPLETED"


def test_one_mail_over_the_parse_budget_holds_back_no_reply(
    tmp_path: Path,
    fake: FakeLLM,
    postfix: Mta,  # noqa: F811  (the fixture imported above)
) -> None:
    """A `To:` of 100,000 dots is under the size cap, and the standard library's header parser
    is quadratic on it (minutes): it is set aside unparsed, and the reply after it answers."""
    mta = postfix
    daemon = _daemon(tmp_path, mta, tmp_path / "root").start(env=llm_env(fake))
    try:
        d, request_id = _ask(tmp_path, fake, prompt="Ship it?", input_type="yes_no")
        [question] = wait_for(lambda: _mail(mta, ALICE, request_id, "[deltad]"), "alice's mail")
        reply_to = str(question["Reply-To"])
        evil = (
            f"From: {MALLORY}\r\nTo: a".encode()
            + b"." * 100_000
            + b"@b.c\r\nSubject: Re: your question\r\n\r\nyes\r\n"
        )
        mta.send_raw(MALLORY, reply_to, evil)
        [aside] = daemon.wait_event("email_message_set_aside")
        assert "To field is over" in aside["reason"], aside
        mta.send(_reply(reply_to, ALICE, "yes"))
        wait_for(lambda: metadata_status(d.ws) == "COMPLETED", "the run to finish")
        assert [e["answered_by"] for e in daemon.events("email_answered")] == [ALICE]
    finally:
        daemon.stop()


def test_refused_replies_change_nothing_and_say_why(
    tmp_path: Path,
    fake: FakeLLM,
    postfix: Mta,  # noqa: F811  (the fixture imported above)
) -> None:
    mta = postfix
    daemon = _daemon(tmp_path, mta, tmp_path / "root").start(env=llm_env(fake))
    try:
        d, request_id = _ask(tmp_path, fake, prompt="Deploy now?", input_type="yes_no",
                             respondents=["alice"])  # fmt: skip
        box = d.delta_dir / "interaction"
        [question] = wait_for(lambda: _mail(mta, ALICE, request_id, "[deltad]"), "alice's mail")
        reply_to = str(question["Reply-To"])
        assert "one click" not in question.get_content()  # a link names nobody: not offered

        def refused(code: str) -> str:
            [line] = daemon.wait_event("email_reply_refused", code=code)
            assert not (box / "response.json").exists() and not (box / "response.txt").exists()
            assert metadata_status(d.ws) == "WAITING_FOR_INPUT"
            return str(line["reason"])

        # Someone else using alice's reply address (From can be forged: the address decides).
        mta.send(_reply(reply_to, MALLORY, "yes"))
        assert f"only {ALICE} may answer" in refused("not_allowed")
        # An expired reply address (made with the daemon's own key, expired a second ago).
        grants = Grants(daemon.state_dir / "channels" / "email")
        _, tok = grants.issue(request_id, str(d.ws), ALICE, time.time() - 1)
        mta.send(_reply(f"reply+{tok}@{DELTAD_DOMAIN}", ALICE, "yes"))
        assert "expired" in refused("address_expired")
        # A reply address deltad never gave out: only logged (nobody to tell for sure).
        mta.send(_reply(f"reply+{secrets.token_hex(18)}@{DELTAD_DOMAIN}", ALICE, "yes"))
        refused("unknown_address")
        # An answer that does not fit: alice is told why and may reply again.
        mta.send(_reply(reply_to, ALICE, "maybe"))
        assert "'maybe'" in refused("misfit")
        # not_allowed, address_expired, misfit: each told to alice (the unknown one to nobody)
        wait_for(lambda: len(_mail(mta, ALICE, request_id, "not taken")) == 3, "alice's 3 refusals")
        assert _mail(mta, MALLORY, request_id) == [] and _mail(mta, BOB, request_id) == []

        mta.send(_reply(reply_to, ALICE, "yes"))
        wait_for(lambda: metadata_status(d.ws) == "COMPLETED", "the run to finish")
        assert fake.tool_results()["q"].startswith("yes")
        assert len(daemon.events("resume_spawned", workspace=str(d.ws))) == 1
        # channels: change on a restart, never under a running channel (a reload says so).
        email = {**daemon.settings["channels"]["email"], "poll_seconds": 5}
        daemon.write_config(channels={"email": email})
        daemon.reload()
        daemon.wait_event("channels_change_ignored")
    finally:
        daemon.stop()


def test_mail_queued_while_the_mta_is_unreachable_survives_a_kill_9(
    tmp_path: Path,
    fake: FakeLLM,
    postfix: Mta,  # noqa: F811  (the fixture imported above)
) -> None:
    mta = postfix
    with socket.socket() as s:  # a port nothing listens on: the MTA is "down"
        s.bind(("127.0.0.1", 0))
        down = s.getsockname()[1]
    smtp = {"host": "127.0.0.1", "port": down, "ca_file": str(mta.cert)}
    daemon = _daemon(tmp_path, mta, tmp_path / "root", smtp=smtp).start(env=llm_env(fake))
    try:
        d, request_id = _ask(tmp_path, fake, prompt="Rotate the keys?", input_type="yes_no")
        daemon.wait_event("channel_retry", count=2)  # alice's and bob's, each tried
        daemon.signal(signal.SIGKILL)
        daemon.proc.wait()  # type: ignore[union-attr]
    finally:
        daemon.stop()
    assert _mail(mta, ALICE, request_id) == []
    # The next daemon, with the MTA reachable, sends what the outbox kept: once each.
    daemon.write_config(channels={"email": {**daemon.settings["channels"]["email"],
                                            "smtp": {**smtp, "port": mta.port}}})  # fmt: skip
    daemon.start(env=llm_env(fake))
    try:
        [question] = wait_for(lambda: _mail(mta, ALICE, request_id, "[deltad]"), "alice's mail")
        wait_for(lambda: _mail(mta, BOB, request_id, "[deltad]"), "bob's mail")
        mta.send(_reply(str(question["Reply-To"]), ALICE, "yes"))
        wait_for(lambda: metadata_status(d.ws) == "COMPLETED", "the run to finish")
    finally:
        daemon.stop()
    assert len(_mail(mta, ALICE, request_id, "[deltad]")) == 1


def _sent(url: str, token: str) -> dict[str, float]:
    """deltad_deliveries_total for email (kind email) by result, and
    deltad_channel_outbox_depth (as `depth`), as the core's /metrics says them."""
    from prometheus_client.parser import text_string_to_metric_families

    with client(url, token) as http:
        text = http.get("/metrics").text
    out = {}
    for f in text_string_to_metric_families(text):
        for s in f.samples:
            if s.name == "deltad_deliveries_total" and s.labels["target"] == "email":
                assert s.labels["kind"] == "email"
                out[s.labels["result"]] = s.value
            elif s.name == "deltad_channel_outbox_depth" and s.labels["channel"] == "email":
                out["depth"] = s.value
    return out


def test_mail_is_sent_by_the_inbox_user_even_without_http(
    tmp_path: Path,
    fake: FakeLLM,
    postfix: Mta,  # noqa: F811  (the fixture imported above)
) -> None:
    """No `http:`: the inbox process starts for the channel alone, and the socket that reaches
    the MTA is its user's (the uid in /proc/net/tcp), never root's; the core holds no SMTP
    connection, and the mail arrives once."""
    mta = postfix
    inbox_uid = pwd.getpwnam("deltad-inbox").pw_uid
    with Tap(mta) as tap:
        smtp = {"host": "127.0.0.1", "port": tap.port, "ca_file": str(mta.cert)}
        daemon = _daemon(tmp_path, mta, tmp_path / "root", http=False, smtp=smtp)
        daemon.start(env=llm_env(fake))
        try:
            _, request_id = _ask(tmp_path, fake, prompt="Ship it?", input_type="yes_no")
            [question] = wait_for(lambda: _mail(mta, ALICE, request_id, "[deltad]"), "alice's mail")
            wait_for(lambda: _mail(mta, BOB, request_id, "[deltad]"), "bob's mail")
            said = daemon.events("inbox_for_webhooks")
        finally:
            daemon.stop()
    assert tap.connections() == [inbox_uid, inbox_uid] and inbox_uid != 0
    assert "one click" not in question.get_content()  # no page: no link
    assert len(said) == 1
    assert len(daemon.events("channel_sent", channel="email")) == 2


def test_a_killed_inbox_loses_no_mail(
    tmp_path: Path,
    fake: FakeLLM,
    postfix: Mta,  # noqa: F811  (the fixture imported above)
) -> None:
    """kill -9 of the inbox process while it waits on the MTA: the core starts another, which
    sends the same message from the outbox; each person gets it once, and /metrics (the core's)
    counts what the inbox sent."""
    mta = postfix
    with Tap(mta, hold=1) as tap:
        smtp = {"host": "127.0.0.1", "port": tap.port, "ca_file": str(mta.cert),
                "timeout_seconds": 600}  # fmt: skip
        daemon = _daemon(tmp_path, mta, tmp_path / "root", smtp=smtp).start(env=llm_env(fake))
        try:
            _, request_id = _ask(tmp_path, fake, prompt="Rotate?", input_type="yes_no")
            wait_for(tap.connections, "the first attempt, left hanging")
            [started] = daemon.events("inbox_started")
            os.kill(started["pid"], signal.SIGKILL)
            wait_for(lambda: _mail(mta, ALICE, request_id, "[deltad]"), "alice's mail")
            wait_for(lambda: _mail(mta, BOB, request_id, "[deltad]"), "bob's mail")
            url = str(daemon.wait_event("http_listening")[0]["url"])
            prom = make_token(daemon.state_dir, "prom", role="metrics")
            sent = wait_for(
                lambda: (s := _sent(url, prom)).get("sent") == 2 and s.get("depth") == 0 and s,
                "the inbox's sends counted in the core's /metrics",
            )
            restarted = daemon.events("inbox_started")
        finally:
            daemon.stop()
    assert len(restarted) == 2 and restarted[1]["pid"] != started["pid"]
    assert sent.get("dead", 0) == 0
    assert len(_mail(mta, ALICE, request_id, "[deltad]")) == 1
    assert len(_mail(mta, BOB, request_id, "[deltad]")) == 1


def _opened_in(directory: Path) -> dict[int, list[str]]:
    """Every process with a file in `directory` open (by /proc/<pid>/fd)."""
    found: dict[int, list[str]] = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            for fd in (p / "fd").iterdir():
                if (link := os.readlink(fd)).startswith(f"{directory}/"):
                    found.setdefault(int(p.name), []).append(link)
        except OSError:
            continue
    return found


def test_the_inbox_process_opens_the_mail_and_a_kill_9_mid_message_answers_once(
    tmp_path: Path,
    fake: FakeLLM,
    postfix: Mta,  # noqa: F811  (the fixture imported above)
) -> None:
    mta = postfix
    # No http: the inbox process is started for the mail alone (no socket, no page links).
    daemon = _daemon(tmp_path, mta, tmp_path / "root", http=False).start(env=llm_env(fake))
    new, cur = mta.deltad_maildir / "new", mta.deltad_maildir / "cur"
    try:
        d, request_id = _ask(tmp_path, fake, prompt="Ship it?", input_type="yes_no")
        [question] = wait_for(lambda: _mail(mta, ALICE, request_id, "[deltad]"), "alice's mail")
        inbox = _inbox_pid(daemon)
        seen = set(os.listdir(cur)) if cur.is_dir() else set()  # the module's MTA: earlier mail
        # The core stopped: the inbox reads the reply, relays it and holds it open, waiting for
        # the core's verdict. Whoever has it open then is who read it.
        daemon.signal(signal.SIGSTOP)
        try:
            mta.send(_reply(str(question["Reply-To"]), ALICE, "yes"))
            holders = wait_for(lambda: _opened_in(new), "the reply opened")
            # Postfix's delivery agent may still hold the file it just wrote: wait until it
            # lets go. The core is stopped: had it the file open, it would never let go.
            holders = wait_for(
                lambda: (h := _opened_in(new)) and (h if set(h) == {inbox} else None),
                f"the reply held by the inbox ({inbox}) alone; held by {holders}",
            )
            assert set(holders) == {inbox}, holders  # not the core (pid {daemon.proc.pid})
            uid = int(_status(inbox)["Uid"].split()[0])
            assert uid == pwd.getpwnam("deltad-inbox").pw_uid != 0
            os.kill(inbox, signal.SIGKILL)  # relayed, not acknowledged, not moved
        finally:
            daemon.signal(signal.SIGCONT)
        _inbox_pid(daemon, after=inbox)  # started again: it relays the same message again
        wait_for(lambda: metadata_status(d.ws) == "COMPLETED", "the run to finish")
        wait_for(lambda: not list(new.iterdir()), "the reply moved to cur/")
        [moved] = set(os.listdir(cur)) - seen
        assert moved.endswith(":2,S")
        assert len(daemon.events("email_answered", request_id=request_id)) == 1
        assert len(daemon.events("resume_spawned", workspace=str(d.ws))) == 1
        assert fake.tool_results()["q"].startswith("yes")
        assert daemon.events("email_reply_refused") == []  # alice is not told "not taken"

        # A message the inbox's user may not read (root's, 0600) stays in new/, said once;
        # the mail after it is still read (a replay of alice's reply, refused).
        (new / "0.root-only").write_bytes(b"From: x@y.z\n\nno\n")
        (new / "0.root-only").chmod(0o600)
        mta.send(_reply(str(question["Reply-To"]), ALICE, "no"))
        daemon.wait_event("email_reply_refused", code="replayed")
        [said] = daemon.events("email_maildir_unreadable", message="'0.root-only'")
        assert said["error"] == "Permission denied"
        wait_for(lambda: os.listdir(new) == ["0.root-only"], "the replay moved, not the other")
    finally:
        with contextlib.suppress(FileNotFoundError):
            (new / "0.root-only").unlink()  # the module's MTA: the next test's preflight
        daemon.stop()


def test_a_kill_9_of_the_core_mid_message_loses_no_reply(
    tmp_path: Path,
    fake: FakeLLM,
    postfix: Mta,  # noqa: F811  (the fixture imported above)
) -> None:
    """The core dies while the inbox waits for its verdict: the message stays in new/, and
    the next daemon's inbox relays it again and it answers, once."""
    mta = postfix
    daemon = _daemon(tmp_path, mta, tmp_path / "root", http=False).start(env=llm_env(fake))
    new = mta.deltad_maildir / "new"
    try:
        d, request_id = _ask(tmp_path, fake, prompt="Roll back?", input_type="yes_no")
        [question] = wait_for(lambda: _mail(mta, ALICE, request_id, "[deltad]"), "alice's mail")
        inbox = _inbox_pid(daemon)
        daemon.signal(signal.SIGSTOP)
        mta.send(_reply(str(question["Reply-To"]), ALICE, "yes"))
        wait_for(lambda: inbox in _opened_in(new), "the reply relayed, waiting for the core")
        daemon.signal(signal.SIGKILL)  # stopped, then killed: it never decided
        assert daemon.proc is not None
        daemon.proc.wait()
        wait_for(lambda: not Path(f"/proc/{inbox}").exists(), "the inbox to end with its core")
        assert len(os.listdir(new)) == 1  # kept, unanswered
    finally:
        daemon.stop()
    daemon.start(env=llm_env(fake))
    try:
        wait_for(lambda: metadata_status(d.ws) == "COMPLETED", "the run to finish")
        wait_for(lambda: not list(new.iterdir()), "the reply moved to cur/")
        assert len(daemon.events("email_answered", request_id=request_id)) == 1
        assert len(daemon.events("resume_spawned", workspace=str(d.ws))) == 1
        assert daemon.events("email_reply_refused") == []
    finally:
        daemon.stop()


FORGE = """
import concurrent.futures, json
from deltad import wire
from deltad.inbox.ops import ApiError
from deltad import wire
def relay(**over):
    args = {"message": "forged.1", "sender": ALICE, "text": "yes", **over}
    try:
        return remote.send("mail_reply", None, args)
    except ApiError as e:
        return [e.http, e.code]
def raw(**over):
    # What the typed client would refuse to send, sent anyway: the core refuses it by call id.
    args = {"message": "forged.2", "sender": ALICE, **over}
    doc = {"op": "mail_reply", "id": 10**9, "args": args}
    fut = concurrent.futures.Future()
    remote._waiting[10**9] = fut
    frame = json.dumps(doc).encode()
    with remote._sending:
        remote.sock.sendall(wire.HEADER.pack(len(frame)) + frame)
    reply = fut.result(30)
    return [reply.error.http, reply.error.code]
"""


def test_mail_relayed_by_a_compromised_inbox_is_checked_by_the_core(
    tmp_path: Path,
    fake: FakeLLM,
    postfix: Mta,  # noqa: F811  (the fixture imported above)
) -> None:
    """The inbox is taken over (the tests-only hook runs Python in it): whatever it relays as
    mail, the core checks the reply address with its own key, the sender against it, the
    answer against its question; nothing is answered until alice's real reply arrives."""
    mta = postfix
    daemon = _daemon(tmp_path, mta, tmp_path / "root").start(env={**llm_env(fake), **HOOK})
    try:
        d, request_id = _ask(tmp_path, fake, prompt="Deploy now?", input_type="yes_no")
        [question] = wait_for(lambda: _mail(mta, ALICE, request_id, "[deltad]"), "alice's mail")
        reply_to = str(question["Reply-To"])
        tok = reply_to.partition("+")[2].partition("@")[0]
        url = daemon.wait_event("http_listening")[0]["url"]
        code = (
            FORGE
            + f"""
ALICE, tok = {ALICE!r}, {tok!r}
result = {{
    "forged": relay(token="0" * 36),
    "tampered": relay(token=tok[:-1] + ("0" if tok[-1] != "0" else "1")),
    "none": relay(token=None),
    "wrong_sender": relay(token=tok, sender={MALLORY!r}),
    "misfit": relay(token=tok, text="maybe"),
    "automatic": relay(token=tok, automatic=True),
    "a_path": raw(token=tok, message="../../inbox/tokens.json", text="yes"),
    "too_long": raw(token=tok, text="y" * (16 * 1024 + 1)),
    "who_answered": raw(token=tok, text="yes", answered_by="root"),
}}
"""
        )
        with httpx.Client(base_url=url, timeout=60) as http:
            r = http.post("/__test__/exec", json={"code": code})
        assert r.status_code == 200 and "error" not in r.json(), r.text
        got = r.json()["result"]
        refused = {"result": "refused"}
        assert got == {
            "forged": {**refused, "code": "unknown_address"},
            "tampered": {**refused, "code": "unknown_address"},
            "none": {**refused, "code": "no_reply_address"},
            "wrong_sender": {**refused, "code": "not_allowed"},
            "misfit": {**refused, "code": "misfit"},
            "automatic": {**refused, "code": "auto_reply"},
            "a_path": [400, "protocol"],
            "too_long": [400, "protocol"],
            "who_answered": [400, "protocol"],
        }
        box = d.delta_dir / "interaction"
        assert not (box / "response.json").exists() and not (box / "response.txt").exists()
        assert metadata_status(d.ws) == "WAITING_FOR_INPUT"
        # alice's own reply still answers: nothing forged claimed her reply address.
        mta.send(_reply(reply_to, ALICE, "yes"))
        wait_for(lambda: metadata_status(d.ws) == "COMPLETED", "the run to finish")
        assert len(daemon.events("resume_spawned", workspace=str(d.ws))) == 1
    finally:
        daemon.stop()


def test_a_vote_counts_only_with_the_mtas_dmarc_pass_and_its_receipt_says_so(
    tmp_path: Path,
    fake: FakeLLM,
    postfix_dkim: tuple[Mta, Dkim],  # noqa: F811  (the fixture imported above)
) -> None:
    """Postfix with a real milter chain verifying every mail (`opendkim`, then `opendmarc`
    reading the people's domain's `p=reject` policy from DNS; authserv-id AUTHSERV_ID), under
    the default `authentication: approvals`: a vote by mail with alice's From but unsigned (a
    forged Authentication-Results of the MTA's own id below the MTA's), or signed with a key
    her domain never published, fails DMARC, is refused as `unauthenticated`, counts for
    nothing and is on record as refused; the votes their domain signed pass DMARC and answer
    the question, and each receipt in `deltad audit export` carries the MTA's verdict."""
    from deltad.testing.stub import paused_workspace

    mta, dkim = postfix_dkim
    root = tmp_path / "root"
    ws = root / "ws"
    ws.mkdir(parents=True)
    daemon = _daemon(tmp_path, mta, root, authserv_id=AUTHSERV_ID).start(env=llm_env(fake))
    try:  # asked once the daemon is ready (a question already waiting is not announced)
        paused_workspace(ws, "Ship it?", input_type="yes_no", approvals_required=2)
        request_id = json.loads((ws / ".delta/interaction/request.json").read_text())["request_id"]
        asked = {
            who: str(
                wait_for(lambda w=who: _mail(mta, w, request_id, "[deltad]"), who)[0]["Reply-To"]
            )
            for who in (ALICE, BOB)
        }

        def reply(who: str, n: int, text: str = "yes") -> bytes:
            msg = _reply(asked[who], who, text)
            msg["Date"] = "Sun, 29 Nov 2026 05:00:00 +0000"
            msg["Message-ID"] = f"<reply-{n}@{PEOPLE_DOMAIN}>"
            return msg.as_bytes()

        forged = f"Authentication-Results: {AUTHSERV_ID}; dkim=pass header.d={PEOPLE_DOMAIN}\n"
        mta.send_raw(ALICE, asked[ALICE], forged.encode() + reply(ALICE, 1))
        [one] = daemon.wait_event("email_reply_refused", code="unauthenticated")
        assert "header.d=" not in one["reason"], one  # the MTA's own verdict: no signature
        stranger = dkim.other_key(tmp_path)
        mta.send_raw(ALICE, asked[ALICE], dkim.sign(reply(ALICE, 2), key=stranger))
        wait_for(
            lambda: len(daemon.events("email_reply_refused", code="unauthenticated")) == 2,
            "the second refusal",
        )
        two = daemon.events("email_reply_refused", code="unauthenticated")[1]
        # opendmarc's verdict (the topmost header of the MTA's id): the domain's policy failed
        assert f"dmarc=fail header.from={PEOPLE_DOMAIN}" in two["reason"], two
        assert not daemon.events("email_voted") and not daemon.events("email_answered")
        told = wait_for(lambda: _mail(mta, ALICE, request_id, "not taken"), "alice's refusals")
        assert "not authenticated by" in told[0].get_content()

        mta.send_raw(ALICE, asked[ALICE], dkim.sign(reply(ALICE, 3)))
        daemon.wait_event("email_voted", request_id=request_id)
        mta.send_raw(BOB, asked[BOB], dkim.sign(reply(BOB, 4)))
        daemon.wait_event("email_answered", request_id=request_id)
    finally:
        daemon.stop()
    export = subprocess.run(
        [DELTAD, "audit", "export", "--state-dir", str(daemon.state_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert export.returncode == 0, export.stderr
    entries = [json.loads(x) for x in export.stdout.splitlines()]
    votes = [e for e in entries if e["kind"] == "vote"]
    got = [(e["voter"], e["origin"]["message_id"], e["origin"]["authentication"]) for e in votes]
    verdict = f"dmarc=pass header.from={PEOPLE_DOMAIN}"  # DKIM-signed, aligned: DMARC passes
    # The forged and the wrongly signed reply are on record too, each with the mail it was.
    refused = [e for e in entries if e["kind"] == "refused"]
    assert [(e["code"], e["channel"], e["answered_by"]) for e in refused] == [
        ("unauthenticated", "email", ALICE)
    ], refused  # one entry: the same person's same refusal again is counted, not repeated
    assert refused[0]["origin"]["message_id"] == f"<reply-1@{PEOPLE_DOMAIN}>"
    assert f"{AUTHSERV_ID}; dmarc=fail" in refused[0]["origin"]["authentication"]
    assert got == [
        ("alice", f"<reply-3@{PEOPLE_DOMAIN}>", verdict),
        ("bob", f"<reply-4@{PEOPLE_DOMAIN}>", verdict),
    ]
