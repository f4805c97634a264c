"""The email channel in-process: reply addresses, reading a reply, the Maildir pass and the
answering path, with a real workspace on disk and no network (nothing is sent: what the channel
hands over is taken into the inbox's courier, whose thread is never started, so what would go
out is read from its outbox). The Maildir is read by
the inbox process's reader (deltad/outbound/maildir.py), each message relayed to the channel
through the protocol's own frame and the core's monitor (`mail_reply`), as over the socket."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from email import policy
from email.message import EmailMessage
from email.parser import BytesParser
from pathlib import Path
from typing import Any

import pytest

from deltad import wire
from deltad.core.config import ConfigError, load_config
from deltad.inbox import quorum
from deltad.outbound import mail, senders
from deltad.outbound.base import Closed, Context, Question
from deltad.outbound.config import EmailConfig
from deltad.outbound.courier import Failed
from deltad.outbound.email import EmailChannel
from deltad.outbound.grants import AddressExpired, Grants, Unknown, check
from deltad.outbound.hub import noting
from deltad.outbound.maildir import MaildirReader
from deltad.outbound.outbox import Outbox
from deltad.privsep import monitor
from deltad.protocol import InputType, InteractionRequest, Mailbox, Workspace, followup, utcnow
from deltad.protocol.printable import show_path
from deltad.protocol.replies import AnswerRejected, Decision
from deltad.testing.stub import paused_workspace
from tests.support.outbound import inbox_side

ALICE, BOB, MALLORY = "alice@example.org", "bob@example.org", "mallory@example.org"
MX = "mx.d.example"  # the trusted MTA's authserv-id
SIGNED = f"{MX}; dkim=pass (2048-bit key) header.d=example.org header.s=s1"


# -- reply addresses ------------------------------------------------------------------------
def test_a_reply_address_is_signed_expiring_and_single_use(tmp_path: Path) -> None:
    g = Grants(tmp_path)
    now = time.time()
    grant, tok = g.issue("r1", "/ws", ALICE, now + 60)
    assert len(tok) == 36 and tok == tok.lower()
    assert g.verify(tok, now) == grant
    assert g.verify(tok.upper(), now) == grant  # an MTA that folds case changes nothing
    forged = tok[:-1] + ("0" if tok[-1] != "0" else "1")
    with pytest.raises(Unknown):
        g.verify(forged, now)
    with pytest.raises(Unknown):  # another grant's id with this one's MAC
        check(g.key, g.issue("r2", "/ws", ALICE, now + 60)[0], tok, now)
    with pytest.raises(AddressExpired):
        g.verify(tok, now + 61)
    assert g.claim(grant, "m1") and g.claim(grant, "m1")  # the same message again: a retry
    assert not g.claim(grant, "m2")  # another message: a replay
    g.release(grant)
    assert g.claim(grant, "m2")
    # Another key (another daemon's state dir) knows none of these addresses.
    with pytest.raises(Unknown):
        check(Grants(tmp_path / "other").key, grant, tok, now)


def test_grants_are_pruned_well_after_they_expire(tmp_path: Path) -> None:
    g = Grants(tmp_path)
    grant, _ = g.issue("r1", "/ws", ALICE, 1000.0)
    g.claim(grant, "m1")
    assert g.prune(1000.0 + 10) == 0  # kept: a late reply is told "expired"
    assert g.prune(1000.0 + 31 * 86400) == 1
    for d in ("grants", "used", "questions"):
        assert list((tmp_path / d).iterdir()) == []


# -- reading a reply ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("yes\n\nOn Mon, 1 Jan 2030, deltad wrote:\n> Deploy?\n", "yes"),
        ("yes\n-- \nAlice\n", "yes"),
        ("yes\r\n> quoted\r\n", "yes"),
        ("one\ntwo\n\n-----Original Message-----\nFrom: deltad\n", "one\ntwo"),
        ("yes\n\nSent from my phone\n", "yes"),
        ("  \n\nyes  \n", "yes"),
    ],
)  # fmt: skip
def test_quoted_text_and_signatures_are_cut(text: str, answer: str) -> None:
    assert mail.strip_quoted(text) == answer


def _req(input_type: InputType, **kw: Any) -> InteractionRequest:
    return InteractionRequest(prompt="q?", run_id="r", action_id="a", input_type=input_type, **kw)


def test_an_answer_is_read_by_its_kind() -> None:
    choice = _req(
        InputType.CHOICE, options=[{"key": "S", "label": "stable"}, {"key": "B", "label": "beta"}]
    )
    assert mail.answer_of(choice, "b").answer == "B"
    assert mail.answer_of(choice, "Beta\nthanks").answer == "B"
    assert mail.answer_of(_req(InputType.YES_NO), "yes").answer == "yes"
    assert mail.answer_of(_req(InputType.TEXT), "two\nlines").answer == "two\nlines"
    assert mail.answer_of(_req(InputType.NUMBER, maximum=50), "42").answer == "42"
    assert mail.answer_of(_req(InputType.DATE), "2030-01-02").answer == "2030-01-02"
    calls = [{"action_id": "c1", "tool_name": "deploy"}, {"action_id": "c2", "tool_name": "x"}]
    approval = _req(InputType.APPROVAL, calls=calls)
    rejected = mail.answer_of(approval, "reject\nnot on a Friday")
    assert rejected.decisions is not None
    assert [(d.decision, d.reason) for d in rejected.decisions] == [
        (Decision.REJECT, "not on a Friday"),
        (Decision.REJECT, "not on a Friday"),
    ]
    assert {d.decision for d in mail.answer_of(approval, "approve").decisions or []} == {
        Decision.APPROVE
    }
    for req, text in [
        (choice, "gamma"),
        (_req(InputType.NUMBER, maximum=50), "51"),
        (_req(InputType.DATE), "tomorrow"),
        (approval, "maybe"),
        (_req(InputType.TEXT), ""),
    ]:
        with pytest.raises(AnswerRejected):
            mail.answer_of(req, text)


def test_only_the_plain_part_is_read_never_html() -> None:
    msg = EmailMessage()
    msg["From"], msg["To"] = ALICE, "reply+x@d.example"
    msg.set_content("<b>yes</b>", subtype="html")
    assert mail.parse(msg.as_bytes()).text is None
    msg = EmailMessage()
    msg["From"], msg["To"] = f"Alice <{ALICE.upper()}>", "reply+x@d.example"
    msg.set_content("yes")
    msg.add_alternative("<p>no</p>", subtype="html")
    reply = mail.parse(msg.as_bytes())
    assert (reply.sender, reply.text) == (ALICE, "yes")


# -- the channel ----------------------------------------------------------------------------
def _channel(tmp: Path, audit: Path | None = None, **over: Any) -> EmailChannel:
    box = tmp / "Maildir"
    for sub in ("new", "cur", "tmp"):
        (box / sub).mkdir(parents=True, exist_ok=True)
    config = EmailConfig.model_validate(
        {
            "from_address": "deltad@d.example",
            "reply_domain": "d.example",
            "maildir": str(box),
            "smtp": {"host": "127.0.0.1", "port": 9, "security": "none"},
            "people": {ALICE: "alice", BOB: {"name": "bob", "groups": ["ops"]}},
            **over,
        }
    )
    inbox = inbox_side(tmp, senders.email_target(config), lambda d: Failed("never sent here"))
    ctx = Context(
        tmp / "state",
        quorum.answer_or_vote,
        inbox.hand,
        page=lambda r: f"https://inbox/#request={r}",
        refused=noting(audit, "email"),
    )
    return EmailChannel(config, ctx)


def _outgoing(ch: EmailChannel) -> list[tuple[str, str, EmailMessage]]:
    found, _ = Outbox(ch.ctx.state_dir.parent / "inbox", ch.name).load()
    out = []
    for d in found:
        msg = BytesParser(policy=policy.default).parsebytes(d.body.encode())
        assert isinstance(msg, EmailMessage)
        out.append((d.url, d.event, msg))
    return out


def _ask(tmp: Path, ch: EmailChannel, **question: Any) -> tuple[Path, str]:
    ws = tmp / "ws"
    paused_workspace(ws, prompt="Deploy?", **question)
    req = Mailbox(Workspace.at(ws)).read_request()
    assert req is not None
    ch.send(Question(ws, req, "the task"))
    return ws, req.request_id


def _deliver(
    ch: EmailChannel,
    name: str,
    to: str,
    sender: str,
    text: str,
    auto: bool = False,
    msgid: str | None = None,
    auth: tuple[str, ...] = (),
) -> None:
    msg = EmailMessage()
    for a in auth:  # as an MTA adds them: the topmost first
        msg["Authentication-Results"] = a
    if msgid is not None:
        msg["Message-ID"] = msgid
    if auto:
        msg["Auto-Submitted"] = "auto-replied"
    msg["From"], msg["To"], msg["Subject"] = sender, to, "Re: Deploy?"
    msg["Delivered-To"] = to
    msg.set_content(text)
    (ch.config.maildir / "new" / name).write_bytes(msg.as_bytes())


def _take(ch: EmailChannel) -> int:
    """One pass of the inbox's reader; each message relayed as the core takes it."""

    def relay(got: mail.Received) -> bool:
        sent = wire.encode(wire.Call(op="mail_reply", id=1, args=asdict(got)))
        call = monitor.decode(sent[wire.HEADER.size :])
        assert not isinstance(call, str), call
        frame = monitor.reply_to(None, ch.receive, call)[wire.HEADER.size :]
        reply = wire.FROM_CORE.validate_json(frame)
        assert isinstance(reply, wire.Reply)
        return reply.error is None or reply.error.http != 503

    c = ch.config
    reader = MaildirReader(
        c.maildir,
        c.reply_local,
        c.reply_domain,
        relay,
        c.max_message_bytes,
        c.max_per_pass,
        within=in_process,
    )
    return reader.take()


