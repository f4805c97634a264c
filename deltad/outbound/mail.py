"""Mail as the email channel reads and writes it: pure functions of bytes and text.

Untrusted input: a reply is parsed with the standard library's `email` parser under
`policy.default`; only its plain text part is read (HTML is never rendered: a reply without
a plain part is refused); quoted text and a signature are cut off before the answer is read,
and the answer is read by the question's kind with the kind's own parser (`kinds.read_text`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from dataclasses import field as default
from email import policy
from email.message import EmailMessage
from email.parser import BytesParser
from email.utils import formatdate, getaddresses, make_msgid, parseaddr
from typing import TYPE_CHECKING

from deltad.inbox.answer_body import AnswerIn
from deltad.protocol import InteractionRequest, kinds
from deltad.protocol.kinds import kind_of
from deltad.protocol.printable import show_path

if TYPE_CHECKING:  # the channel's side only: the inbox process parses mail without it
    from deltad.outbound.base import Question

# Where a reply's quoted part or signature starts: everything from that line on is dropped.
CUT = [
    re.compile(r"^>"),  # quoted text
    re.compile(r"^-- ?$"),  # the signature delimiter (RFC 3676)
    re.compile(r"^On .{0,200}wrote:\s*$"),  # "On <date>, <someone> wrote:"
    re.compile(r"^Le .{0,200}a écrit\s*:\s*$"),
    re.compile(r"^Am .{0,200}schrieb .{0,200}:\s*$"),
    re.compile(r"^-{2,}\s*Original Message\s*-{2,}", re.I),
    re.compile(r"^_{10,}\s*$"),  # Outlook's rule above the quoted mail
    re.compile(r"^From:\s.+"),  # a quoted header block
    re.compile(r"^Sent from my ", re.I),
]
TEXT_MAX = 16 * 1024  # characters of a reply's answer read at most
CONTEXT_MAX = 2000  # characters of each piece of context put in a question mail


class Unreadable(ValueError):
    """The mail cannot be read as an answer (one line, said to the sender)."""


@dataclass(frozen=True)
class Reply:
    """What a reply mail says, before any check."""

    recipients: list[str]  # addresses it was delivered to, the MTA's headers first
    automatic: bool  # an auto-reply (RFC 3834 Auto-Submitted, or a bulk Precedence)
    sender: str  # the From address (forgeable: it only picks among those the token allows)
    text: str | None  # the plain text part, quoted text and signature cut off (None: none)
    message_id: str | None
    authentication: list[str] = default(
        default_factory=list
    )  # Authentication-Results, topmost first


@dataclass(frozen=True)
class Received:
    """One message of the Maildir as the inbox process read it (deltad/outbound/maildir.py),
    relayed to the core: only what deciding on it needs. Nothing here is trusted."""

    message: str  # the file's name in new/ (the reply address's claim names it)
    token: str | None  # the first reply address of ours it was delivered to (None: none)
    sender: str  # the From address, lower case ("" when it has none, or one too long)
    automatic: bool
    text: str | None
    problem: str | None = None  # "unreadable" (not a regular file, too large), "unparsable"
    message_id: str | None = None  # its Message-ID header, for a vote's receipt (unchecked)
    # Its Authentication-Results headers, the topmost first (the MTA's verdict: authres.py).
    authentication: list[str] = default(default_factory=list)


SENDER_MAX = 320  # the protocol's cap (privsep/wire.py): a longer From is no address of ours
MESSAGE_ID_MAX = 998  # a header line's limit (RFC 5322); the protocol's cap too (inbox/ops.py)
AUTH_RESULTS_MAX = 16  # Authentication-Results headers relayed, the topmost (inbox/ops.py)
AUTH_RESULT_MAX = 2048  # characters of each (a longer one is left out)


def received(message: str, data: bytes | None, address: re.Pattern[str]) -> Received:
    """What the core is told of one message (`data` None: it could not be read). `address`
    matches a reply address and captures its token."""
    if data is None:
        return Received(message, None, "", False, None, "unreadable")
    if over_budget(data) is not None:
        return Received(message, None, "", False, None, "unparsable")
    try:
        reply = parse(data)
    except Unreadable:
        return Received(message, None, "", False, None, "unparsable")
    tokens = [m.group(1) for a in reply.recipients if (m := address.fullmatch(a))]
    sender = _utf8(reply.sender) if len(reply.sender) <= SENDER_MAX else ""
    text = _utf8(reply.text) if reply.text is not None else None
    msgid = reply.message_id
    shown = msgid.strip() if msgid is not None else ""
    ok = 0 < len(shown) <= MESSAGE_ID_MAX and shown.isascii() and shown.isprintable()
    token = tokens[0] if tokens else None
    auth = [
        a
        for a in (_utf8(v) for v in reply.authentication[:AUTH_RESULTS_MAX])
        if len(a) <= AUTH_RESULT_MAX and a.isprintable()
    ]
    msgid_ok = shown if ok else None
    return Received(message, token, sender, reply.automatic, text, None, msgid_ok, auth)


# The parse budget, checked on the raw bytes before the standard library's parser sees them:
# its header parser is quadratic on some long headers (CPython issue 136063: a 100 KB `To:`
# took minutes), so the sizes it is given are capped first; maildir.py also parses each
# message in a child with a time limit. RFC 5322 lines are at most 998 characters; a folded
# field of a real reply (a long Cc:) stays within a few KiB.
HEADER_BLOCK_MAX = 64 * 1024
HEADER_FIELD_MAX = 8 * 1024
ADDRESSES_MAX = 100  # in one address field
ADDRESS_FIELDS = frozenset(
    {b"to", b"cc", b"bcc", b"from", b"sender", b"reply-to", b"delivered-to", b"x-original-to"}
)


def over_budget(data: bytes) -> str | None:
    """Why the message is not parsed at all (its header too large, a field too long, too many
    addresses in one field), or None. Linear in the message's size."""
    end = min((i for i in (data.find(b"\r\n\r\n"), data.find(b"\n\n")) if i >= 0), default=-1)
    block = data if end < 0 else data[:end]
    fields: list[bytes] = []
    for line in block.splitlines():
        if line[:1] in (b" ", b"\t") and fields:
            fields[-1] += line  # a folded field goes on
        else:
            fields.append(line)
    for field in fields:
        name = field.partition(b":")[0].strip()
        shown = name[:40].decode("ascii", "replace")
        if len(field) > HEADER_FIELD_MAX:
            return f"its {shown} field is over {HEADER_FIELD_MAX // 1024} KiB"
        if name.lower() in ADDRESS_FIELDS and field.count(b",") + 1 > ADDRESSES_MAX:
            return f"its {shown} field names over {ADDRESSES_MAX} addresses"
    if len(block) > HEADER_BLOCK_MAX:
        return f"its header is over {HEADER_BLOCK_MAX // 1024} KiB"
    return None


