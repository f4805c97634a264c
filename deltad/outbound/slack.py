"""The Slack channel: a question goes out as a Block Kit message (deltad/outbound/blocks.py)
through Slack's Web API (`slack_sdk.WebClient`: `chat.postMessage`), into a conversation
and/or as a direct message to each mapped person allowed to answer; a button, or a modal it
opens, is the answer; once the question is closed (answered on any channel, or expired) the
message is updated (`chat.update`) to say who answered, through what and when.

Sending. Every post, update and ephemeral refusal is composed here (the closed message at the
moment the question closes) and is a file in the channel's outbox (deltad/outbound/courier.py)
before it is attempted. Under the daemon the unprivileged inbox process sends it with the bot
token it was handed (deltad/outbound/senders.py, `SlackSender`, which also keeps where each
question was posted), and opens the modals a button asks for: the core makes no call to
Slack and holds no Slack connection. Slack's outage never holds up another channel, and a
restart of either process loses nothing queued.

Taking answers in. Slack POSTs interactions to the HTTP inbox (`POST
/v1/channels/slack/interactions`, served by the unprivileged inbox process), which hands the
raw body and Slack's two headers to the core unread (deltad/wire.py:
`ChannelInteraction`). Everything is decided here, in the core, as if the inbox were hostile:
the v0 signature is verified with `slack_sdk.signature.SignatureVerifier` (five-minute window)
with the signing secret that only the core reads; the Slack user id is mapped to a name and
groups (`users:`) and checked against the question's respondents and delegates; the answer is
rebuilt from the question on disk (a button's value only names it) and goes through the one
answering path (`ctx.answer`, `deltad.inbox.submit`), recorded with `channel: slack` and the
Slack user id as `answered_by`. A refusal changes nothing and is told to the person
(ephemeral) and logged (`slack_action_refused`, with a code).

The channel's state, `<state>/channels/slack/messages/<ref>.json`: one record per question
(`ref` = a hash of its workspace and request id): where it was posted (conversation, ts),
whether it was answered here (by whom) and whether it is closed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
import urllib.parse
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from slack_sdk.signature import SignatureVerifier

from deltad.inbox import Answerer, SubmitError, refuse_respondent
from deltad.inbox.answer_body import AnswerIn
from deltad.inbox.handlers import ApiError
from deltad.inbox.respondents import may_answer
from deltad.outbound import blocks
from deltad.outbound.base import Channel, Closed, Context, Question
from deltad.outbound.config import SlackConfig
from deltad.outbound.courier import Handed
from deltad.protocol import InteractionRequest, ProtocolError, Workspace, atomic_write_json
from deltad.protocol.printable import show_path, unshow
from deltad.protocol.replies import AnswerRejected

log = structlog.get_logger("deltad.outbound.slack")
WINDOW = 5 * 60  # seconds a signed request's timestamp may be off (Slack's own rule)
BODY_MAX = 256 * 1024  # bytes of an interaction's body (the inbox cuts it off at this too)
RECORD_MAX = 64 * 1024
KEEP_CLOSED = 30 * 86400.0  # seconds a closed question's record is kept (a late click is told)
PRUNE_EVERY = 3600.0
OPEN_SECONDS = 2.5  # a trigger_id lives 3 s: views.open is tried once, at once
MODAL_FAILED = "the form could not be opened; try again"


class Refusal(Exception):
    """An action that does not answer: one line for the person, a code for the log."""

    def __init__(self, code: str, line: str, audited: bool = False) -> None:
        super().__init__(line)
        self.code = code
        self.audited = audited  # the answering path recorded it already (quorum.cast)


# -- what Slack sends (only the fields used; Slack adds fields freely) -------------------------
class _Loose(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _User(_Loose):
    id: str = Field(min_length=1, max_length=64)


class _Action(_Loose):
    action_id: str = Field(max_length=255)
    value: str | None = Field(default=None, max_length=2000)


class _Conversation(_Loose):
    id: str = Field(max_length=64)


class _Container(_Loose):
    channel_id: str | None = Field(default=None, max_length=64)
    message_ts: str | None = Field(default=None, max_length=64)


class _State(_Loose):
    values: dict[str, dict[str, dict[str, Any]]] = Field(default_factory=dict)


class _View(_Loose):
    id: str | None = Field(default=None, max_length=64)
    callback_id: str | None = None
    private_metadata: str = Field(default="", max_length=3000)
    state: _State = Field(default_factory=_State)


class Payload(_Loose):
    type: str
    user: _User
    trigger_id: str | None = Field(default=None, max_length=255)
    actions: list[_Action] = Field(default_factory=list)
    channel: _Conversation | None = None
    container: _Container | None = None
    view: _View | None = None

    @property
    def conversation(self) -> str | None:
        if self.channel is not None:
            return self.channel.id
        return self.container.channel_id if self.container is not None else None

    def origin(self) -> dict[str, str]:
        """Where an answer came from, for a vote's receipt: the user, and the message clicked
        (conversation, ts) or the modal submitted (view id), as far as Slack says."""
        out = {"user": self.user.id}
        if (conversation := self.conversation) is not None:
            out["conversation"] = conversation
        if self.container is not None and self.container.message_ts is not None:
            out["message_ts"] = self.container.message_ts
        if self.view is not None and self.view.id is not None:
            out["view"] = self.view.id
        return out


def payload_of(body: str) -> Payload:
    """The `payload=` form field Slack posts (ApiError 400 when it is not one)."""
    try:
        fields = urllib.parse.parse_qs(body, strict_parsing=True, max_num_fields=10)
        [raw] = fields["payload"]
        return Payload.model_validate_json(raw)
    except (ValueError, KeyError, ValidationError):
        raise ApiError(400, "bad_payload", "not a Slack interaction payload") from None


def ref_of(workspace: str, request_id: str) -> str:
    return hashlib.sha256(f"{workspace}\0{request_id}".encode()).hexdigest()[:32]


def split(value: str) -> tuple[str, str]:
    ref, _, key = value.partition(":")
    if len(ref) != 32 or not all(c in "0123456789abcdef" for c in ref):
        raise Refusal("unknown_question", "this button names no question of this deltad")
    return ref, key


class Records:
    """The channel's record of each question it posted (one JSON file each, replaced whole)."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.lock = threading.RLock()

    def get(self, ref: str) -> dict[str, Any] | None:
        path = self.dir / f"{ref}.json"
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        with os.fdopen(fd, "rb") as f:
            data = f.read(RECORD_MAX + 1)
        try:
            doc = json.loads(data) if len(data) <= RECORD_MAX else None
        except ValueError:
            doc = None
        return doc if isinstance(doc, dict) else None

    def put(self, ref: str, doc: dict[str, Any]) -> None:
        atomic_write_json(self.dir / f"{ref}.json", doc)

    def prune(self, now: float) -> int:
        """Records of questions closed more than KEEP_CLOSED ago, removed; how many."""
        gone = 0
        with self.lock:
            for entry in os.scandir(self.dir):
                ref = entry.name.removesuffix(".json")
                doc = self.get(ref) if entry.name.endswith(".json") else None
                closed = doc.get("closed") if doc is not None else None
                if isinstance(closed, dict) and now - float(closed.get("at", now)) > KEEP_CLOSED:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
                        gone += 1
        return gone

    def change(self, ref: str, **fields: Any) -> dict[str, Any] | None:
        with self.lock:
            doc = self.get(ref)
            if doc is None:
                return None
            doc |= fields
            self.put(ref, doc)
            return doc


