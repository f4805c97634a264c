"""The Microsoft Teams channel: a question goes out as an Adaptive Card, posted by a Bot
Framework bot into each configured conversation; its `Action.Execute` buttons are the answer;
once the question closes (answered on any channel, expired) the card is replaced by one that
says it is closed, and by whom (docs/inbox.md, "Microsoft Teams").

Sending. The card activity is composed here and is a file in the channel's outbox before it is
attempted; the unprivileged inbox process sends it (deltad/outbound/senders.py, `TeamsSender`):
it gets the bot's token with the app password it was handed (client credentials), POSTs the
activity to `{serviceUrl}/v3/conversations/{id}/activities`, keeps the activity id Teams gives
back, and PUTs the closed card over it later. The core holds no token and makes no call.

No button carries a URL, and no URL answers: Teams fetches links it shows (its link-preview
bot), so an answer is only ever a POST of a signed activity. A question that needs typed text
(text, a number, a date) gets an input and one `Answer` button; a decision that takes a reason
(reject) gets a reason box beside its button: Teams puts the inputs' values in the invoke's
`action.data`, and they are answered as any answer, checked by the answering path. A secret
(`password`, `sensitive`) gets no input and no button: it is answered on the page only.

Reminders and escalations are a reply to each card (`replyToId`, in its thread): the question
again, and for an escalation who it was escalated to, the mapped people among them mentioned.
The record of each card (`<state>/channels/teams/cards/`, and the sender's of activity ids) is
removed 30 days after its question closed, as Slack's (`Records.prune`, `Posts.prune`).

Taking answers in. Teams POSTs activities to `POST /v1/channels/teams/messages` (the inbox
process), which checks the bearer JWT against the Bot Connector's published keys
(deltad/outbound/botauth.py) and relays the activity, the token and the key set to the core
(`channel_interaction`). Here it is checked again, then: the card's data names the question
(`ref`, a hash of its workspace and request id) and the button, beside the inputs' values
(`answer`, `reason`); `from.aadObjectId` is mapped to
a person (`people`) and checked against the question's respondents; the answer is rebuilt from
the question on disk and goes through the one answering path (`ctx.answer`), recorded with
`channel: teams`. A refusal changes nothing, is logged (`teams_action_refused`) and is told to
the person in the invoke's response.
"""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from deltad.inbox import Answerer, SubmitError, refuse_respondent
from deltad.inbox.answer_body import AnswerIn
from deltad.inbox.handlers import ApiError
from deltad.outbound import blocks
from deltad.outbound.base import Channel, Closed, Context, Question
from deltad.outbound.botauth import Unauthentic, verify
from deltad.outbound.config import TeamsConfig
from deltad.outbound.courier import Handed
from deltad.outbound.slack import PRUNE_EVERY, Records, Refusal, ref_of, split
from deltad.protocol import InteractionRequest, ProtocolError, Workspace, kinds
from deltad.protocol.printable import show_path, unshow
from deltad.protocol.replies import AnswerRejected, Decision

log = structlog.get_logger("deltad.outbound.teams")
CARD = "application/vnd.microsoft.card.adaptive"
VERB = "deltad.answer"  # the Action.Execute verb of every answering button
TEXT_MAX = 2000
INVOKE = "adaptiveCard/action"
ANSWER_INPUT = "answer"  # the id of a typed answer's input (its value in `action.data`)
REASON_INPUT = "reason"  # the id of a decision's reason box
INPUT_MAX = blocks.PLAIN_INPUT_MAX


# -- the cards ------------------------------------------------------------------------------
def _text(text: str, **style: Any) -> dict[str, Any]:
    return {"type": "TextBlock", "text": blocks.cut(text, TEXT_MAX), "wrap": True, **style}


def _card(body: list[dict[str, Any]], actions: list[dict[str, Any]]) -> dict[str, Any]:
    card: dict[str, Any] = {
        "type": "AdaptiveCard",
        "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
        "version": "1.4",
        "body": body,
    }
    if actions:
        card["actions"] = actions
    return card


def activity_of(card: dict[str, Any], summary: str) -> dict[str, Any]:
    """A message activity carrying one Adaptive Card."""
    return {
        "type": "message",
        "summary": blocks.cut(summary, 150),
        "attachments": [{"contentType": CARD, "content": card}],
    }