def in_process(name: str, data: bytes | None, address: Any, seconds: float) -> mail.Received:
    """The reader's parse without its child (a unit test starts no process)."""
    return mail.received(name, data, address)


def _refusals(ch: EmailChannel) -> list[str]:
    return [m.get_content().strip() for _, kind, m in _outgoing(ch) if kind == "notice"]


def test_a_reply_answers_through_the_answering_path(tmp_path: Path) -> None:
    ch = _channel(tmp_path)
    ws, request_id = _ask(tmp_path, ch, input_type="yes_no", respondents=["alice"])
    [(to, kind, question)] = _outgoing(ch)  # bob is no respondent: not asked
    assert (to, kind) == (ALICE, "question")
    assert "https://inbox/#request=" in question.get_content()
    reply_to = str(question["Reply-To"])
    _deliver(ch, "1.m1", reply_to, ALICE, "yes\n\n> Deploy?\n")
    assert _take(ch) == 1
    doc = json.loads((ws / ".delta" / "interaction" / "response.json").read_text())
    seal = doc.pop("seal")  # the core's signature (protocol/seal.py): the question is gated
    assert doc == {
        "request_id": request_id,
        "answer": "yes",
        "answered_by": ALICE,
        "channel": "email",
    }
    assert set(seal) == {"key", "sig"}
    assert os.listdir(ch.config.maildir / "new") == []
    assert os.listdir(ch.config.maildir / "cur") == ["1.m1:2,S"]
    assert _refusals(ch) == []

    # A crash before the move: the same message read again answers nothing and says nothing,
    # whether the answer still waits or its run went on meanwhile (the question is gone).
    os.rename(ch.config.maildir / "cur" / "1.m1:2,S", ch.config.maildir / "new" / "1.m1")
    assert _take(ch) == 1 and _refusals(ch) == []
    box = ws / ".delta" / "interaction"
    kept = {p.name: p.read_bytes() for p in box.iterdir() if p.is_file()}
    for name in ("request.json", "response.json"):
        (box / name).unlink()  # consumed by the resumed run
    os.rename(ch.config.maildir / "cur" / "1.m1:2,S", ch.config.maildir / "new" / "1.m1")
    assert _take(ch) == 1 and _refusals(ch) == []
    for name, data in kept.items():
        (box / name).write_bytes(data)
    # Another message through the same address: a replay, refused to alice.
    _deliver(ch, "2.m2", reply_to, ALICE, "no")
    _take(ch)
    assert _refusals(ch) == ["Not taken: this reply address was already used; nothing changed"]
    assert (
        json.loads((ws / ".delta" / "interaction" / "response.json").read_text())["answer"] == "yes"
    )


