"""The email channel: a question goes out as mail (SMTP: STARTTLS, TLS or plain, with a login
or without); a reply, delivered by the site's MTA into a Maildir, is the answer.

Who may answer. The reply address is the authority: a grant (deltad/outbound/grants.py) bound
to the question's request id, its workspace and the one address the mail went to, signed,
expiring and single-use. The From header is only compared with that address (it can be
forged; the reply address is the secret), then the person it names must still be allowed to
answer the question (`respondents`). A refused reply changes nothing and gets a one-line mail
saying why, sent to the address the reply address was given to (never to a From that may be
forged); a reply to no reply address of ours is only logged.

Reading the Maildir is not done here, in the root core: the unprivileged inbox process reads
and parses each message (deltad/outbound/maildir.py) and relays only the reply address's
token, the sender and the answer's text (`mail.Received`); `receive` checks all of it as
hostile and answers. The inbox moves a message to `cur/` only after this side replied: a crash
of either process relays it again, and its claim on the reply address (made durably before the
answer is written, naming the message) tells the second relay it already answered. So a crash
never answers twice and never loses a reply.
"""

from __future__ import annotations

import threading
import time

import structlog

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
from deltad.outbound import authres, mail
from deltad.outbound.base import Channel, Closed, Context, Question
from deltad.outbound.config import EmailConfig
from deltad.outbound.courier import Handed
from deltad.outbound.grants import AddressExpired, Grant, Grants, Refused, Unknown, check
from deltad.protocol import InputType, InteractionRequest, ProtocolError, Workspace, followup
from deltad.protocol.replies import AnswerRejected

log = structlog.get_logger("deltad.outbound.email")
PRUNE_EVERY = 3600.0  # seconds between prunes of expired grants
PROBLEMS = {  # what the inbox could not read, as the person would be told (nobody is: no grant)
    "unreadable": "the message is not a regular file or is too large",
    "unparsable": "the message cannot be parsed",
}
ONE_CLICK = (InputType.CHOICE, InputType.YES_NO, InputType.CONFIRMATION, InputType.APPROVAL)


class Refusal(Exception):
    """A reply that does not answer: one line for the person, a code for the log."""

    def __init__(
        self, code: str, line: str, grant: Grant | None = None, audited: bool = False
    ) -> None:
        super().__init__(line)
        self.code, self.grant = code, grant
        self.audited = audited  # the answering path recorded it already (quorum.cast)