def question_card(
    q: Question, ref: str, context_chars: int, page_url: str | None
) -> dict[str, Any]:
    """The question's card: its prompt, context, the input a typed answer or a reason needs,
    and one Action.Execute per answer (never a URL: the page is named in text, and the page
    does not answer on a GET)."""
    req = q.request
    body = [_text(f"Question: {req.prompt}", weight="Bolder")]
    ctx = req.context
    task = (ctx.task if ctx is not None and ctx.task else None) or q.task
    if task and context_chars:
        body.append(_text(f"Task: {blocks.cut(task, context_chars)}", isSubtle=True))
    if ctx is not None and ctx.last_message and context_chars:
        said = blocks.cut(ctx.last_message, context_chars)
        body.append(_text(f"The agent said: {said}", isSubtle=True))
    for c in req.calls[:10]:
        what = c.resolved_command or ", ".join(f"{k}={v!r}" for k, v in c.arguments.items())
        body.append(_text(f"Call: {blocks.cut(c.tool_name, 80)} {blocks.cut(what, 300)}"))
    body_more, actions = _answering(req, ref)
    body += body_more
    if not actions:
        where = f" ({page_url})" if page_url else ""
        why = "it asks for a secret" if req.is_secret else "it cannot be answered here"
        body.append(_text(f"Answer it on the deltad page{where}: {why}."))
    return _card(body, actions)


def _execute(title: str, ref: str, key: str, inputs: bool) -> dict[str, Any]:
    action: dict[str, Any] = {
        "type": "Action.Execute",
        "title": blocks.cut(title, blocks.BUTTON_TEXT_MAX),
        "verb": VERB,
        "data": {"deltad": ref, "choice": key},
    }
    if not inputs:
        action["associatedInputs"] = "none"  # a plain button sends no typed reason along
    return action


def _answering(req: InteractionRequest, ref: str) -> tuple[list[dict[str, Any]], list[Any]]:
    """The inputs and buttons that answer `req` (none for a secret: the page's alone)."""
    if req.is_secret:
        return [], []
    form = kinds.form(req)
    if form.control == "input":
        hint = kinds.kind_of(req.input_type).bounds(req)
        body = [_input(req, form.type or "text", form.attrs, hint)]
        if hint:
            body.append(_text(hint, isSubtle=True))
        return body, [_execute("Answer", ref, "", inputs=True)]
    actions, reasons = [], []
    for b in blocks.buttons(req):
        title = b.label.removesuffix("…")
        actions.append(_execute(title, ref, b.key, inputs=b.opens))
        if b.opens:
            reasons.append(title)
    if not reasons:
        return [], actions
    box = {
        "type": "Input.Text",
        "id": REASON_INPUT,
        "label": f"Reason, sent with {' or '.join(reasons)} (optional)",
        "isMultiline": True,
        "maxLength": INPUT_MAX,
    }
    return [box], actions


def _input(
    req: InteractionRequest, asked: str, attrs: dict[str, Any], hint: str | None
) -> dict[str, Any]:
    """The typed answer's input, as the page's form asks it (the input's type and its min/max
    hints, protocol/kinds.py: the card knows inputs, not kinds); the answering path checks
    what comes back, whatever the card allowed."""
    field: dict[str, Any] = {"id": ANSWER_INPUT, "label": "Your answer"}
    if not req.allow_empty:
        field |= {"isRequired": True, "errorMessage": "An answer is needed."}
    bounds = {k: attrs[k] for k in ("min", "max") if attrs.get(k) is not None}
    if asked == "number":
        field |= {"type": "Input.Number", **bounds}
    elif asked == "date":
        field |= {"type": "Input.Date", **bounds}
        if req.default and re.fullmatch(r"\d{4}-\d{2}-\d{2}", req.default):
            field["value"] = req.default
    else:
        field |= {"type": "Input.Text", "isMultiline": True, "maxLength": INPUT_MAX}
        if req.default:
            field["value"] = blocks.cut(req.default, INPUT_MAX)
        if hint:
            field["placeholder"] = blocks.cut(hint, 150)
    return field


def answer_of(req: InteractionRequest, key: str, data: dict[str, Any]) -> AnswerIn:
    """The answer a press stands for, rebuilt from the question: a button's, a typed one from
    the card's input, or a decision with the reason typed beside it (AnswerRejected: the card
    offers no such thing, as a hand-made activity could claim)."""
    form = kinds.form(req)
    if form.control == "input":
        if key:
            raise AnswerRejected(f"this question has no button {key!r}")
        return AnswerIn(answer=_typed(data.get(ANSWER_INPUT)) or "")
    for k in form.keys:
        if k.key == key and k.reason and k.decision not in (None, Decision.EDIT):
            assert k.decision is not None
            reason = (_typed(data.get(REASON_INPUT)) or "").strip()
            return blocks.decisions(req, k.decision, reason or None)
    return blocks.answer_of(req, key)