def test_four_eyes_by_mail_each_reply_is_a_vote_with_its_receipt(tmp_path: Path) -> None:
    """A reply that leaves the question waiting is a vote ("voted", not "answered"), and each
    vote is one receipt naming the mail (its Message-ID) and the person it counts for."""
    from dataclasses import replace

    from deltad.inbox import audit
    from deltad.outbound.hub import voting

    ch = _channel(tmp_path, authserv_id=MX)
    log = tmp_path / "audit.jsonl"
    ch.ctx = replace(ch.ctx, answer=voting(log))
    ws, request_id = _ask(tmp_path, ch, input_type="yes_no", approvals_required=2)
    to = {m["To"]: str(m["Reply-To"]) for _, kind, m in _outgoing(ch) if kind == "question"}
    results: list[dict[str, str]] = []
    take = ch.receive
    ch.receive = lambda got: results.append(take(got)) or results[-1]  # type: ignore[method-assign]
    for n, who in enumerate((ALICE, BOB), 1):
        _deliver(ch, f"{n}.m", to[who], who, "yes", msgid=f"<{n}@m.x>", auth=(SIGNED,))
        assert _take(ch) == 1
    assert [r["result"] for r in results] == ["voted", "answered"]
    doc = json.loads((ws / ".delta" / "interaction" / "response.json").read_text())
    assert [v["by"] for v in doc["approvals"]] == ["alice", "bob"]
    entries = [json.loads(x) for x in audit.read_lines(log)]
    got = [(e["kind"], e["channel"], e["voter"], e["origin"]) for e in entries]
    receipt = {"authentication": "dkim=pass header.d=example.org"}  # the MTA's verdict
    assert got == [
        (
            "vote",
            "email",
            "alice",
            {**receipt, "from": ALICE, "message": "1.m", "message_id": "<1@m.x>"},
        ),
        (
            "vote",
            "email",
            "bob",
            {**receipt, "from": BOB, "message": "2.m", "message_id": "<2@m.x>"},
        ),
    ]
    assert [e["request_id"] for e in entries] == [request_id] * 2


