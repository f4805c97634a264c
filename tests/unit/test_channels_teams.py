"""The Teams channel's rules: the Bot Connector JWT checks and key fetching
(deltad/outbound/botauth.py), the cards (deltad/outbound/teams.py), and the sender's calls
(deltad/outbound/senders.py, `TeamsSender`), the services driven by functions through httpx's
transport seam. End to end against a stand-in: tests/e2e/test_teams_channel.py."""

from __future__ import annotations

import dataclasses
import json
import time
import urllib.parse
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from deltad import wire
from deltad.inbox.answer_body import AnswerIn
from deltad.inbox.handlers import ApiError
from deltad.outbound import botauth
from deltad.outbound.base import Closed, Context, Question
from deltad.outbound.botauth import BotKeys, Unauthentic, verify
from deltad.outbound.config import TeamsConfig
from deltad.outbound.courier import new_message
from deltad.outbound.outbox import Delivery
from deltad.outbound.senders import KEEP_CLOSED, SenderError, TeamsSender
from deltad.outbound.teams import (
    ANSWER_INPUT,
    REASON_INPUT,
    TeamsChannel,
    answer_of,
    closed_card,
    question_card,
)
from deltad.protocol import InteractionRequest
from deltad.protocol.replies import AnswerRejected
from tests.support.teams import card_problems, reply_problems

APP = "6d4c8a2e-1f0b-4c3a-9e7d-5b2a1c0d9e8f"
SERVICE = "https://smba.example/amer/"
KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
OTHER = rsa.generate_private_key(public_exponent=65537, key_size=2048)
KEYS = {
    "keys": [
        {
            **RSAAlgorithm.to_jwk(KEY.public_key(), as_dict=True),
            "kid": "k1",
            "endorsements": ["msteams"],
        }
    ]
}
ALICE = "a11ce000-0000-4000-8000-000000000001"
PASSWORD = "the-app-password-0123456789"


def _token(key: Any = KEY, kid: str = "k1", alg: str = "RS256", **claims: Any) -> str:
    now = int(time.time())
    body = {"iss": botauth.ISSUER, "aud": APP, "serviceUrl": SERVICE, "nbf": now, "exp": now + 600}
    body = {k: v for k, v in (body | claims).items() if v is not None}
    return jwt.encode(body, key, algorithm=alg, headers={"kid": kid})


def test_a_token_the_bot_connector_signed_for_this_bot_verifies() -> None:
    claims = verify(_token(), KEYS, APP, SERVICE, "msteams")
    assert claims["serviceUrl"] == SERVICE and claims["aud"] == APP


@pytest.mark.parametrize(
    ("token", "code", "http"),
    [
        (lambda: _token(aud="another-bot"), "wrong_audience", 403),
        (lambda: _token(iss="https://sts.windows.net/x/"), "wrong_issuer", 403),
        (lambda: _token(exp=int(time.time()) - 6 * 60), "expired", 401),
        (lambda: _token(nbf=int(time.time()) + 10 * 60), "not_yet_valid", 401),
        (lambda: _token(serviceUrl="https://elsewhere.example/"), "service_url_mismatch", 403),
        (lambda: _token(serviceUrl=None), "service_url_mismatch", 403),
        (lambda: _token(exp=None), "bad_token", 401),  # no expiry: refused
        (lambda: _token(aud=None), "bad_token", 401),
        (lambda: _token(key=OTHER), "bad_signature", 401),  # its kid, another key
        (lambda: _token(key=OTHER, kid="k9"), "unknown_key", 401),
        (lambda: _token(key="a-shared-secret-of-32-bytes-0123", alg="HS256"), "bad_token", 401),
        (lambda: "not.a.jwt", "bad_token", 401),
    ],
)
def test_tokens_not_signed_for_this_bot_are_refused(token: Any, code: str, http: int) -> None:
    with pytest.raises(Unauthentic) as e:
        verify(token(), KEYS, APP, SERVICE, "msteams")
    assert (e.value.code, e.value.http) == (code, http)


def test_five_minutes_of_clock_skew_are_allowed_and_no_more() -> None:
    now = int(time.time())
    verify(_token(exp=now - 4 * 60), KEYS, APP, SERVICE)
    verify(_token(nbf=now + 4 * 60), KEYS, APP, SERVICE)
    with pytest.raises(Unauthentic, match="expired"):
        verify(_token(exp=now - 6 * 60), KEYS, APP, SERVICE)