def _typed(value: Any) -> str | None:
    """An input's value as Teams sends it: text (a number input's may come as a number)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise AnswerRejected("the card's answer is not text")


def follow_up_activity(q: Question, config: TeamsConfig) -> dict[str, Any]:
    """A reminder or an escalation: a message naming the question, for a reply in each card's
    thread; an escalation names who it was escalated to and mentions the mapped people among
    them (by Entra object id, so Teams notifies them)."""
    prompt = blocks.escape(blocks.cut(q.request.prompt, 300))
    entities: list[dict[str, Any]] = []
    if q.follow_up == "escalation":
        names = blocks.escape(", ".join(q.only) or "more people")
        text = f"Escalated to {names}: this question is still waiting for an answer: {prompt}"
        tags = []
        for oid, name in _mentioned(config, q.only):
            tag = f"<at>{blocks.escape(name)}</at>"
            tags.append(tag)
            mentioned = {"id": oid, "name": name}
            entities.append({"type": "mention", "text": tag, "mentioned": mentioned})
        if tags:
            text += "\n\n" + ", ".join(tags)
    else:
        text = f"Reminder: this question is still waiting for an answer: {prompt}"
    activity: dict[str, Any] = {"type": "message", "text": text}
    if entities:
        activity["entities"] = entities
    return activity


def _mentioned(config: TeamsConfig, only: tuple[str, ...]) -> list[tuple[str, str]]:
    """The mapped people an escalation names: by name, or by a `group:NAME` they are in."""
    out = []
    for oid in sorted(config.people):
        p = config.person(oid)
        if p is not None and (p.name in only or any(f"group:{g}" in only for g in p.groups)):
            out.append((oid, p.name))
    return out[:20]


def closed_card(prompt: str, closed: Closed, at: datetime) -> dict[str, Any]:
    """The card once its question closed: what it asked, and how it ended."""
    when = at.strftime("%Y-%m-%d %H:%M UTC")
    if closed.how == "answered":
        who = closed.answered_by or "someone"
        via = f" ({closed.channel})" if closed.channel else ""
        line = f"Closed: answered by {who}{via} at {when}."
    elif closed.how == "expired":
        line = f"Closed: expired at {when}, unanswered."
    else:
        line = f"Closed ({closed.how}) at {when}."
    return _card([_text(f"Question: {prompt}", weight="Bolder"), _text(line)], [])


def invoke_card(card: dict[str, Any]) -> dict[str, Any]:
    """The invoke response that replaces the clicked card (Universal Actions)."""
    return {"statusCode": 200, "type": CARD, "value": card}


def invoke_message(text: str) -> dict[str, Any]:
    """The invoke response that tells the person a line, the card left as it was."""
    return {"statusCode": 200, "type": "application/vnd.microsoft.activity.message", "value": text}


# -- what Teams sends (only the fields used; it adds fields freely) --------------------------
class _Loose(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _From(_Loose):
    id: str = Field(default="", max_length=256)
    aadObjectId: str | None = Field(default=None, max_length=64)


class _Conversation(_Loose):
    id: str = Field(default="", max_length=512)


class Activity(_Loose):
    type: str = Field(max_length=64)
    id: str | None = Field(default=None, max_length=256)
    name: str | None = Field(default=None, max_length=128)
    serviceUrl: str | None = Field(default=None, max_length=2048)
    channelId: str | None = Field(default=None, max_length=64)
    from_: _From = Field(default_factory=_From, alias="from")
    conversation: _Conversation = Field(default_factory=_Conversation)
    value: Any = None

    def data(self) -> dict[str, Any]:
        """The card's data an answering click carries, the inputs' values merged in (Teams
        does so): an invoke of Action.Execute, or a message from Action.Submit; {} else."""
        data = None
        if self.type == "invoke" and self.name == INVOKE and isinstance(self.value, dict):
            action = self.value.get("action")
            if isinstance(action, dict) and action.get("verb") == VERB:
                data = action.get("data")
        elif self.type == "message" and isinstance(self.value, dict):
            data = self.value
        return data if isinstance(data, dict) else {}

    def choice(self) -> tuple[str, str] | None:
        """The question's ref and the button's key the click names (None: not ours)."""
        data = self.data()
        ref, key = data.get("deltad"), data.get("choice")
        if not isinstance(ref, str) or not isinstance(key, str):
            return None
        return ref, key

    def origin(self) -> dict[str, str]:
        out = {"user": self.from_.aadObjectId or self.from_.id}
        if self.conversation.id:
            out["conversation"] = self.conversation.id
        if self.id:
            out["activity"] = self.id
        return out


def activity_of_body(body: str) -> Activity:
    try:
        return Activity.model_validate_json(body)
    except (ValidationError, ValueError):
        raise ApiError(400, "bad_payload", "not a Bot Framework activity") from None


class TeamsChannel(Channel):
    name = "teams"

    def __init__(self, config: TeamsConfig, ctx: Context) -> None:
        self.config, self.ctx = config, ctx
        ctx.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.records = Records(ctx.state_dir / "cards")
        self._pruned = 0.0
        self.courier = Handed(self.name, ctx.hand)

    def start(self) -> None:
        self.courier.start()

    def stop(self) -> None:
        self.courier.stop()

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
                return  # told again (a restart): the card is there already
            record = {"workspace": shown, "request_id": r.request_id, "prompt": r.prompt}
            self.records.put(ref, {**record, "answered": None, "closed": None})
        page = self.ctx.page(r.request_id) if self.ctx.page is not None else None
        card = question_card(question, ref, self.config.context_chars, page)
        activity = activity_of(card, f"Question: {r.prompt}")
        for conversation in self.config.conversations:
            body = {"ref": ref, "conversation": conversation, "activity": activity}
            self.courier.put(conversation, "question", json.dumps(body))
        log.info("teams_question_queued", request_id=r.request_id, workspace=shown)

    def _follow_up(self, question: Question, ref: str) -> None:
        """A reminder or an escalation of a question posted before (docs/inbox.md, "Reminders
        and escalation"): a reply to each of its cards, which the sender skips once the
        question closed. The follow-up's record is the daemon's: each reaches here once."""
        activity = follow_up_activity(question, self.config)
        self.courier.put("reply", "reply", json.dumps({"ref": ref, "activity": activity}))
        log.info(
            "teams_follow_up_queued",
            request_id=question.request.request_id,
            follow_up=question.follow_up,
            workspace=show_path(str(question.workspace)),
        )

    def withdraw(self, closed: Closed) -> None:
        ref = ref_of(show_path(str(closed.workspace)), closed.request_id)
        at = time.time()
        fields = {"how": closed.how, "answered_by": closed.answered_by, "channel": closed.channel}
        doc = self.records.change(ref, closed={**fields, "at": at})
        if doc is None:
            return  # never posted here
        here = doc.get("answered")
        if closed.how == "answered" and isinstance(here, dict):  # here: who pressed, known now
            closed = Closed(closed.workspace, closed.request_id, "answered", here["by"], self.name)
        card = closed_card(str(doc["prompt"]), closed, datetime.fromtimestamp(at, UTC))
        activity = activity_of(card, f"Closed: {doc['prompt']}")
        self.courier.put("update", "update", json.dumps({"ref": ref, "activity": activity}))
        log.info("teams_card_closed", request_id=closed.request_id, how=closed.how)

    # -- taking answers in (the core's call threads) ----------------------------------------
    def interaction(self, body: str, token: str, keys: str) -> dict[str, Any]:
        """One activity from Teams as the inbox relayed it, with its bearer token and the key
        set the inbox checked it with: `{"response": ...}` (the invoke response; None: an
        empty 200), or ApiError (401/403: not signed for this bot; 400: no activity)."""
        activity = activity_of_body(body)
        try:
            key_set = json.loads(keys)
            if not isinstance(key_set, dict):
                raise ValueError("not a key set")
        except ValueError:
            key_set = {}
        try:
            verify(token, key_set, self.config.app_id, activity.serviceUrl, activity.channelId)
        except Unauthentic as e:
            log.warning("teams_activity_refused", code=e.code, reason=str(e))
            raise ApiError(e.http, e.code, str(e)) from None
        chosen = activity.choice()
        if chosen is None:
            return {"response": None}  # nothing of ours (a message, a conversation update)
        invoked = activity.type == "invoke"
        try:
            ref, _ = split(chosen[0] + ":")
            ws, req, record = self._allowed(ref, activity)
            try:
                answer = answer_of(req, chosen[1], activity.data())
            except AnswerRejected as e:
                raise Refusal("misfit", str(e)) from None
            done = self._answer(ws, req, answer, activity, ref)
        except Refusal as r:
            self._refused(activity, chosen[0], r)
            return {"response": invoke_message(f"Not taken: {r}") if invoked else None}
        if not invoked:
            return {"response": None}
        if not done:
            return {
                "response": invoke_message("Your vote is counted; the question waits for more.")
            }
        who = self._person(activity)
        closed = Closed(ws, req.request_id, "answered", who, self.name)
        card = closed_card(str(record["prompt"]), closed, datetime.now(UTC))
        return {"response": invoke_card(card)}

    def _person(self, activity: Activity) -> str | None:
        oid = activity.from_.aadObjectId
        p = self.config.person(oid) if oid else None
        return p.name if p is not None else None

    def _allowed(
        self, ref: str, activity: Activity
    ) -> tuple[Path, InteractionRequest, dict[str, Any]]:
        record = self.records.get(ref)
        if record is None:
            raise Refusal("unknown_question", "this card names no question of this deltad")
        if (answered := record.get("answered")) is not None:
            raise Refusal(
                "replayed", f"already answered by {answered['by']} in Teams; nothing changed"
            )
        if (closed := record.get("closed")) is not None:
            if closed["how"] == "expired":
                raise Refusal("expired", "this question expired; nothing changed")
            who = closed.get("answered_by") or "someone"
            via = f" ({closed['channel']})" if closed.get("channel") else ""
            raise Refusal("closed", f"already answered by {who}{via}; nothing changed")
        oid = activity.from_.aadObjectId
        person = self.config.person(oid) if oid else None
        if person is None:
            raise Refusal(
                "not_mapped",
                f"{oid or 'this user'} is not a deltad user here (channels.teams.people)",
            )
        ws = Path(unshow(record["workspace"]))
        try:
            req = self.ctx.question(Workspace(ws), record["request_id"])
        except SubmitError as e:
            raise Refusal(e.code, f"{e}; nothing changed") from None
        except (ProtocolError, OSError) as e:
            raise Refusal(
                "workspace_problem", f"the workspace cannot take an answer: {e}"
            ) from None
        denied = refuse_respondent(
            Workspace(ws), req.request_id, Answerer(person.name, tuple(person.groups))
        )
        if denied is not None:
            raise Refusal("not_a_respondent", denied)
        if req.is_secret:
            raise Refusal("secret", "a secret is never answered in Teams: use the page")
        return ws, req, record

    def _answer(
        self, ws: Path, req: InteractionRequest, body: AnswerIn, activity: Activity, ref: str
    ) -> bool:
        """Answered (True), or a vote counted on a question that needs several (False)."""
        name = self._person(activity)
        with self.records.lock:  # one answer from this channel at a time per deltad
            record = self.records.get(ref)
            if record is not None and record.get("answered"):
                raise Refusal("replayed", "already answered in Teams; nothing changed")
            try:
                done = self.ctx.answer(
                    ws,
                    req.request_id,
                    body,
                    answered_by=name,
                    channel=self.name,
                    voter=name,
                    origin=activity.origin(),
                )
            except SubmitError as e:
                raise Refusal(e.code, f"{e}; nothing changed", audited=True) from None
            except (ProtocolError, OSError) as e:
                raise Refusal(
                    "workspace_problem", f"the workspace cannot take an answer: {e}"
                ) from None
            if done is None:
                log.info("teams_voted", request_id=req.request_id, voter=name)
                return False
            self.records.change(ref, answered={"by": name, "at": time.time()})
        log.info(
            "teams_answered",
            request_id=req.request_id,
            workspace=show_path(str(ws)),
            answered_by=name,
        )
        return True

    def _refused(self, activity: Activity, ref: str, r: Refusal) -> None:
        user = activity.from_.aadObjectId or activity.from_.id
        log.warning("teams_action_refused", code=r.code, reason=str(r), user=user)
        if r.audited or self.ctx.refused is None:
            return
        try:
            record = self.records.get(split(ref + ":")[0])
        except Refusal:  # names no question of ours: nothing to put on record
            record = None
        if record is None:
            return
        try:
            ws = Path(unshow(record["workspace"]))
            self.ctx.refused(ws, record["request_id"], r.code, str(r), user, activity.origin())
        except Exception as err:  # the refusal stands; a log that cannot take it says so
            log.error("audit_failed", error=str(err))