def test_refused_replies_change_nothing(tmp_path: Path) -> None:
    ch = _channel(tmp_path)
    ws, _ = _ask(tmp_path, ch, input_type="yes_no", respondents=["alice"])
    reply_to = str(_outgoing(ch)[0][2]["Reply-To"])
    _deliver(ch, "1", reply_to, MALLORY, "yes")  # From is not the address it was given to
    _deliver(ch, "2", reply_to, ALICE, "perhaps")  # does not fit: alice may reply again
    _deliver(ch, "3", "reply+" + "0" * 36 + "@d.example", ALICE, "yes")  # never given out
    _deliver(ch, "4", "someone@d.example", ALICE, "yes")  # no reply address at all
    _deliver(ch, "5", reply_to, ALICE, "I am out of office", auto=True)  # never answered
    assert _take(ch) == 5
    box = ws / ".delta" / "interaction"
    assert not (box / "response.json").exists() and not (box / "response.txt").exists()
    refusals = _refusals(ch)
    assert len(refusals) == 2  # to alice only: unknown addresses are only logged
    assert f"only {ALICE} may answer through this reply address, not {MALLORY}" in refusals[0]
    assert "perhaps" in refusals[1] and "reply again" in refusals[1]
    assert all(to == ALICE for to, kind, _ in _outgoing(ch) if kind == "notice")
    _deliver(ch, "6", reply_to, ALICE, "no")
    _take(ch)
    assert json.loads((box / "response.json").read_text())["answer"] == "no"


def test_a_respondent_removed_from_the_config_is_refused(tmp_path: Path) -> None:
    ch = _channel(tmp_path)
    ws, _ = _ask(tmp_path, ch, input_type="yes_no", respondents=["group:ops"])
    [(to, _, question)] = _outgoing(ch)
    assert to == BOB
    ch.config.people.pop(BOB)
    _deliver(ch, "1", str(question["Reply-To"]), BOB, "yes")
    _take(ch)
    assert f"{BOB} is not configured" in _refusals(ch)[0]
    assert not (ws / ".delta" / "interaction" / "response.json").exists()


def test_a_secret_is_never_asked_or_answered_by_mail(tmp_path: Path) -> None:
    ch = _channel(tmp_path)
    _ask(tmp_path, ch, input_type="password")
    outgoing = _outgoing(ch)
    assert len(outgoing) == 2
    for _, _, msg in outgoing:
        assert msg["Reply-To"] is None
        assert "never answered by mail" in msg.get_content()
    assert list((tmp_path / "state" / "grants").iterdir()) == []