def test_a_key_endorsed_for_other_channels_signs_nothing_for_teams() -> None:
    with pytest.raises(Unauthentic) as e:
        verify(_token(), KEYS, APP, SERVICE, "skype")
    assert e.value.code == "not_endorsed"


def _keys_service(calls: list[str], fail: bool = False) -> httpx.Client:
    def api(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        if fail:
            return httpx.Response(500)
        if request.url.path == "/v1/.well-known/openidconfiguration":
            return httpx.Response(200, json={"jwks_uri": "https://login.example/v1/keys"})
        return httpx.Response(200, json=KEYS)

    return httpx.Client(transport=httpx.MockTransport(api))


def test_keys_are_fetched_from_the_metadata_kept_and_refetched_for_a_new_kid_at_most_once() -> None:
    calls: list[str] = []
    keys = BotKeys(
        "https://login.example/v1/.well-known/openidconfiguration", 5, _keys_service(calls)
    )
    assert keys.for_kid("k1") == KEYS
    assert calls == ["/v1/.well-known/openidconfiguration", "/v1/keys"]
    assert keys.for_kid("k1") == KEYS  # kept
    assert len(calls) == 2
    keys._tried -= botauth.REFETCH_SECONDS  # a minute on: an unknown kid fetches them again
    keys.for_kid("k9")
    assert len(calls) == 4
    for _ in range(5):  # but not again within the minute, however many tokens name it
        keys.for_kid("k9")
    assert len(calls) == 4


def test_keys_that_cannot_be_had_are_an_oserror_and_kept_ones_outlive_an_outage() -> None:
    url = "https://login.example/v1/.well-known/openidconfiguration"
    with pytest.raises(OSError, match="could not be fetched"):
        BotKeys(url, 5, _keys_service([], fail=True)).for_kid("k1")
    keys = BotKeys(url, 5, _keys_service([]))
    keys.for_kid("k1")
    keys.client = _keys_service([], fail=True)
    keys._tried -= botauth.REFETCH_SECONDS
    assert keys.for_kid("k9") == KEYS


# -- the cards ------------------------------------------------------------------------------
def _request(**more: Any) -> InteractionRequest:
    more.setdefault("prompt", "Ship it?")
    return InteractionRequest(
        run_id="20260101_000000_abcdef",
        action_id="act_1",
        request_id="req_1",
        timestamp=datetime(2026, 1, 1, tzinfo=UTC),
        **more,
    )


def test_a_choice_question_gets_execute_buttons_and_no_url() -> None:
    options = [{"key": "Y", "label": "yes"}, {"key": "N", "label": "no"}]
    q = Question(Path("/srv/ws"), _request(input_type="choice", options=options), task="t")
    card = question_card(q, "a" * 32, 600, "https://inbox.example/#request=req_1")
    actions = card["actions"]
    assert [(a["type"], a["title"], a["data"]) for a in actions] == [
        ("Action.Execute", "yes", {"deltad": "a" * 32, "choice": "Y"}),
        ("Action.Execute", "no", {"deltad": "a" * 32, "choice": "N"}),
    ]
    assert "https://" not in json.dumps(card)  # the page is needed by nobody: buttons answer
    activity = {
        "type": "message",
        "attachments": [{"contentType": botauth_card(), "content": card}],
    }
    assert card_problems(activity) == []


def botauth_card() -> str:
    from deltad.outbound.teams import CARD

    return CARD


def _as_sent(card: dict[str, Any]) -> dict[str, Any]:
    return {"type": "message", "attachments": [{"contentType": botauth_card(), "content": card}]}


def _inputs(card: dict[str, Any]) -> list[dict[str, Any]]:
    return [b for b in card["body"] if b["type"].startswith("Input.")]


@pytest.mark.parametrize(
    ("more", "control"),
    [
        ({"input_type": "text", "default": "Tuesday"}, {"type": "Input.Text", "value": "Tuesday"}),
        ({"input_type": "number", "minimum": 1, "maximum": 9}, {"type": "Input.Number", "min": 1}),
        ({"input_type": "date", "default": "2026-01-02"}, {"type": "Input.Date"}),
        ({"input_type": "text", "allow_empty": True}, {"type": "Input.Text"}),
    ],
)
def test_a_typed_question_gets_its_input_and_one_answer_button(
    more: dict[str, Any], control: dict[str, Any]
) -> None:
    q = Question(Path("/srv/ws"), _request(**more))
    card = question_card(q, "a" * 32, 600, "https://inbox.example/#request=req_1")
    [field] = _inputs(card)
    assert field["id"] == ANSWER_INPUT and field.items() >= control.items()
    assert field.get("isRequired", False) is not more.get("allow_empty", False)
    [button] = card["actions"]
    assert button["type"] == "Action.Execute" and button["data"] == {
        "deltad": "a" * 32,
        "choice": "",
    }
    assert "associatedInputs" not in button  # its input goes along (Teams' default: auto)
    assert card_problems(_as_sent(card)) == [] and "https://" not in json.dumps(card)


@pytest.mark.parametrize(
    "more", [{"input_type": "password"}, {"input_type": "text", "sensitive": True}]
)
def test_a_secret_gets_no_input_and_no_button_and_names_the_page_in_text_only(
    more: dict[str, Any],
) -> None:
    q = Question(Path("/srv/ws"), _request(**more))
    card = question_card(q, "a" * 32, 600, "https://inbox.example/#request=req_1")
    assert "actions" not in card and _inputs(card) == []
    assert "https://inbox.example/#request=req_1" in card["body"][-1]["text"]
    assert "secret" in card["body"][-1]["text"]
    closed = closed_card("Ship it?", Closed(Path("/srv/ws"), "req_1", "expired"), datetime.now(UTC))
    assert "actions" not in closed and "expired" in json.dumps(closed)


def _approval() -> InteractionRequest:
    calls = [
        {"action_id": "call_1", "tool_name": "shell", "arguments": {"cmd": "make deploy"}},
        {"action_id": "call_2", "tool_name": "shell", "arguments": {"cmd": "make tag"}},
    ]
    return _request(input_type="approval", calls=calls)


def test_an_approval_gets_a_reason_box_that_goes_with_reject_only() -> None:
    card = question_card(Question(Path("/srv/ws"), _approval()), "a" * 32, 600, None)
    [box] = _inputs(card)
    assert (box["type"], box["id"]) == ("Input.Text", REASON_INPUT) and "Reject" in box["label"]
    by_title = {a["title"]: a for a in card["actions"]}
    assert set(by_title) == {"Approve", "Reject", "Cancel run"}
    assert "associatedInputs" not in by_title["Reject"]
    assert by_title["Approve"]["associatedInputs"] == "none"
    assert card_problems(_as_sent(card)) == []


def test_an_answer_is_rebuilt_from_the_question_and_the_cards_inputs() -> None:
    text = _request(input_type="text")
    assert answer_of(text, "", {ANSWER_INPUT: "on Tuesday"}).answer == "on Tuesday"
    assert answer_of(text, "", {}).answer == ""  # nothing typed: the answering path decides
    number = _request(input_type="number")
    assert answer_of(number, "", {ANSWER_INPUT: 7}).answer == "7"
    with pytest.raises(AnswerRejected):
        answer_of(text, "Y", {ANSWER_INPUT: "x"})  # no such button on a typed question
    with pytest.raises(AnswerRejected):
        answer_of(text, "", {ANSWER_INPUT: {"not": "text"}})
    approval = _approval()
    rejected = answer_of(approval, "r", {REASON_INPUT: "  not on a Friday "})
    assert rejected.decisions is not None
    assert [(d.decision.value, d.reason) for d in rejected.decisions] == [
        ("reject", "not on a Friday"),
        ("reject", "not on a Friday"),
    ]
    bare = answer_of(approval, "r", {REASON_INPUT: "  "})
    assert bare.decisions is not None and {d.reason for d in bare.decisions} == {None}
    approved = answer_of(approval, "a", {REASON_INPUT: "ignored"})
    assert approved.decisions is not None and {d.reason for d in approved.decisions} == {None}


BOB = "b0b00000-0000-4000-8000-000000000002"
CAROL = "ca201000-0000-4000-8000-000000000003"


def _channel(
    tmp: Path, answered: list[dict[str, Any]], req: InteractionRequest | None = None
) -> tuple[TeamsChannel, list[Delivery]]:
    handed: list[Delivery] = []
    config = TeamsConfig.model_validate(
        {
            "app_id": APP,
            "app_password": {"secret_env": "UNUSED"},
            "service_url": SERVICE,
            "conversations": ["19:a@thread.tacv2", "19:b@thread.tacv2"],
            "people": {
                ALICE: "alice",
                BOB: "bob",
                CAROL: {"name": "carol", "groups": ["ops"]},
            },
        }
    )

    def answer(ws: Path, rid: str | None, body: AnswerIn, **kw: Any) -> object:
        answered.append({"rid": rid, "body": body, **kw})
        return object()

    options = [{"key": "Y", "label": "yes"}, {"key": "N", "label": "no"}]
    asked = req or _request(input_type="choice", options=options)
    ctx = Context(tmp / "teams", answer, handed.append, question=lambda ws, rid: asked)  # type: ignore[arg-type]
    return TeamsChannel(config, ctx), handed


def test_a_question_is_one_card_per_conversation_and_its_closing_one_update(tmp_path: Path) -> None:
    teams, handed = _channel(tmp_path, [])
    options = [{"key": "Y", "label": "yes"}]
    q = Question(tmp_path / "ws", _request(input_type="choice", options=options))
    teams.send(q)
    teams.send(q)  # told again: posted once
    assert [d.url for d in handed] == ["19:a@thread.tacv2", "19:b@thread.tacv2"]
    assert all(card_problems(json.loads(d.body)["activity"]) == [] for d in handed)
    teams.withdraw(Closed(tmp_path / "other", "req_1", "answered"))  # never posted: nothing
    assert len(handed) == 2
    teams.withdraw(Closed(tmp_path / "ws", "req_1", "answered", "bob", "http"))
    [update] = handed[2:]
    assert update.event == "update" and "answered by bob (http)" in update.body


def test_a_signed_action_submit_message_answers_as_the_mapped_person(tmp_path: Path) -> None:
    answered: list[dict[str, Any]] = []
    teams, handed = _channel(tmp_path, answered)
    options = [{"key": "Y", "label": "yes"}, {"key": "N", "label": "no"}]
    (tmp_path / "ws").mkdir()
    teams.send(Question(tmp_path / "ws", _request(input_type="choice", options=options)))
    ref = json.loads(handed[0].body)["activity"]["attachments"][0]["content"]["actions"][0]
    data = ref["data"]
    activity = {
        "type": "message",
        "channelId": "msteams",
        "serviceUrl": SERVICE,
        "from": {"id": "29:x", "aadObjectId": ALICE.upper()},
        "value": data,
    }
    body = json.dumps(activity)
    with pytest.raises(ApiError) as refused:
        teams.interaction(body, _token(aud="other"), json.dumps(KEYS))
    assert (refused.value.http, refused.value.code) == (403, "wrong_audience")
    with pytest.raises(ApiError) as refused:  # the inbox's keys are checked too: none, none
        teams.interaction(body, _token(), json.dumps({"keys": []}))
    assert refused.value.http == 401 and answered == []
    assert teams.interaction(body, _token(), json.dumps(KEYS)) == {"response": None}
    [a] = answered
    assert (a["answered_by"], a["channel"], a["body"].answer) == ("alice", "teams", "Y")


def _press(data: dict[str, Any], who: str = ALICE) -> str:
    return json.dumps(
        {
            "type": "invoke",
            "name": "adaptiveCard/action",
            "channelId": "msteams",
            "serviceUrl": SERVICE,
            "from": {"id": "29:x", "aadObjectId": who},
            "value": {"action": {"type": "Action.Execute", "verb": "deltad.answer", "data": data}},
        }
    )


def test_a_typed_answer_is_taken_from_the_signed_invokes_data(tmp_path: Path) -> None:
    answered: list[dict[str, Any]] = []
    req = _request(input_type="text")
    teams, handed = _channel(tmp_path, answered, req)
    (tmp_path / "ws").mkdir()
    teams.send(Question(tmp_path / "ws", req))
    card = json.loads(handed[0].body)["activity"]["attachments"][0]["content"]
    [button] = card["actions"]
    data = button["data"] | {ANSWER_INPUT: "after the freeze"}
    # Not a text: refused in the invoke's response, nothing answered.
    r = teams.interaction(
        _press(button["data"] | {ANSWER_INPUT: ["x"]}), _token(), json.dumps(KEYS)
    )
    assert r["response"]["value"].startswith("Not taken") and answered == []
    r = teams.interaction(_press(data), _token(), json.dumps(KEYS))
    assert r["response"]["type"] == "application/vnd.microsoft.card.adaptive"
    [a] = answered
    assert (a["answered_by"], a["channel"], a["body"].answer) == (
        "alice",
        "teams",
        "after the freeze",
    )


def test_a_reason_typed_beside_reject_goes_with_the_decision(tmp_path: Path) -> None:
    answered: list[dict[str, Any]] = []
    teams, handed = _channel(tmp_path, answered, _approval())
    (tmp_path / "ws").mkdir()
    teams.send(Question(tmp_path / "ws", _approval()))
    card = json.loads(handed[0].body)["activity"]["attachments"][0]["content"]
    [reject] = [a for a in card["actions"] if a["title"] == "Reject"]
    teams.interaction(
        _press(reject["data"] | {REASON_INPUT: "not on a Friday"}), _token(), json.dumps(KEYS)
    )
    [a] = answered
    assert {(d.decision.value, d.reason) for d in a["body"].decisions} == {
        ("reject", "not on a Friday")
    }


def _replies(handed: list[Delivery]) -> list[dict[str, Any]]:
    return [json.loads(d.body) for d in handed if d.event == "reply"]


def test_a_reminder_and_an_escalation_are_replies_to_the_cards(tmp_path: Path) -> None:
    teams, handed = _channel(tmp_path, [])
    q = Question(tmp_path / "ws", _request(input_type="yes_no", prompt="Ship <it> & go?"))
    teams.send(dataclasses.replace(q, follow_up="reminder"))  # never posted: the card is posted
    assert [d.event for d in handed] == ["question", "question"]
    teams.send(dataclasses.replace(q, follow_up="reminder"))
    [reminder] = _replies(handed)
    assert handed[-1].url == "reply" and "entities" not in reminder["activity"]
    text = reminder["activity"]["text"]
    assert text.startswith("Reminder:") and "Ship &lt;it&gt; &amp; go?" in text
    only = ("bob", "group:ops", "dave")
    teams.send(dataclasses.replace(q, follow_up="escalation", only=only))
    escalation = _replies(handed)[1]["activity"]
    assert escalation["text"].startswith("Escalated to bob, group:ops, dave:")
    # The mapped people among them are mentioned (bob by name, carol by her group): Teams
    # notifies them; dave maps to nobody and is named only.
    assert [(e["mentioned"]["id"], e["text"]) for e in escalation["entities"]] == [
        (BOB, "<at>bob</at>"),
        (CAROL, "<at>carol</at>"),
    ]
    assert reply_problems({**escalation, "replyToId": "1"}, "1", {"1"}) == []
    assert len([d for d in handed if d.event == "question"]) == 2  # no card posted again


def test_closed_records_are_pruned_and_open_ones_kept(tmp_path: Path) -> None:
    teams, _ = _channel(tmp_path, [])
    cards = tmp_path / "teams" / "cards"
    old = time.time() - KEEP_CLOSED - 60
    (cards / ("0" * 32 + ".json")).write_text(json.dumps({"closed": {"how": "expired", "at": old}}))
    (cards / ("1" * 32 + ".json")).write_text(json.dumps({"closed": None, "prompt": "open"}))
    recent = {"closed": {"how": "expired", "at": time.time()}}
    (cards / ("2" * 32 + ".json")).write_text(json.dumps(recent))
    teams.send(Question(tmp_path / "ws", _request(input_type="yes_no")))  # prunes, hourly
    left = {f.name for f in cards.iterdir()}
    assert "0" * 32 + ".json" not in left  # closed 30 days ago: gone
    assert {"1" * 32 + ".json", "2" * 32 + ".json"} < left and len(left) == 3  # and the new one
    # The sender's record of posts, likewise, as a question closes.
    bot = _Bot()
    send = _send(tmp_path, bot)
    posts = tmp_path / "posts"
    stale = {"posts": [{"conversation": "19:a", "id": "1:x"}], "closed": {}, "at": old}
    (posts / ("3" * 32 + ".json")).write_text(json.dumps(stale | {"closed": {"activity": {}}}))
    (posts / ("4" * 32 + ".json")).write_text(json.dumps(stale | {"closed": None}))
    update = {"ref": "5" * 32, "activity": _activity("x")}
    send.queued(new_message("update", "update", json.dumps(update), 0))
    assert sorted(f.name[:1] for f in posts.iterdir()) == ["4", "5"]


# -- the sender -----------------------------------------------------------------------------
def _target(**settings: Any) -> wire.ChannelTarget:
    return wire.ChannelTarget(
        name="teams",
        key="teams",
        kind="teams",
        settings={
            "app_id": APP,
            "service_url": SERVICE,
            "token_url": "https://login.example/token",
            "openid_metadata_url": "https://login.example/meta",
            "timeout_seconds": 5.0,
        }
        | settings,
        secret=PASSWORD,
        max_attempts=3,
        backoff_seconds=1.0,
        backoff_max_seconds=5.0,
        max_age_seconds=60.0,
        outbox_max=10,
    )


class _Bot:
    """The token endpoint and the Bot Connector, as functions."""

    def __init__(self, statuses: list[int] | None = None, token_status: int = 200) -> None:
        self.statuses = statuses or []
        self.token_status = token_status
        self.calls: list[tuple[str, str, str, Any]] = []
        self.tokens = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/token":
            form = dict(urllib.parse.parse_qsl(request.content.decode()))
            assert form["client_secret"] == PASSWORD and form["client_id"] == APP
            self.tokens += 1
            if self.token_status != 200:
                return httpx.Response(self.token_status, json={"error": "invalid_client"})
            return httpx.Response(200, json={"access_token": f"t{self.tokens}", "expires_in": 3600})
        auth = request.headers["authorization"]
        self.calls.append(
            (request.method, request.url.raw_path.decode(), auth, json.loads(request.content))
        )
        status = (
            self.statuses.pop(0) if self.statuses else (201 if request.method == "POST" else 200)
        )
        return httpx.Response(status, json={"id": "1:act-7"})


def _send(tmp: Path, bot: _Bot) -> TeamsSender:
    return TeamsSender(_target(), tmp / "posts", httpx.Client(transport=httpx.MockTransport(bot)))


def _activity(text: str) -> dict[str, Any]:
    card = {"type": "AdaptiveCard", "version": "1.4", "body": [{"type": "TextBlock", "text": text}]}
    return {"type": "message", "attachments": [{"contentType": botauth_card(), "content": card}]}


def test_a_card_is_posted_with_a_bot_token_and_updated_over_its_activity(tmp_path: Path) -> None:
    bot = _Bot()
    send = _send(tmp_path, bot)
    ref = "b" * 32
    post = {"ref": ref, "conversation": "19:a@thread.tacv2", "activity": _activity("q")}
    assert send(new_message("19:a@thread.tacv2", "question", json.dumps(post), 0)) is None
    update = new_message(
        "update", "update", json.dumps({"ref": ref, "activity": _activity("x")}), 0
    )
    send.queued(update)
    assert send(update) is None
    assert send(update) is None  # again (a retry after a crash): updated once
    assert bot.tokens == 1  # kept between calls
    assert [(m, p, a) for m, p, a, _ in bot.calls] == [
        ("POST", "/amer/v3/conversations/19%3Aa%40thread.tacv2/activities", "Bearer t1"),
        ("PUT", "/amer/v3/conversations/19%3Aa%40thread.tacv2/activities/1%3Aact-7", "Bearer t1"),
    ]
    assert bot.calls[1][3]["id"] == "1:act-7"
    for f in (tmp_path / "posts").iterdir():
        assert PASSWORD not in f.read_text()


def test_a_follow_up_is_a_reply_to_each_post_once_and_none_once_closed(tmp_path: Path) -> None:
    bot = _Bot()
    send = _send(tmp_path, bot)
    ref = "f" * 32
    note = {"type": "message", "text": "Reminder: this question is still waiting: q"}
    reply = new_message("reply", "reply", json.dumps({"ref": ref, "activity": note}), 0)
    early = send(reply)  # its card not posted yet: retried, not lost
    assert early is not None and not early.permanent and bot.calls == []
    post = {"ref": ref, "conversation": "19:a@thread.tacv2", "activity": _activity("q")}
    assert send(new_message("19:a@thread.tacv2", "question", json.dumps(post), 0)) is None
    assert send(reply) is None
    assert send(reply) is None  # again (a retry after a crash): replied once
    method, path, _, body = bot.calls[-1]
    assert (method, path) == (
        "POST",
        "/amer/v3/conversations/19%3Aa%40thread.tacv2/activities/1%3Aact-7",
    )
    assert body == note | {"replyToId": "1:act-7"} and len(bot.calls) == 2
    assert reply_problems(body, "1:act-7", {"1:act-7"}) == []
    update = new_message(
        "update", "update", json.dumps({"ref": ref, "activity": _activity("x")}), 0
    )
    send.queued(update)
    later = new_message("reply", "reply", json.dumps({"ref": ref, "activity": note}), 0)
    assert send(later) is None and len(bot.calls) == 2  # closed meanwhile: no reminder


def test_a_question_closed_before_it_was_posted_is_posted_closed(tmp_path: Path) -> None:
    bot = _Bot()
    send = _send(tmp_path, bot)
    ref = "c" * 32
    update = new_message(
        "update", "update", json.dumps({"ref": ref, "activity": _activity("x")}), 0
    )
    send.queued(update)
    post = {"ref": ref, "conversation": "19:a@thread.tacv2", "activity": _activity("q")}
    assert send(new_message("19:a@thread.tacv2", "question", json.dumps(post), 0)) is None
    assert bot.calls[0][3]["attachments"][0]["content"]["body"][0]["text"] == "x"


@pytest.mark.parametrize(
    ("status", "permanent", "tokens"),
    [
        (429, False, 1),  # throttled: retried
        (500, False, 1),
        (503, False, 1),
        (400, True, 1),  # a bad activity: a retry cannot mend it
        (403, True, 1),
        (404, True, 1),
        (401, False, 2),  # the token refused: fetched anew for the retry
    ],
)
def test_the_connectors_answers_retry_or_dead_letter(
    tmp_path: Path, status: int, permanent: bool, tokens: int
) -> None:
    bot = _Bot([status])
    send = _send(tmp_path, bot)
    post = {"ref": "d" * 32, "conversation": "19:a", "activity": _activity("q")}
    d = new_message("19:a", "question", json.dumps(post), 0)
    failed = send(d)
    assert failed is not None and failed.permanent == permanent
    assert send(d) is None  # the next attempt goes through
    assert bot.tokens == tokens


def test_a_refused_app_password_is_dead_lettered_and_a_sender_needs_its_settings(
    tmp_path: Path,
) -> None:
    send = _send(tmp_path, _Bot(token_status=401))
    post = {"ref": "e" * 32, "conversation": "19:a", "activity": _activity("q")}
    failed = send(new_message("19:a", "question", json.dumps(post), 0))
    assert failed is not None and failed.permanent and PASSWORD not in failed.why
    with pytest.raises(SenderError, match="no app password"):
        TeamsSender(_target().model_copy(update={"secret": None}), tmp_path / "p")
    with pytest.raises(SenderError, match="the Teams settings"):
        TeamsSender(_target().model_copy(update={"settings": {}}), tmp_path / "p")


def test_the_documented_teams_example_is_valid() -> None:
    """config/deltad.yaml's commented `teams:` block, uncommented, is a valid section."""
    import yaml

    from deltad.outbound.config import ChannelsConfig

    text = (Path(__file__).resolve().parents[2] / "config" / "deltad.yaml").read_text()
    block = text[text.index("# channels:\n") :].split("\n\n")[0]
    doc = yaml.safe_load("\n".join(line.removeprefix("# ") for line in block.splitlines()))
    teams = ChannelsConfig.model_validate(doc["channels"]).teams
    assert teams is not None and teams.person("A11CE000-0000-4000-8000-000000000001") is not None
    assert teams.openid_metadata_url.startswith("https://login.botframework.com/")


def test_the_endpoint_takes_the_bot_connectors_bearer_on_post_only() -> None:
    """Its bearer is a Bot Connector JWT, not a deltad token: no token check before the body
    on POST; any other method is an API route's, refused without a deltad token."""
    from deltad.http import limits

    assert limits.rule_for("POST", "/v1/channels/teams/messages").credential == "none"
    assert limits.rule_for("GET", "/v1/channels/teams/messages").credential == "token"