def _utf8(text: str) -> str:
    """`text` as JSON can carry it (a header's raw bytes may come back as lone surrogates)."""
    return text.encode("utf-8", "replace").decode("utf-8")


def reply_address(local: str, domain: str) -> re.Pattern[str]:
    """A reply address of ours, its token captured (grants.TOKEN's shape)."""
    return re.compile(rf"{re.escape(local)}\+([0-9a-f]{{36}})@{re.escape(domain)}")


def parse(data: bytes) -> Reply:
    """What a reply says; Unreadable when the standard library's parser gives up on it (its
    header parser raises more than its documented errors on malformed input: found by the
    fuzz test)."""
    try:
        return _parse(data)
    except Exception as e:
        raise Unreadable(f"the message cannot be parsed ({type(e).__name__})") from None


def _parse(data: bytes) -> Reply:
    msg = BytesParser(policy=policy.default).parsebytes(data)
    assert isinstance(msg, EmailMessage)
    # Delivered-To and X-Original-To are the MTA's own record of the envelope recipient.
    headers = ("Delivered-To", "X-Original-To", "To", "Cc")
    recipients = [
        a.lower() for _, a in getaddresses([str(v) for h in headers for v in msg.get_all(h, [])])
    ]
    sender = parseaddr(str(msg.get("From", "")))[1].lower()
    auto = str(msg.get("Auto-Submitted", "no")).strip().lower() != "no" or str(
        msg.get("Precedence", "")
    ).strip().lower() in ("bulk", "junk", "list", "auto_reply")
    auth = [" ".join(str(v).split()) for v in msg.get_all("Authentication-Results", [])]
    return Reply(recipients, auto, sender, body_text(msg), msg.get("Message-ID"), auth)


def body_text(msg: EmailMessage) -> str | None:
    """The plain text part's own words; None without one (HTML is never read)."""
    part = msg.get_body(preferencelist=("plain",))
    if part is None:
        return None
    try:
        content = part.get_content()
    except (LookupError, ValueError):  # an unknown charset, a broken encoding
        return None
    return strip_quoted(str(content)[:TEXT_MAX])


def strip_quoted(text: str) -> str:
    """The reply's own words: up to the first quoted line, attribution or signature."""
    kept: list[str] = []
    for line in text.replace("\r\n", "\n").split("\n"):
        if any(p.match(line.rstrip()) for p in CUT):
            break
        kept.append(line.rstrip())
    return "\n".join(kept).strip()


def answer_of(req: InteractionRequest, text: str) -> AnswerIn:
    """The answer a reply gives, read by the question's kind (text: all of it; any other kind:
    its first line, and for an approval `reject` the lines after it as the reason). Raises
    AnswerRejected (the kind's own words) when it does not fit."""
    if not kind_of(req.input_type).one_line:
        kinds.read_text(req, text)
        return AnswerIn(answer=text)
    lines = [line.strip() for line in text.split("\n") if line.strip()]
    first = lines[0] if lines else ""
    if kind_of(req.input_type).per_call:
        word, colon, _ = first.partition(":")
        if not colon and len(lines) > 1:
            first = f"{word}: {' '.join(lines[1:])}"
        reply = kinds.read_text(req, first)
        return AnswerIn(decisions=reply.decisions)
    reply = kinds.read_text(req, first)
    return AnswerIn(answer=reply.key or reply.value or first)