class EmailChannel(Channel):
    name = "email"

    def __init__(self, config: EmailConfig, ctx: Context) -> None:
        self.config, self.ctx = config, ctx
        ctx.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.grants = Grants(ctx.state_dir)
        # Mail is sent by the inbox process (unprivileged) from what is handed to it
        # (deltad/outbound/senders.py); this process never connects to the MTA.
        self.courier = Handed(self.name, ctx.hand)
        self._stopping = threading.Event()
        self._receiving = threading.Lock()
        self._pruned = 0.0
        self._pruner = threading.Thread(
            target=self._prune_loop, name="deltad-email-prune", daemon=True
        )

    # -- the interface ----------------------------------------------------------------------
    def start(self) -> None:
        self.courier.start()
        self._pruner.start()

    def stop(self) -> None:
        self._stopping.set()
        self._pruner.join(5)
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
        sent = self.grants.for_request(r.request_id, question.workspace)
        for to in self.recipients(allowed):
            reply_to, msgid = None, mail.message_id(self.config.from_address)
            # A reminder or an escalation goes in the thread of the question's first mail.
            thread = tuple(g.message_id for g in sent if g.recipient == to and g.message_id)
            if not r.is_secret:  # a secret is never asked or answered by mail
                _, tok = self.grants.issue(
                    r.request_id, question.workspace, to, expires, msgid, r.prompt
                )
                reply_to = f"{self.config.reply_local}+{tok}@{self.config.reply_domain}"
            msg = mail.question_mail(
                question, self.config.from_address, to, reply_to, links, msgid, thread[:1]
            )
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
        # One notice a person (a reminder gave them another reply address), none to whoever
        # answered by mail; it quotes the question and threads to the mails that asked it.
        answered = {g.recipient for g in by_mail}
        mine: dict[str, list[Grant]] = {}
        for g in grants:
            if g.recipient not in answered:
                mine.setdefault(g.recipient, []).append(g)
        for to, theirs in mine.items():
            prompt = next((g.prompt for g in theirs if g.prompt), "")
            thread = tuple(g.message_id for g in theirs if g.message_id)
            msg = mail.closed_mail(
                self.config.from_address,
                to,
                line,
                prompt,
                theirs[0].workspace,
                closed.request_id,
                thread,
            )
            self.courier.put(to, "notice", msg.as_string())

    # -- sending ----------------------------------------------------------------------------
    def _notice(self, to: str, subject: str, line: str) -> None:
        msg = mail.notice_mail(self.config.from_address, to, f"[deltad] {subject}", line)
        self.courier.put(to, "notice", msg.as_string())

    # -- taking answers in ------------------------------------------------------------------
    def _prune_loop(self) -> None:
        while not self._stopping.wait(0 if self._pruned == 0.0 else PRUNE_EVERY):
            try:
                self._pruned = time.time()
                self.grants.prune(self._pruned)
            except Exception as err:  # a channel must never take the daemon down
                log.error("email_prune_failed", error=str(err))

    def receive(self, got: mail.Received) -> dict[str, str]:
        """One message of the Maildir as the inbox process relayed it (deltad/outbound/
        maildir.py): checked as hostile (the token with this channel's key, the sender against
        its grant, the person against the question's respondents, the answer against its
        kind), answered through the answering path, refused in one line to the address the
        reply address was given to. The result is the inbox's acknowledgement: it moves the
        file to cur/ then. Never raises."""
        with self._receiving:  # one at a time: a claim and its answer are one step
            try:
                return self._receive(got)
            except Exception as err:  # a bug must not make one message relayed forever
                log.error("email_reply_failed", message=got.message, error=repr(err))
                self._count("failed")
                return {"result": "failed"}

    def _receive(self, got: mail.Received) -> dict[str, str]:
        try:
            if got.problem is not None:
                raise Refusal("unreadable", PROBLEMS.get(got.problem, "the message is unreadable"))
            result = self._answer(got)
        except Refusal as r:
            log.warning(
                "email_reply_refused",
                message=got.message,
                code=r.code,
                reason=str(r),
                request_id=r.grant.request_id if r.grant else None,
            )
            if r.grant is not None and not r.audited:
                self._audit(got, r, r.grant)
            if r.grant is not None:  # only to the address the reply address was given to
                self._notice(
                    r.grant.recipient,
                    f"your reply to question {r.grant.request_id} was not taken",
                    f"Not taken: {r}",
                )
            self._count("refused")
            return {"result": "refused", "code": r.code}
        self._count(result)
        return {"result": result}

    def _audit(self, got: mail.Received, r: Refusal, grant: Grant) -> None:
        """A refusal of a reply that named a question (its reply address held), as a receipt:
        a forged or unauthenticated From is on record with the mail that carried it."""
        if self.ctx.refused is None:
            return
        try:
            ws = grant.path
        except ValueError:
            return
        origin = {"from": got.sender.lower(), "message": got.message}
        if got.message_id is not None:
            origin["message_id"] = got.message_id
        if got.authentication:
            origin["authentication"] = "; ".join(got.authentication)[:1000]
        try:
            self.ctx.refused(ws, grant.request_id, r.code, str(r), got.sender.lower(), origin)
        except Exception as err:  # the refusal stands; a log that cannot take it says so
            log.error("audit_failed", error=str(err))

    def _count(self, result: str) -> None:
        if self.ctx.replies is not None:
            self.ctx.replies.labels(self.name, result).inc()

    def _grant(self, got: mail.Received) -> Grant:
        if got.token is None:
            raise Refusal("no_reply_address", "not sent to a reply address")
        tok, now = got.token.lower(), time.time()
        grant = self.grants.load(tok)
        try:
            return check(self.grants.key, grant, tok, now)
        except AddressExpired as e:
            raise Refusal(e.code, str(e), grant) from None
        except (Unknown, Refused) as e:
            raise Refusal(e.code, str(e)) from None

    def _authenticated(
        self, got: mail.Received, sender: str, req: InteractionRequest, grant: Grant
    ) -> str | None:
        """The trusted MTA's verdict on the reply's From (None: no authserv_id configured);
        Refusal when this reply must be authenticated (`authentication`) and is not."""
        c = self.config
        needed = c.authentication == "required" or (
            c.authentication == "approvals"
            and (bool(req.calls) or req.approvals_required > 1)  # approving calls, or a vote
        )
        if c.authserv_id is None:
            if needed:
                why = "the channel reads no Authentication-Results (email.authserv_id is not set)"
                raise Refusal("unauthenticated", f"an approval or a vote by mail: {why}", grant)
            return None
        found = authres.verdict(got.authentication, c.authserv_id, sender)
        if needed and not found.ok:
            why = f"its From is not authenticated by {c.authserv_id} (DKIM or DMARC)"
            raise Refusal("unauthenticated", f"{why}: {found.shown}", grant)
        return found.shown

    def _answer(self, got: mail.Received) -> str:
        """ "answered", "voted" (four eyes: a vote counted, the question still waits), or
        "taken" (this very message answered before a crash cut the pass short: the inbox
        relays it again); Refusal otherwise."""
        if got.automatic:  # an out-of-office is no answer, and is never answered (loops)
            raise Refusal("auto_reply", "an automatic reply (Auto-Submitted or Precedence)")
        grant = self._grant(got)
        name, sender = got.message, got.sender.lower()
        if sender != grant.recipient:
            raise Refusal(
                "not_allowed",
                f"only {grant.recipient} may answer through this reply address, "
                f"not {sender or 'a sender without an address'}",
                grant,
            )
        claimed = self.grants.claimed_by(grant)
        if claimed is not None and claimed != name:
            raise Refusal("replayed", "this reply address was already used; nothing changed", grant)
        person = self.config.person(sender)
        try:
            ws = grant.path
        except ValueError:  # a grant file edited by hand: the MAC held, the name does not
            raise Refusal("unknown_address", "this reply address names no workspace") from None
        try:
            req = self.ctx.question(Workspace(ws), grant.request_id)
        except SubmitError as e:
            if claimed == name and isinstance(e, AnswerWaiting | AlreadyAnswered | NotPending):
                # This very message answered, and its run went on, before a crash (of either
                # process) kept it from being moved: no "not taken" mail for a taken reply.
                log.info("email_reply_already_taken", message=name, request_id=grant.request_id)
                return "taken"
            raise Refusal(e.code, f"{e}", grant) from None
        except (ProtocolError, OSError) as e:
            why = f"the workspace cannot take an answer: {e}"
            raise Refusal("workspace_problem", why, grant) from None
        if person is None:
            raise Refusal("not_a_respondent", f"{sender} is not configured", grant)
        asked = followup.respondents_with(
            req.respondents, followup.read(Workspace(ws).interaction_dir, req.request_id)
        )
        denied = refusal(asked, Answerer(person.name, tuple(person.groups)))
        if denied is not None:
            raise Refusal("not_a_respondent", denied, grant)
        if req.is_secret:
            raise Refusal("secret", "a secret is never answered by mail: use the page", grant)
        verdict = self._authenticated(got, sender, req, grant)
        if got.text is None:
            raise Refusal("no_plain_text", "the reply has no plain text part to read", grant)
        try:
            body = mail.answer_of(req, got.text)
        except AnswerRejected as e:
            raise Refusal("misfit", f"{e}; reply again", grant) from None
        if not self.grants.claim(grant, name):  # claimed meanwhile by another message
            raise Refusal("replayed", "this reply address was already used; nothing changed", grant)
        origin = {"from": sender, "message": name}  # a vote's receipt says where it came from
        if got.message_id is not None:
            origin["message_id"] = got.message_id
        if verdict is not None:  # the MTA's verdict on the From, as it was read
            origin["authentication"] = verdict
        try:
            done = self.ctx.answer(
                ws,
                req.request_id,
                body,
                answered_by=sender,
                channel=self.name,
                voter=person.name,  # four eyes: one person, one vote, on every channel
                origin=origin,
            )
        except (ProtocolError, OSError) as e:  # as the HTTP API says it (409)
            self.grants.release(grant)
            why = f"the workspace cannot take an answer: {e}"
            raise Refusal("workspace_problem", why, grant) from None
        except SubmitError as e:
            if claimed == name and isinstance(e, AnswerWaiting | AlreadyAnswered | NotPending):
                log.info("email_reply_already_taken", message=name, request_id=req.request_id)
                return "taken"  # this very message answered before a crash cut its pass short
            self.grants.release(grant)
            why = f"{e}; reply again" if isinstance(e, Misfit | TooLarge) else str(e)
            raise Refusal(e.code, why, grant, audited=True) from None
        if done is None:  # four eyes: a vote counted; the question waits for the others
            log.info(
                "email_voted",
                request_id=req.request_id,
                workspace=str(ws),
                voter=person.name,
                message=name,
            )
            return "voted"
        log.info(
            "email_answered",
            request_id=req.request_id,
            workspace=str(ws),
            answered_by=sender,
            message=name,
        )
        return "answered"
