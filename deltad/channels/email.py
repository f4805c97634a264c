"""The email channel: a question goes out as mail (SMTP: STARTTLS, TLS or plain, with a login
or without); a reply, delivered by the site's MTA into a Maildir, is the answer.

Who may answer. The reply address is the authority: a grant (deltad/channels/grants.py) bound
to the question's request id, its workspace and the one address the mail went to, signed,
expiring and single-use. The From header is only compared with that address (it can be
forged; the reply address is the secret), then the person it names must still be allowed to
answer the question (`respondents`). A refused reply changes nothing and gets a one-line mail
saying why, sent to the address the reply address was given to (never to a From that may be
forged); a reply to no reply address of ours is only logged.

Reading the Maildir. Each pass takes at most `max_per_pass` messages from `new/`, each opened
without following a symlink, a regular file only, at most `max_message_bytes`; a message is
moved to `cur/` (atomically, by rename) only after it was dealt with: a crash re-reads it, and
its claim on the reply address (made durably before the answer is written, naming the
message) tells the second reading it already answered. So a crash never answers twice and
never loses a reply.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import threading
import time
from pathlib import Path

import structlog

from deltad.api.outbox import Delivery
from deltad.inbox import (
    AlreadyAnswered,
    Answerer,
    AnswerWaiting,
    Misfit,
    NotPending,
    SubmitError,
    TooLarge,
)
from deltad.inbox.respondents import may_answer, refusal
from deltad.protocol import InputType, ProtocolError, Workspace, followup
from deltad.protocol.replies import AnswerRejected

from . import mail, senders
from .base import Channel, Closed, Context, Question
from .config import EmailConfig
from .courier import Courier, Failed, Handed, Send
from .grants import AddressExpired, Grant, Grants, Refused, Unknown, check

log = structlog.get_logger("deltad.channels.email")
PRUNE_EVERY = 3600.0  # seconds between prunes of expired grants
ONE_CLICK = (InputType.CHOICE, InputType.YES_NO, InputType.CONFIRMATION, InputType.APPROVAL)


class Refusal(Exception):
    """A reply that does not answer: one line for the person, a code for the log."""

    def __init__(self, code: str, line: str, grant: Grant | None = None) -> None:
        super().__init__(line)
        self.code, self.grant = code, grant


class EmailChannel(Channel):
    name = "email"

    def __init__(self, config: EmailConfig, ctx: Context) -> None:
        self.config, self.ctx = config, ctx
        ctx.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.grants = Grants(ctx.state_dir)
        # Mail is sent by the inbox process (unprivileged) from what is handed to it; only
        # without one (a channel on its own, in tests) does this process send it itself,
        # with the same sender (deltad/channels/senders.py).
        self._send: Send | None = None
        self.courier: Courier | Handed
        if ctx.hand is not None:
            self.courier = Handed(self.name, ctx.hand)
        else:
            self._send = senders.smtp_sender(senders.email_target(config, self.name))
            self.courier = Courier(self.name, ctx.state_dir, config.outbox, self._smtp, ctx.sends)
        self.address = re.compile(
            rf"{re.escape(config.reply_local)}\+([0-9a-f]{{36}})@{re.escape(config.reply_domain)}"
        )
        self._stopping = threading.Event()
        self._unreadable: str | None = None
        self._reader = threading.Thread(target=self._read_loop, name="deltad-email-in", daemon=True)

    # -- the interface ----------------------------------------------------------------------
    def start(self) -> None:
        self.courier.start()
        self._reader.start()

    def stop(self) -> None:
        self._stopping.set()
        self._reader.join(5)
        self.courier.stop()

    def recipients(self, respondents: list[str]) -> list[str]:
        """The configured addresses allowed to answer a question naming `respondents`."""
        out = []
        for address in sorted(self.config.people):
            p = self.config.person(address)
            if p is not None and may_answer(respondents, Answerer(p.name, tuple(p.groups))):
                out.append(address)
        return out

    def send(self, question: Question) -> None:
        r = question.request
        expires = time.time() + self.config.reply_ttl_seconds
        if r.expires_at is not None:
            expires = min(expires, r.expires_at.timestamp())
        links: dict[str, str] = {}
        if self.ctx.page is not None:
            links["The question on the page"] = self.ctx.page(r.request_id)
        # A signed link names nobody: it answers only a question open to anyone.
        if self.ctx.link is not None and r.input_type in ONE_CLICK and not r.respondents:
            links["Answer in one click (single use)"] = self.ctx.link(
                r.request_id, str(question.workspace)
            )
        # Everyone allowed to answer, those it was escalated to included; an escalation goes
        # only to those it adds (docs/inbox.md, "Reminders and escalation").
        allowed = followup.respondents_with(
            r.respondents,
            followup.read(Workspace(question.workspace).interaction_dir, r.request_id),
        )
        if question.only:
            allowed = list(question.only)
        for to in self.recipients(allowed):
            reply_to = None
            if not r.is_secret:  # a secret is never asked or answered by mail
                _, tok = self.grants.issue(r.request_id, question.workspace, to, expires)
                reply_to = f"{self.config.reply_local}+{tok}@{self.config.reply_domain}"
            msg = mail.question_mail(question, self.config.from_address, to, reply_to, links)
            self.courier.put(to, "question", msg.as_string())
        log.info(
            "email_question_queued", request_id=r.request_id, workspace=str(question.workspace)
        )

    def withdraw(self, closed: Closed) -> None:
        grants = self.grants.for_request(closed.request_id, closed.workspace)
        by_mail = [g for g in grants if self.grants.claimed_by(g) is not None]
        if closed.how == "expired":
            line = "This question expired before it was answered; replies to it no longer count."
        elif by_mail:
            line = f"This question was answered by {by_mail[0].recipient} by email."
        elif closed.answered_by:
            via = f" ({closed.channel})" if closed.channel else ""
            line = f"This question was answered by {closed.answered_by}{via}."
        else:
            line = "This question was answered elsewhere; replies to it no longer count."
        for g in grants:
            if g not in by_mail:
                self._notice(g.recipient, f"Closed: question {closed.request_id}", line)

    # -- sending ----------------------------------------------------------------------------
    def _notice(self, to: str, subject: str, line: str) -> None:
        msg = mail.notice_mail(self.config.from_address, to, f"[deltad] {subject}", line)
        self.courier.put(to, "notice", msg.as_string())

    def _smtp(self, d: Delivery) -> Failed | None:
        """One attempt at handing `d` to the MTA from this process; None once it took it."""
        assert self._send is not None
        return self._send(d)

    # -- taking answers in ------------------------------------------------------------------
    def _read_loop(self) -> None:
        pruned = 0.0
        while not self._stopping.is_set():
            try:
                self.take()
                if time.time() - pruned > PRUNE_EVERY:
                    pruned = time.time()
                    self.grants.prune(pruned)
            except Exception as err:  # a channel must never take the daemon down
                log.error("email_read_failed", error=str(err))
            self._stopping.wait(self.config.poll_seconds)

    def take(self) -> int:
        """One pass over the Maildir's `new/`; how many messages it dealt with."""
        new = self.config.maildir / "new"
        try:
            names = sorted(e.name for e in os.scandir(new) if not e.name.startswith("."))
        except OSError as e:
            if self._unreadable != str(e):  # once per problem: the MTA makes it on first mail
                log.warning("email_maildir_unreadable", maildir=str(new), error=e.strerror)
            self._unreadable = str(e)
            return 0
        self._unreadable = None
        for name in names[: self.config.max_per_pass]:
            try:
                self._one(name)
            except Exception as err:  # a bug must not make one message read forever
                log.error("email_reply_failed", message=name, error=repr(err))
                self._done(name)  # kept in cur/ for the administrator
        return min(len(names), self.config.max_per_pass)

    def _one(self, name: str) -> None:
        data = self._read(self.config.maildir / "new" / name)
        try:
            if data is None:
                raise Refusal("unreadable", "the message is not a regular file or is too large")
            try:
                reply = mail.parse(data)
            except mail.Unreadable as e:
                raise Refusal("unreadable", str(e)) from None
            self._answer(reply, name)
        except Refusal as r:
            log.warning(
                "email_reply_refused",
                message=name,
                code=r.code,
                reason=str(r),
                request_id=r.grant.request_id if r.grant else None,
            )
            if r.grant is not None:  # only to the address the reply address was given to
                self._notice(
                    r.grant.recipient,
                    f"your reply to question {r.grant.request_id} was not taken",
                    f"Not taken: {r}",
                )
        self._done(name)

    def _read(self, path: Path) -> bytes | None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > self.config.max_message_bytes:
                return None
            chunks, left = [], self.config.max_message_bytes + 1
            while left > 0 and (chunk := os.read(fd, min(left, 65536))):
                chunks.append(chunk)
                left -= len(chunk)
            data = b"".join(chunks)
            return data if len(data) <= self.config.max_message_bytes else None
        finally:
            os.close(fd)

    def _done(self, name: str) -> None:
        """Moved to cur/ (seen): never read again."""
        box = self.config.maildir
        target = name if ":2," in name else f"{name}:2,S"
        with contextlib.suppress(FileNotFoundError):
            os.rename(box / "new" / name, box / "cur" / target)
        for d in ("new", "cur"):
            fd = os.open(box / d, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def _grant(self, reply: mail.Reply) -> Grant:
        tokens = [m.group(1) for a in reply.recipients if (m := self.address.fullmatch(a))]
        if not tokens:
            raise Refusal("no_reply_address", "not sent to a reply address")
        tok, now = tokens[0], time.time()
        grant = self.grants.load(tok)
        try:
            return check(self.grants.key, grant, tok, now)
        except AddressExpired as e:
            raise Refusal(e.code, str(e), grant) from None
        except (Unknown, Refused) as e:
            raise Refusal(e.code, str(e)) from None

    def _answer(self, reply: mail.Reply, name: str) -> None:
        if reply.automatic:  # an out-of-office is no answer, and is never answered (loops)
            raise Refusal("auto_reply", "an automatic reply (Auto-Submitted or Precedence)")
        grant = self._grant(reply)
        if reply.sender != grant.recipient:
            raise Refusal(
                "not_allowed",
                f"only {grant.recipient} may answer through this reply address, "
                f"not {reply.sender or 'a sender without an address'}",
                grant,
            )
        claimed = self.grants.claimed_by(grant)
        if claimed is not None and claimed != name:
            raise Refusal("replayed", "this reply address was already used; nothing changed", grant)
        person = self.config.person(reply.sender)
        try:
            ws = grant.path
        except ValueError:  # a grant file edited by hand: the MAC held, the name does not
            raise Refusal("unknown_address", "this reply address names no workspace") from None
        try:
            req = self.ctx.question(Workspace(ws), grant.request_id)
        except SubmitError as e:
            raise Refusal(e.code, f"{e}", grant) from None
        except (ProtocolError, OSError) as e:
            why = f"the workspace cannot take an answer: {e}"
            raise Refusal("workspace_problem", why, grant) from None
        if person is None:
            raise Refusal("not_a_respondent", f"{reply.sender} is not configured", grant)
        asked = followup.respondents_with(
            req.respondents, followup.read(Workspace(ws).interaction_dir, req.request_id)
        )
        denied = refusal(asked, Answerer(person.name, tuple(person.groups)))
        if denied is not None:
            raise Refusal("not_a_respondent", denied, grant)
        if req.is_secret:
            raise Refusal("secret", "a secret is never answered by mail: use the page", grant)
        if reply.text is None:
            raise Refusal("no_plain_text", "the reply has no plain text part to read", grant)
        try:
            body = mail.answer_of(req, reply.text)
        except AnswerRejected as e:
            raise Refusal("misfit", f"{e}; reply again", grant) from None
        self.grants.claim(grant, name)
        try:
            self.ctx.answer(
                ws,
                req.request_id,
                body,
                answered_by=reply.sender,
                channel=self.name,
                voter=person.name,  # four eyes: one person, one vote, on every channel
            )
        except (ProtocolError, OSError) as e:  # as the HTTP API says it (409)
            self.grants.release(grant)
            why = f"the workspace cannot take an answer: {e}"
            raise Refusal("workspace_problem", why, grant) from None
        except SubmitError as e:
            if claimed == name and isinstance(e, AnswerWaiting | AlreadyAnswered | NotPending):
                log.info("email_reply_already_taken", message=name, request_id=req.request_id)
                return  # this very message answered before a crash cut its pass short
            self.grants.release(grant)
            why = f"{e}; reply again" if isinstance(e, Misfit | TooLarge) else str(e)
            raise Refusal(e.code, why, grant) from None
        log.info(
            "email_answered",
            request_id=req.request_id,
            workspace=str(ws),
            answered_by=reply.sender,
            message=name,
        )