def test_a_question_with_odd_text_is_still_mailed(tmp_path: Path) -> None:
    assert mail.printable("a\ud800b") == "a\\ud800b"
    ch = _channel(tmp_path)
    ws = tmp_path / os.fsdecode(b"ws-\xff")
    paused_workspace(ws, prompt="Line one\r\nBcc: mallory@example.org\nfine?")
    req = Mailbox(Workspace.at(ws)).read_request()
    assert req is not None
    ch.send(Question(ws, req))
    for _, _, msg in _outgoing(ch):
        assert str(msg["Subject"]) == "[deltad] Line one" and msg["Bcc"] is None
        assert f"Workspace: {show_path(ws)}\r\n" in msg.get_content()
    [reply_to] = {str(m["Reply-To"]) for to, _, m in _outgoing(ch) if to == ALICE}
    _deliver(ch, "1", reply_to, ALICE, "fine, thanks")
    _take(ch)
    doc = json.loads((ws / ".delta" / "interaction" / "response.json").read_text())
    assert doc["answer"] == "fine, thanks" and _refusals(ch) == []


def test_the_maildir_is_read_with_care(tmp_path: Path) -> None:
    ch = _channel(tmp_path, max_message_bytes=1024, max_per_pass=3)
    new = ch.config.maildir / "new"
    (tmp_path / "target").write_text("x")
    os.symlink(tmp_path / "target", new / "1.link")
    (new / "2.big").write_bytes(b"x" * 2048)
    os.mkfifo(new / "3.fifo")
    (new / "4.later").write_bytes(b"From: a@b.c\n\nhi\n")
    assert _take(ch) == 3  # bounded
    assert sorted(os.listdir(new)) == ["4.later"]
    assert (tmp_path / "target").read_text() == "x"  # never followed
    assert _take(ch) == 1 and os.listdir(new) == []
    assert sorted(os.listdir(ch.config.maildir / "cur")) == [
        "1.link:2,S",
        "2.big:2,S",
        "3.fifo:2,S",
        "4.later:2,S",
    ]


def test_the_people_are_told_when_a_question_closes(tmp_path: Path) -> None:
    ch = _channel(tmp_path)
    ws, request_id = _ask(tmp_path, ch, input_type="yes_no")
    assert len(_outgoing(ch)) == 2
    ch.withdraw(Closed(ws, request_id, "answered"))
    notices = [(to, m.get_content()) for to, kind, m in _outgoing(ch) if kind == "notice"]
    assert sorted(to for to, _ in notices) == [ALICE, BOB]
    assert all("answered elsewhere" in text for _, text in notices)
    ch.withdraw(Closed(ws, request_id, "answered", "carol", "http"))
    told = [m.get_content() for _, k, m in _outgoing(ch) if k == "notice"]
    assert sum("answered by carol (http)." in text for text in told) == 2
    ch.withdraw(Closed(ws, request_id, "expired"))
    assert sum("expired" in m.get_content() for _, k, m in _outgoing(ch) if k == "notice") == 2


def test_a_closed_notice_quotes_its_question_and_threads_to_the_mails_that_asked_it(
    tmp_path: Path,
) -> None:
    ch = _channel(tmp_path)
    ws, request_id = _ask(tmp_path, ch, input_type="yes_no")  # to alice and bob
    req = Mailbox(Workspace.at(ws)).read_request()
    assert req is not None
    ch.send(Question(ws, req, "the task", follow_up="reminder"))  # each is asked again
    asked = _outgoing(ch)
    first = {to: str(m["Message-ID"]) for to, _, m in asked[:2]}
    for to, _, m in asked[2:]:  # a reminder is in the thread of the question's mail
        assert str(m["Subject"]) == "[deltad] Reminder: Deploy?"
        assert (str(m["In-Reply-To"]), str(m["References"])) == (first[to], first[to])
    # alice answers the reminder by mail: she is told nothing more; bob once, not per mail
    [again] = [m for to, _, m in asked[2:] if to == ALICE]
    _deliver(ch, "1", str(again["Reply-To"]), ALICE, "yes")
    assert _take(ch) == 1
    ch.withdraw(Closed(ws, request_id, "answered", "alice@example.org", "email"))
    [(to, notice)] = [(to, m) for to, k, m in _outgoing(ch) if k == "notice"]
    assert to == BOB
    assert str(notice["Subject"]) == "[deltad] Closed: Deploy?"
    assert str(notice["In-Reply-To"]) == first[BOB]
    assert str(notice["References"]).split() == [
        str(m["Message-ID"]) for t, _, m in asked if t == BOB
    ]
    text = notice.get_content()
    assert f"answered by {ALICE} by email" in text and "> Deploy?" in text
    assert f"Workspace: {show_path(ws)}" in text and f"Request: {request_id}" in text