class SlackChannel(Channel):
    name = "slack"

    def __init__(self, config: SlackConfig, ctx: Context) -> None:
        self.config, self.ctx = config, ctx
        ctx.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        # The signing secret is read here, once, and kept in memory only (never logged). The
        # bot token is the inbox process's (handed to it at connect): it sends and opens the
        # modals (deltad/outbound/senders.py); this process makes no call to Slack.
        self.verifier = SignatureVerifier(config.signing_secret.read().decode())
        self.records = Records(ctx.state_dir / "messages")
        self._pruned = 0.0
        self.courier = Handed(self.name, ctx.hand)

    # -- the interface ----------------------------------------------------------------------
    def start(self) -> None:
        self.courier.start()

    def stop(self) -> None:
        self.courier.stop()

    def recipients(self, respondents: list[str]) -> list[str]:
        """Where a question for `respondents` is posted: the conversation, and with `dm` each
        mapped person allowed to answer it."""
        out = [self.config.channel] if self.config.channel else []
        if self.config.dm:
            for user in sorted(self.config.users):
                p = self.config.person(user)
                if p is not None and not refusal_of(respondents, p.name, p.groups):
                    out.append(user)
        return out

    def send(self, question: Question) -> None:
        r = question.request
        if (now := time.time()) - self._pruned > PRUNE_EVERY:  # on the intake thread, hourly
            self._pruned = now
            self.records.prune(now)
        shown = show_path(str(question.workspace))
        ref = ref_of(shown, r.request_id)
        if question.follow_up is not None and self.records.get(ref) is not None:
            self._follow_up(question, ref)
            return
        with self.records.lock:
            if self.records.get(ref) is not None:
                return  # told again (a restart): posted once
            self.records.put(
                ref,
                {
                    "workspace": shown,
                    "request_id": r.request_id,
                    "prompt": r.prompt,
                    "posts": [],
                    "answered": None,
                    "closed": None,
                },
            )
        page = self.ctx.page(r.request_id) if self.ctx.page is not None else None
        text, message = blocks.question_message(question, ref, self.config.context_chars, page)
        for to in self.recipients(r.respondents):
            body = {"ref": ref, "text": text, "blocks": message}
            self.courier.put(to, "question", json.dumps(body))
        log.info("slack_question_queued", request_id=r.request_id, workspace=shown)

    def _follow_up(self, question: Question, ref: str) -> None:
        """A reminder or an escalation of a question posted before (docs/inbox.md, "Reminders
        and escalation"): a reply in the thread of each post, broadcast to the conversation so
        it is seen again; an escalation also posts the question to the DMs of those it adds
        (the conversation has it already). The follow-up's record is the daemon's (the state
        dir): each reaches here once."""
        r = question.request
        if question.follow_up == "escalation":
            names = ", ".join(question.only) or "more people"
            note = f"Escalated to {names}: this question is still waiting for an answer."
        else:
            note = "Reminder: this question is still waiting for an answer."
        legacy = _legacy(self.records.get(ref) or {})
        self.courier.put("thread", "thread", json.dumps({"ref": ref, "text": note, **legacy}))
        if question.follow_up == "escalation" and question.only and self.config.dm:
            page = self.ctx.page(r.request_id) if self.ctx.page is not None else None
            text, message = blocks.question_message(question, ref, self.config.context_chars, page)
            for to in self.recipients(list(question.only)):
                if to != self.config.channel:  # `once`: not where it was posted already
                    body = {"ref": ref, "text": text, "blocks": message, "once": True}
                    self.courier.put(to, "question", json.dumps(body))
        log.info(
            "slack_follow_up_queued",
            request_id=r.request_id,
            follow_up=question.follow_up,
            workspace=show_path(str(question.workspace)),
        )

    def withdraw(self, closed: Closed) -> None:
        ref = ref_of(show_path(str(closed.workspace)), closed.request_id)
        at = time.time()
        doc = self.records.change(
            ref,
            closed={
                "how": closed.how,
                "answered_by": closed.answered_by,
                "channel": closed.channel,
                "at": at,
            },
        )
        if doc is None:
            return  # never posted here
        text, message = self._closed_message(doc)  # as it is now: who answered, and when
        body = {"ref": ref, "text": text, "blocks": message, **_legacy(doc)}
        self.courier.put("update", "update", json.dumps(body))

    def _closed_message(self, record: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
        c = record["closed"]
        closed = Closed(
            Path(unshow(record["workspace"])),
            record["request_id"],
            c["how"],
            c.get("answered_by"),
            c.get("channel"),
        )
        answered = record.get("answered")
        here = answered["user"] if answered and c["how"] == "answered" else None
        at = datetime.fromtimestamp((answered or c)["at"], UTC)
        return blocks.closed_message(record["prompt"], closed, at, here)

    # -- taking answers in (the core's call threads) ----------------------------------------
    def interaction(self, body: str, timestamp: str, signature: str) -> dict[str, Any]:
        """One POST from Slack, as the inbox received it: `{"response": ...}`, the body to
        answer Slack with (None: an empty 200), or ApiError (401 for a request Slack did not
        sign, or signed too long ago; 400 for one that is no interaction)."""
        now = time.time()
        try:
            sent = int(timestamp)
        except ValueError:
            sent = None
        if sent is None or abs(now - sent) > WINDOW:
            why = "the request's timestamp is missing or more than five minutes off"
            log.warning("slack_request_refused", code="stale_request", reason=why)
            raise ApiError(401, "stale_request", why)
        if not self.verifier.is_valid(body, timestamp, signature):
            why = "the request's Slack signature does not verify"
            log.warning("slack_request_refused", code="bad_signature", reason=why)
            raise ApiError(401, "bad_signature", why)
        p = payload_of(body)
        if p.type == "block_actions" and p.actions:
            return self._action(p)
        view = p.view
        if p.type == "view_submission" and view is not None and view.callback_id == blocks.MODAL:
            return {"response": self._submission(p)}
        return {"response": None}  # nothing of ours (a link button, a closed modal)

    def _action(self, p: Payload) -> dict[str, Any]:
        """`{"response": ...}`; with `open_view`, the modal the inbox process opens (it holds
        the token) before it answers Slack, and what it says if Slack will not open it."""
        action = p.actions[0]
        if action.action_id not in (blocks.ANSWER, blocks.OPEN):
            return {"response": None}
        try:
            ref, key = split(action.value or "")
            ws, req, _ = self._allowed(ref, p.user.id)
            if action.action_id == blocks.OPEN:
                return {"response": None, **self._open(p, req, ref, key)}
            try:
                answer = blocks.answer_of(req, key)
            except AnswerRejected as e:
                raise Refusal("misfit", str(e)) from None
            self._answer(ws, req, answer, p, ref)
        except Refusal as r:
            self._audit(p, action.value or "", r)
            return {"response": self._refused(p, r)}
        return {"response": None}

    def _submission(self, p: Payload) -> dict[str, Any] | None:
        assert p.view is not None
        try:
            ref, key = split(p.view.private_metadata)
            ws, req, _ = self._allowed(ref, p.user.id)
            try:
                answer = blocks.submitted(req, key, p.view.state.values)
            except AnswerRejected as e:
                raise Refusal("misfit", str(e)) from None
            self._answer(ws, req, answer, p, ref)
        except Refusal as r:
            self._audit(p, p.view.private_metadata or "", r)
            self._refused(p, r, tell=False)
            return {"response_action": "errors", "errors": {blocks.INPUT_BLOCK: str(r)[:150]}}
        return None

    def _allowed(self, ref: str, user: str) -> tuple[Path, InteractionRequest, dict[str, Any]]:
        """The question `ref` names, if `user` may answer it now (Refusal if not)."""
        record = self.records.get(ref)
        if record is None:
            raise Refusal("unknown_question", "this message names no question of this deltad")
        if (answered := record.get("answered")) is not None:
            who = answered["user"]
            raise Refusal("replayed", f"already answered by <@{who}> in Slack; nothing changed")
        if (closed := record.get("closed")) is not None:
            if closed["how"] == "expired":
                raise Refusal("expired", "this question expired; nothing changed")
            who = closed.get("answered_by") or "someone"
            via = f" ({closed['channel']})" if closed.get("channel") else ""
            raise Refusal("closed", f"already answered by {who}{via}; nothing changed")
        person = self.config.person(user)
        if person is None:
            why = f"<@{user}> is not a deltad user here (channels.slack.users)"
            raise Refusal("not_mapped", why)
        ws = Path(unshow(record["workspace"]))
        try:
            req = self.ctx.question(Workspace(ws), record["request_id"])
        except SubmitError as e:
            raise Refusal(e.code, f"{e}; nothing changed") from None
        except (ProtocolError, OSError) as e:
            why = f"the workspace cannot take an answer: {e}"
            raise Refusal("workspace_problem", why) from None
        who = Answerer(person.name, tuple(person.groups))
        denied = refuse_respondent(Workspace(ws), req.request_id, who)
        if denied is not None:
            raise Refusal("not_a_respondent", denied)
        if req.is_secret:
            raise Refusal("secret", "a secret is never answered in Slack: use the page")
        return ws, req, record

    def _open(self, p: Payload, req: InteractionRequest, ref: str, key: str) -> dict[str, Any]:
        """The modal for `key`, described for the inbox process to open (`open_view`)."""
        if key and not any(b.key == key and b.opens for b in blocks.buttons(req)):
            raise Refusal("misfit", f"this question has no button {key!r}")
        if not p.trigger_id:
            raise Refusal("bad_payload", "the action carries no trigger_id to open a form with")
        view = blocks.modal(req, ref, key)
        line = f"Not taken: {MODAL_FAILED}"
        refusal = {"response_type": "ephemeral", "replace_original": False, "text": line}
        told = {"channel": p.conversation, "user": p.user.id, "text": line}
        return {
            "open_view": {
                "trigger_id": p.trigger_id,
                "view": view,
                "timeout": OPEN_SECONDS,
                "request_id": req.request_id,
                "user": p.user.id,
                "refusal": refusal,
                "told": told if p.conversation is not None else None,
            }
        }

    def _name_of(self, user: str) -> str | None:
        person = self.config.person(user)
        return person.name if person is not None else None

    def _answer(
        self,
        ws: Path,
        req: InteractionRequest,
        body: AnswerIn,
        p: Payload,
        ref: str,
    ) -> None:
        user, voter = p.user.id, self._name_of(p.user.id)
        with self.records.lock:  # one answer from this channel at a time per deltad
            record = self.records.get(ref)
            if record is not None and record.get("answered"):
                raise Refusal("replayed", "already answered in Slack; nothing changed")
            try:
                done = self.ctx.answer(
                    ws,
                    req.request_id,
                    body,
                    answered_by=user,
                    channel=self.name,
                    voter=voter,
                    origin=p.origin(),  # a vote's receipt says which click it was
                )
            except SubmitError as e:
                raise Refusal(e.code, f"{e}; nothing changed", audited=True) from None
            except (ProtocolError, OSError) as e:
                why = f"the workspace cannot take an answer: {e}"
                raise Refusal("workspace_problem", why) from None
            if done is None:  # four eyes: a vote; the message stays open for the others
                log.info("slack_voted", request_id=req.request_id, voter=voter or user)
                return
            self.records.change(ref, answered={"user": user, "at": time.time()})
        log.info(
            "slack_answered",
            request_id=req.request_id,
            workspace=show_path(str(ws)),
            answered_by=user,
        )

    def _audit(self, p: Payload, value: str, r: Refusal) -> None:
        """A refused click on a question this deltad posted (a Slack user mapped to nobody, no
        respondent, the question closed), as a receipt with the click's origin; the answering
        path's own refusals are its to record."""
        if r.audited or self.ctx.refused is None:
            return
        try:
            record = self.records.get(split(value)[0])
        except (Refusal, ValueError):  # names no question of ours: nothing to put on record
            record = None
        if record is None:
            return
        try:
            ws = Path(unshow(record["workspace"]))
            self.ctx.refused(ws, record["request_id"], r.code, str(r), p.user.id, p.origin())
        except Exception as err:  # the refusal stands; a log that cannot take it says so
            log.error("audit_failed", error=str(err))

    def _refused(self, p: Payload, r: Refusal, tell: bool = True) -> dict[str, Any]:
        log.warning("slack_action_refused", code=r.code, reason=str(r), user=p.user.id)
        line = f"Not taken: {r}"
        conversation = p.conversation
        if tell and conversation is not None:
            body = {"channel": conversation, "user": p.user.id, "text": line}
            with contextlib.suppress(OSError):
                self.courier.put(conversation, "ephemeral", json.dumps(body))
        return {"response_type": "ephemeral", "replace_original": False, "text": line}


def _legacy(record: dict[str, Any]) -> dict[str, Any]:
    """Posts an older deltad recorded in the core's record (before the sender kept them),
    handed along so an update or a reminder still reaches them."""
    posts = record.get("posts")
    return {"posts": posts} if isinstance(posts, list) and posts else {}


def refusal_of(respondents: list[str], name: str, groups: list[str]) -> bool:
    """Whether a person is refused by `respondents` (delegates are the answering check's)."""
    return not may_answer(respondents, Answerer(name, tuple(groups)))