# -- what goes out ------------------------------------------------------------------------------
def printable(text: str) -> str:
    """Text from a workspace as mail can carry it: a lone surrogate (a JSON `\\ud800`, a name
    that is not UTF-8) shown escaped instead of failing the whole mail."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def message_id(sender: str) -> str:
    """A new Message-ID in the sender's domain."""
    return make_msgid(domain=sender.rpartition("@")[2] or None)


def _message(
    sender: str,
    to: str,
    subject: str,
    text: str,
    msgid: str | None = None,
    thread: tuple[str, ...] = (),
) -> EmailMessage:
    """A mail; `thread`: the Message-IDs of the earlier mails of its conversation, the first
    one first (In-Reply-To names the first: the question's own mail)."""
    msg = EmailMessage(policy=policy.SMTP)
    msg["From"] = sender
    msg["To"] = to
    msg["Subject"] = " ".join(printable(subject).split())[:200]
    msg["Date"] = formatdate(localtime=False)
    msg["Message-ID"] = msgid or message_id(sender)
    ids = [i for i in thread if MESSAGE_ID.fullmatch(i)]  # ours, kept in a grant: checked
    if ids:
        msg["In-Reply-To"] = ids[0]
        msg["References"] = " ".join(ids)
    msg["Auto-Submitted"] = "auto-generated"  # RFC 3834: no auto-reply loops
    msg.set_content(printable(text))
    return msg


MESSAGE_ID = re.compile(r"<[^<>\s@]{1,128}@[^<>\s@]{0,128}>")


def question_mail(
    q: Question,
    sender: str,
    to: str,
    reply_to: str | None,
    links: dict[str, str],
    msgid: str | None = None,
    thread: tuple[str, ...] = (),
) -> EmailMessage:
    """The question, its context and how to answer it. `reply_to` is None for a question
    that must not be answered by mail (a secret); `links` are one-click signed links; a
    reminder or an escalation threads to the mails of the question sent before (`thread`)."""
    r = q.request
    lines = [r.prompt, ""]
    if q.task:
        lines += [f"Task: {q.task[:CONTEXT_MAX]}", ""]
    if r.context is not None and r.context.last_message:
        lines += ["The agent's last message:", r.context.last_message[:CONTEXT_MAX], ""]
    for c in r.calls:
        lines += [f"Tool call {c.action_id}: {c.tool_name} {str(c.arguments)[:CONTEXT_MAX]}"]
    if r.calls:
        lines.append("")
    lines += [f"Expects: {kind_of(r.input_type).expects}."]
    lines += kind_of(r.input_type).hints(r)
    if r.expires_at is not None:
        lines.append(
            f"Deadline: {r.expires_at.isoformat()}; "
            f"then: {for_people(kind_of(r.input_type).after_deadline(r))}."
        )
    lines.append("")
    if reply_to is None:
        lines.append("This question asks for a secret: it is never answered by mail.")
    elif r.calls:
        lines.append("Reply with `approve`, or `reject: why`, as the first line.")
    elif not kind_of(r.input_type).one_line:
        lines.append("Reply to this mail: your reply (above any quoted text) is the answer.")
    else:
        lines.append("Reply with the answer as the first line.")
    for label, url in links.items():
        lines.append(f"{label}: {url}")
    lines += ["", f"Workspace: {show_path(q.workspace)}", f"Request: {r.request_id}"]
    said = {"reminder": "Reminder: ", "escalation": "Escalated: "}.get(q.follow_up or "", "")
    msg = _message(
        sender,
        to,
        f"[deltad] {said}{r.prompt.splitlines()[0] if r.prompt else 'a question'}",
        "\n".join(lines) + "\n",
        msgid,
        thread,
    )
    if reply_to is not None:
        msg["Reply-To"] = reply_to
    return msg


def for_people(after_deadline: str) -> str:
    """What an unanswered question gets at its deadline, in words for people: the kind's
    `TIMEOUT` is what the agent is told."""
    if after_deadline == "TIMEOUT":
        return "the agent is told that nobody answered"
    return after_deadline


def notice_mail(sender: str, to: str, subject: str, line: str) -> EmailMessage:
    """A one-line mail: a refusal."""
    return _message(sender, to, subject, line + "\n")


def closed_mail(
    sender: str,
    to: str,
    line: str,
    prompt: str,
    workspace: str,
    request_id: str,
    thread: tuple[str, ...],
) -> EmailMessage:
    """That a question closed (answered elsewhere, expired): which question, quoted (its
    first line, its workspace), in the thread of the mails that asked it."""
    asked = prompt or f"question {request_id}"
    text = [line, "", "The question:", f"> {prompt}" if prompt else f"> (request {request_id})"]
    text += ["", f"Workspace: {workspace}", f"Request: {request_id}"]
    return _message(sender, to, f"[deltad] Closed: {asked}", "\n".join(text) + "\n", thread=thread)