# -- configuration --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("email", "message"),
    [
        ({"colour": "red"}, "channels.email.colour: unknown key"),
        ({"smtp": {"security": "none", "username": "u", "password": {"secret_env": "P"}}},
         "password in clear"),
        ({"people": {"not-an-address": "x"}}, "is not a mail address"),
        ({"reply_local": "Reply+"}, "reply_local"),
    ],
)  # fmt: skip
def test_a_bad_channels_key_is_one_line(
    tmp_path: Path, email: dict[str, Any], message: str
) -> None:
    good = {"from_address": "d@d.example", "reply_domain": "d.example", "maildir": "/m"}
    path = tmp_path / "deltad.yaml"
    path.write_text(
        json.dumps({"roots": [str(tmp_path)], "channels": {"email": {**good, **email}}})
    )
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert message in str(e.value) and "\n" not in str(e.value)
    path.write_text(json.dumps({"roots": [str(tmp_path)], "channels": {"email": good}}))
    assert load_config(path).channels is not None


def test_the_documented_channels_example_is_valid() -> None:
    """config/deltad.yaml's commented `channels:` block, uncommented, is a valid section."""
    import yaml

    from deltad.outbound.config import ChannelsConfig

    text = (Path(__file__).resolve().parents[2] / "config" / "deltad.yaml").read_text()
    block = text[text.index("# channels:\n") :].split("\n\n")[0]
    doc = yaml.safe_load("\n".join(line.removeprefix("# ") for line in block.splitlines()))
    email = ChannelsConfig.model_validate(doc["channels"]).email
    assert email is not None and email.person("Bob@example.org") is not None


def test_a_message_that_trips_a_bug_is_set_aside_not_read_forever(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ch = _channel(tmp_path)

    def bug(got: mail.Received) -> str:
        raise RuntimeError("a bug")

    monkeypatch.setattr(ch, "_answer", bug)
    _deliver(ch, "1", "reply+x@d.example", ALICE, "yes")
    assert _take(ch) == 1
    assert os.listdir(ch.config.maildir / "cur") == ["1:2,S"]
    assert _take(ch) == 0


def test_a_mail_the_parser_gives_up_on_is_refused_as_unreadable(tmp_path: Path) -> None:
    ch = _channel(tmp_path)
    (ch.config.maildir / "new" / "1").write_bytes(b"To: .:\r\nFrom: .:\r\n\r\nyes\r\n")
    assert _take(ch) == 1
    assert os.listdir(ch.config.maildir / "cur") == ["1:2,S"] and _refusals(ch) == []


def test_a_reminder_mails_again_and_an_escalation_mails_whom_it_adds_who_may_answer(
    tmp_path: Path,
) -> None:
    ch = _channel(tmp_path)
    ws, request_id = _ask(tmp_path, ch, input_type="yes_no", respondents=["alice"])
    req = Mailbox(Workspace.at(ws)).read_request()
    assert req is not None
    ch.send(Question(ws, req, "the task", follow_up="reminder"))
    subjects = [(to, str(m["Subject"])) for to, _, m in _outgoing(ch)]
    assert sorted(subjects) == [(ALICE, "[deltad] Deploy?"), (ALICE, "[deltad] Reminder: Deploy?")]
    # The daemon escalates to bob: its record beside the question, then the channel is told.
    rec = followup.Record(
        request_id=request_id,
        escalated=followup.Escalation(at=utcnow(), to=["bob"]),
    )
    (ws / ".delta" / "interaction" / followup.FILE).write_text(rec.model_dump_json())
    ch.send(Question(ws, req, "the task", follow_up="escalation", only=("bob",)))
    [(to, _, escalated)] = [x for x in _outgoing(ch) if "Escalated" in str(x[2]["Subject"])]
    assert to == BOB
    _deliver(ch, "1.m1", str(escalated["Reply-To"]), BOB, "yes")
    assert _take(ch) == 1 and _refusals(ch) == []
    doc = json.loads((ws / ".delta" / "interaction" / "response.json").read_text())
    assert (doc["answer"], doc["answered_by"]) == ("yes", BOB)


# -- the inbox's side: what it reads and relays (deltad/outbound/maildir.py) ----------------------
def test_only_what_the_core_needs_is_relayed(monkeypatch: pytest.MonkeyPatch) -> None:
    address = mail.reply_address("reply", "d.example")
    tok = "ab" * 18
    msg = EmailMessage()
    msg["From"], msg["To"] = f"Alice <{ALICE.upper()}>", "team@d.example"
    msg["Delivered-To"] = f"reply+{tok}@d.example"
    msg["Auto-Submitted"] = "auto-replied"
    msg.set_content("yes\n\n> quoted\n")
    got = mail.received("1.m1", msg.as_bytes(), address)
    assert got == mail.Received("1.m1", tok, ALICE, True, "yes")
    assert mail.received("2", None, address).problem == "unreadable"
    # The standard library's parser giving up (which input makes it raise differs between
    # Python versions: 3.11's raises on an empty group "To: .:", 3.13's parses it).
    with monkeypatch.context() as m:
        m.setattr(mail, "_parse", lambda data: 1 / 0)
        assert mail.received("3", b"To: .:\r\n\r\nyes\r\n", address).problem == "unparsable"
    del msg["From"]
    msg["From"] = "x" * 400 + "@example.org"  # no address of anyone's: relayed as none
    assert mail.received("4", msg.as_bytes(), address).sender == ""


def test_mail_the_core_cannot_take_yet_stays_in_new(tmp_path: Path) -> None:
    ch = _channel(tmp_path)
    new, cur = ch.config.maildir / "new", ch.config.maildir / "cur"
    _deliver(ch, "1", "reply+x@d.example", ALICE, "yes")
    _deliver(ch, "2", "reply+x@d.example", ALICE, "no")
    asked: list[str] = []

    def not_now(got: mail.Received) -> bool:
        asked.append(got.message)
        return False  # the core is starting (503): nothing moves, the pass ends

    reader = MaildirReader(
        ch.config.maildir, "reply", "d.example", not_now, 1 << 20, within=in_process
    )
    assert reader.take() == 0 and asked == ["1"]
    assert sorted(os.listdir(new)) == ["1", "2"] and os.listdir(cur) == []
    # A name the protocol cannot carry is set aside unread; the rest goes on.
    (new / "0\nname").write_bytes(b"From: a@b.c\n\nhi\n")
    assert _take(ch) == 3
    assert sorted(os.listdir(cur)) == ["0\nname:2,S", "1:2,S", "2:2,S"]


# -- the parse budget: one message never holds back the ones after it ---------------------------
def CC(n: int, sep: bytes = b",") -> bytes:
    return sep.join(b"p%d@q.r" % i for i in range(n))


DOTTED = b"To: a" + b"." * 100_000 + b"@b.c\r\nFrom: x@y.z\r\nSubject: s\r\n\r\nyes\r\n"


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"From: a@b.c\r\nTo: d@e.f\r\n\r\nyes\r\n", None),
        (DOTTED, "its To field is over 8 KiB"),
        (b"X-A: a\r\n" * 10_000 + b"\r\nbody", "its header is over 64 KiB"),
        (
            b"Cc: " + b",".join(b"p%d@q.r" % i for i in range(101)) + b"\n\nb",
            "its Cc field names over 100 addresses",
        ),
        (b"Cc: " + b",".join(b"p%d@q.r" % i for i in range(100)) + b"\n\nb", None),
        (
            b"To: a@b.c,\r\n" + b"".join(b" p%d@q.r,\r\n" % i for i in range(150)) + b"\r\nb",
            "its To field names over 100 addresses",
        ),
        (b"Subject: " + b"s" * 20_000 + b"\r\n\r\n", "its Subject field is over 8 KiB"),
        (b"no header end at all", None),
    ],
)
def test_what_is_never_parsed(data: bytes, why: str | None) -> None:
    assert mail.over_budget(data) == why


def test_a_message_over_budget_is_set_aside_and_the_next_reply_is_read(tmp_path: Path) -> None:
    ch = _channel(tmp_path)
    ws, request_id = _ask(tmp_path, ch, input_type="yes_no", respondents=["alice"])
    [(_, _, question)] = _outgoing(ch)
    (ch.config.maildir / "new" / "0.evil").write_bytes(DOTTED)
    _deliver(ch, "1.m1", str(question["Reply-To"]), ALICE, "yes\n")
    assert _take(ch) == 2
    assert sorted(os.listdir(ch.config.maildir / "cur")) == ["0.evil:2,S", "1.m1:2,S"]
    doc = json.loads((ws / ".delta" / "interaction" / "response.json").read_text())
    assert (doc["request_id"], doc["answer"]) == (request_id, "yes")


@pytest.mark.spawns
def test_a_parse_that_does_not_end_is_stopped_and_said() -> None:
    from deltad.outbound.maildir import received_within

    def forever(name: str, data: bytes | None, address: Any) -> mail.Received:
        while True:
            pass

    address = mail.reply_address("deltad", "example.org")
    assert received_within("m", b"x", address, 0.2, forever) == "parsing took over 0.2 s"
    got = received_within("m", b"From: a@b.c\r\n\r\nyes\r\n", address, 30)
    assert isinstance(got, mail.Received) and (got.sender, got.text) == ("a@b.c", "yes")


def test_an_approval_by_mail_counts_only_with_the_trusted_mtas_aligned_pass(
    tmp_path: Path,
) -> None:
    """Under the default (`authentication: approvals`) an approval is refused as
    `unauthenticated` (nothing changes, alice is told why) unless the topmost
    Authentication-Results of the configured authserv-id hold a DKIM pass aligned with the
    From: not without one, not with a forged pass below the MTA's own, not with a pass by
    another id, not with a pass for another domain. A plain answer needs none."""
    audit = tmp_path / "audit.jsonl"
    ch = _channel(tmp_path, audit=audit, authserv_id=MX)
    calls = [{"action_id": "c1", "tool_name": "deploy"}]
    ws, _ = _ask(tmp_path, ch, input_type="approval", calls=calls)
    [to] = [str(m["Reply-To"]) for _, kind, m in _outgoing(ch) if m["To"] == ALICE]
    forged = (
        (),
        (f"{MX}; none", SIGNED),  # the sender's own header below the MTA's
        ("other.example; dkim=pass header.d=example.org",),
        (f"{MX}; dkim=pass header.d=evil.example",),
        (f"{MX}; dkim=fail header.d=example.org",),
    )
    for n, auth in enumerate(forged):
        _deliver(ch, f"{n}.m", to, ALICE, "approve", auth=auth)
        assert _take(ch) == 1
        assert not (ws / ".delta" / "interaction" / "response.json").exists()
    refusals = [m.get_content() for _, kind, m in _outgoing(ch) if kind == "notice"]
    assert len(refusals) == len(forged)
    assert all("not authenticated by mx.d.example" in r for r in refusals), refusals
    assert "dkim=pass header.d=evil.example" in refusals[3]
    # On record: the refusal, whose mail it was, and what its headers said (bounded: the same
    # person's same refusal of one question is one entry, the rest counted as suppressed).
    [entry] = [e for e in map(json.loads, audit.read_text().splitlines()) if e["kind"] == "refused"]
    assert (entry["code"], entry["channel"], entry["answered_by"]) == (
        "unauthenticated",
        "email",
        ALICE,
    )
    assert entry["origin"]["from"] == ALICE and entry["origin"]["message"] == "0.m"
    _deliver(ch, "ok.m", to, ALICE, "approve", auth=(SIGNED, "other.example; none"))
    assert _take(ch) == 1
    doc = json.loads((ws / ".delta" / "interaction" / "response.json").read_text())
    assert [d["decision"] for d in doc["decisions"]] == ["approve"]


@pytest.mark.parametrize(
    ("over", "taken"),
    [
        ({}, True),  # approvals only (the default): a plain answer needs no pass
        ({"authentication": "required", "authserv_id": MX}, False),
        ({"authentication": "off"}, True),
    ],
)
def test_which_replies_need_authentication_is_the_channels_choice(
    tmp_path: Path, over: dict[str, str], taken: bool
) -> None:
    ch = _channel(tmp_path, **over)
    ws, _ = _ask(tmp_path, ch, input_type="text")
    [to] = [str(m["Reply-To"]) for _, kind, m in _outgoing(ch) if m["To"] == ALICE]
    _deliver(ch, "1.m", to, ALICE, "forty-two")
    assert _take(ch) == 1
    assert (ws / ".delta" / "interaction" / "response.json").exists() is taken


def test_an_approval_is_refused_when_no_authserv_id_is_configured(tmp_path: Path) -> None:
    """Fail closed: the default asks approvals to be authenticated; without the MTA's id
    nothing can say they are."""
    ch = _channel(tmp_path)
    ws, _ = _ask(tmp_path, ch, input_type="approval", calls=[{"action_id": "c1", "tool_name": "x"}])
    [to] = [str(m["Reply-To"]) for _, kind, m in _outgoing(ch) if m["To"] == ALICE]
    _deliver(ch, "1.m", to, ALICE, "approve", auth=(SIGNED,))
    assert _take(ch) == 1
    assert not (ws / ".delta" / "interaction" / "response.json").exists()
    [notice] = [m.get_content() for _, kind, m in _outgoing(ch) if kind == "notice"]
    assert "email.authserv_id is not set" in notice
