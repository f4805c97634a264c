"""The Microsoft Teams channel end to end: a real `deltad serve --listen` posts a question as an
Adaptive Card through a stand-in for the Bot Connector on 127.0.0.1 (tests/support/teams.py:
OpenID metadata and keys, the token endpoint, the conversation's activities), which also signs
the invoke a button press sends to deltad's endpoint. A signed Action.Execute answers and the
run resumes; the card is then replaced by a closed one, also when the question was answered
elsewhere. Unsigned, wrong-audience, expired and other-key activities are refused and answer
nothing; a GET never answers. No file the daemon or the inbox writes, and no log, holds the app
password. A reminder and an escalation are replies to the card (the escalation mentions whom it
went to, who may then answer); a typed answer comes from the card's input, checked by the
answering path; a secret gets no input. Nothing leaves 127.0.0.1."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from deltad.protocol.followup import FollowUp
from deltad.testing.stub import paused_workspace
from tests.support.daemon import Daemon, metadata_status, wait_for
from tests.support.inbox import client, http_url, make_token
from tests.support.teams import BotService

APP_ID = "6d4c8a2e-1f0b-4c3a-9e7d-5b2a1c0d9e8f"
PASSWORD = "app-password-of-the-test-never-logged-0123"
ALICE = "a11ce000-0000-4000-8000-000000000001"
MALLORY = "3a11047f-0000-4000-8000-000000000002"  # mapped, but no respondent
EVE = "e0e00000-0000-4000-8000-000000000003"  # not mapped
BOB = "b0b00000-0000-4000-8000-000000000004"  # mapped; a respondent once escalated to
# Follow-ups a second apart: the daemon's floor lowered (60 s by default) for the test's sake.
FAST = {"min_interval_seconds": 1, "max_per_hour": 60}
ENDPOINT = "/v1/channels/teams/messages"
CONVERSATION = "19:deltad-questions@thread.tacv2"


@pytest.fixture
def bot() -> Iterator[BotService]:
    with BotService(app_id=APP_ID, password=PASSWORD, throttle=1) as svc:
        yield svc


def _daemon(tmp: Path, svc: BotService, **more: Any) -> Daemon:
    (tmp / "root").mkdir(parents=True)
    secret = tmp / "teams-password"
    secret.write_text(PASSWORD + "\n")
    secret.chmod(0o600)
    channel = {
        "app_id": APP_ID,
        "app_password": {"secret_file": str(secret)},
        "service_url": svc.service_url,
        "conversations": [CONVERSATION],
        "people": {ALICE: "alice", MALLORY: "mallory", BOB: "bob"},
        "openid_metadata_url": svc.metadata_url,
        "token_url": svc.token_url,
        "outbox": {"backoff_seconds": 0.2, "backoff_max_seconds": 0.5},
    }
    return Daemon(
        tmp, [tmp / "root"], http={"listen": "127.0.0.1:0"}, channels={"teams": channel}, **more
    )


def _ask(tmp: Path, name: str, prompt: str, **question: Any) -> tuple[Path, str]:
    ws = tmp / "root" / name
    question.setdefault("input_type", "choice")
    if question["input_type"] == "choice":
        question["options"] = [{"key": "Y", "label": "yes"}, {"key": "N", "label": "no"}]
    paused_workspace(ws, prompt, respondents=["alice"], **question)
    doc = json.loads((ws / ".delta" / "interaction" / "request.json").read_text())
    return ws, str(doc["request_id"])


def _card(svc: BotService, prompt: str) -> tuple[str, dict[str, Any]]:
    [call] = wait_for(
        lambda: [c for c in svc.posted() if prompt in json.dumps(c.activity)] or None,
        "the question's card posted to Teams",
    )
    assert call.path == f"/v3/conversations/{CONVERSATION}/activities"
    card = call.activity["attachments"][0]["content"]
    return call.activity.get("id", ""), card


def _button(card: dict[str, Any], title: str) -> tuple[str, str]:
    [action] = [a for a in card["actions"] if a["title"] == title]
    assert action["type"] == "Action.Execute" and action["verb"] == "deltad.answer"
    return action["data"]["deltad"], action["data"]["choice"]


def _closed_text(svc: BotService, prompt: str) -> str | None:
    for c in svc.updated():
        text = json.dumps(c.activity)
        if prompt in text and "Closed" in text:
            return text
    return None


def test_a_signed_press_answers_and_forged_ones_answer_nothing(
    tmp_path: Path, bot: BotService
) -> None:
    d = _daemon(tmp_path, bot).start()
    try:
        url = http_url(d) + ENDPOINT
        ws, request_id = _ask(tmp_path, "ws", "Ship the release?")
        _, card = _card(bot, "Ship the release?")
        # The first attempt was throttled (429) and retried; the bot's token came from the
        # client-credentials grant with the app password, and the card has no URL to follow.
        assert [c.status for c in bot.calls[:2]] == [429, 201]
        assert bot.token_requests and bot.token_requests[0]["client_id"] == APP_ID
        assert {a["type"] for a in card["actions"]} == {"Action.Execute"}
        assert "url" not in json.dumps(card).lower().replace("serviceurl", "")
        ref, yes = _button(card, "yes")

        # Forged, or not for this bot: refused before anything is answered.
        press = bot.invoke(ref, yes, ALICE)
        assert bot.send(url, press, token=None).status_code == 401  # unsigned
        other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        assert bot.send(url, press, bot.sign(key=other)).status_code == 401  # not its key
        assert bot.send(url, press, bot.sign(key=other, kid="unknown")).status_code == 401
        assert bot.send(url, press, bot.sign(aud="another-bot")).status_code == 403
        assert bot.send(url, press, bot.sign(iss="https://sts.example")).status_code == 403
        expired = bot.sign(exp=1_000_000_000, nbf=999_999_000, iat=999_999_000)
        assert bot.send(url, press, expired).status_code == 401
        moved = bot.sign(serviceUrl="https://elsewhere.example/")
        assert bot.send(url, press, moved).status_code == 403
        # A GET of the endpoint (a link preview's fetch) answers nothing.
        assert httpx.get(url, timeout=30).status_code == 405
        assert httpx.get(url + f"?deltad={ref}&choice={yes}", timeout=30).status_code == 405
        d.wait_event("teams_activity_refused", code="wrong_audience")
        # Signed, but by nobody deltad knows, or by someone who may not answer it.
        r = bot.send(url, bot.invoke(ref, yes, EVE))
        assert r.status_code == 200 and "not a deltad user" in r.json()["value"]
        r = bot.send(url, bot.invoke(ref, yes, MALLORY))
        assert r.status_code == 200 and r.json()["value"].startswith("Not taken")
        assert metadata_status(ws) == "WAITING_FOR_INPUT"
        assert d.resumed(ws) == []

        # Alice's signed press answers; the invoke's response is the closed card.
        r = bot.send(url, press)
        assert r.status_code == 200, r.text
        reply = r.json()
        assert reply["statusCode"] == 200
        assert reply["type"] == "application/vnd.microsoft.card.adaptive"
        assert "answered by alice" in json.dumps(reply["value"])
        d.wait_resumed(ws)
        [answered] = d.wait_event("teams_answered", request_id=request_id)
        assert answered["answered_by"] == "alice"
        # The card in the conversation is replaced by its closed one, over the same activity.
        text = wait_for(lambda: _closed_text(bot, "Ship the release?"), "the card updated")
        assert "answered by alice (teams)" in text
        [update] = [c for c in bot.updated() if "Ship the release?" in json.dumps(c.activity)]
        assert update.path == f"/v3/conversations/{CONVERSATION}/activities/1:activity-1"
        # Pressed again: refused, nothing changes.
        again = bot.send(url, press)
        assert again.status_code == 200 and "already answered" in again.json()["value"]
        # The keys were fetched once (metadata, then jwks_uri), and an unknown kid refetched
        # them at most once in the minute.
        assert bot.metadata_fetches <= 2 and bot.key_fetches <= 2
        # The app password is handed to the inbox at connect: in no process's argv,
        for pid in (p for p in Path("/proc").iterdir() if p.name.isdigit()):
            try:
                assert PASSWORD.encode() not in (pid / "cmdline").read_bytes(), pid
            except OSError:
                continue  # ended meanwhile
        # never written down (the state dir, the outboxes) or logged.
        for f in tmp_path.rglob("*"):
            if f.is_file() and f.name != "teams-password":
                assert PASSWORD.encode() not in f.read_bytes(), f
    finally:
        d.stop()
        d.kill_children()


def test_a_question_answered_elsewhere_closes_its_card(tmp_path: Path, bot: BotService) -> None:
    d = _daemon(tmp_path, bot).start()
    try:
        url = http_url(d) + ENDPOINT
        ws, rid = _ask(tmp_path, "ws", "Rotate the keys?")
        _, card = _card(bot, "Rotate the keys?")
        ref, yes = _button(card, "yes")
        token = make_token(d.state_dir, "alice")
        with client(http_url(d), token) as http:  # answered outside Teams: the HTTP API
            r = http.post(f"/v1/requests/{rid}/answer", json={"answer": "N"})
            assert r.status_code == 202, r.text
        d.wait_resumed(ws)
        text = wait_for(lambda: _closed_text(bot, "Rotate the keys?"), "the card updated")
        assert "Closed: answered by" in text and "Action.Execute" not in text
        # A press on the old card answers nothing.
        r = bot.send(url, bot.invoke(ref, yes, ALICE))
        assert r.status_code == 200 and r.json()["value"].startswith("Not taken")
        assert len(d.resumed(ws)) == 1
    finally:
        d.stop()
        d.kill_children()


def _replies(svc: BotService, prompt: str) -> list[Any]:
    return [c for c in svc.replies() if prompt in c.activity["text"]]


def test_a_reminder_and_an_escalation_reply_to_the_card_and_the_escalated_answer(
    tmp_path: Path, bot: BotService
) -> None:
    d = _daemon(tmp_path, bot, follow_up_limits=FAST).start()
    try:
        url = http_url(d) + ENDPOINT
        plan = FollowUp(
            remind_after_seconds=1,
            max_reminders=1,
            escalate_after_seconds=2,
            escalate_to=["bob"],
        )
        ws, rid = _ask(tmp_path, "ws", "Restart the cluster?", follow_up=plan)
        _, card = _card(bot, "Restart the cluster?")
        ref, yes = _button(card, "yes")
        [first, second] = wait_for(
            lambda: r if len(r := _replies(bot, "Restart the cluster?")) >= 2 else None,
            "a reminder and an escalation replied to the card",
        )
        # Both are replies to the card's activity (in its thread), not cards of their own.
        parent = f"/v3/conversations/{CONVERSATION}/activities/1:activity-1"
        assert first.path == second.path == parent
        assert first.activity["replyToId"] == "1:activity-1"
        by_kind = {c.activity["text"].split(":")[0]: c.activity for c in (first, second)}
        assert set(by_kind) == {"Reminder", "Escalated to bob"}
        assert "entities" not in by_kind["Reminder"]
        [mention] = by_kind["Escalated to bob"]["entities"]
        assert mention["mentioned"] == {"id": BOB, "name": "bob"}
        assert mention["text"] in by_kind["Escalated to bob"]["text"]
        assert len(bot.posted()) == 1  # the card was not posted again
        # Teams is what carried them (the record beside the question, the page's "Reminded").
        record = json.loads((ws / ".delta" / "interaction" / "followup.json").read_text())
        assert record["request_id"] == rid
        assert "teams" in record["reminders_via"] and "teams" in record["escalated"]["via"]
        assert not d.events("followup_undelivered")
        # Bob, escalated to, may now answer from the same card.
        r = bot.send(url, bot.invoke(ref, yes, BOB))
        assert r.status_code == 200 and "answered by bob" in json.dumps(r.json()), r.text
        d.wait_resumed(ws)
        wait_for(lambda: _closed_text(bot, "Restart the cluster?"), "the card updated")
        d.wait_event("teams_follow_up_queued", count=2, request_id=rid)
    finally:
        d.stop()
        d.kill_children()


def _input(card: dict[str, Any]) -> dict[str, Any]:
    [field] = [b for b in card["body"] if b["type"].startswith("Input.")]
    return field


def test_a_typed_answer_from_the_cards_input_is_checked_and_answers(
    tmp_path: Path, bot: BotService
) -> None:
    d = _daemon(tmp_path, bot).start()
    try:
        url = http_url(d) + ENDPOINT
        # Text: the card's Input.Text, submitted with its one Action.Execute.
        ws, rid = _ask(tmp_path, "text", "Which day do we ship?", input_type="text")
        _, card = _card(bot, "Which day do we ship?")
        field = _input(card)
        assert field["type"] == "Input.Text" and field["id"] == "answer"
        ref, key = _button(card, "Answer")
        r = bot.send(url, bot.invoke(ref, key, ALICE, answer="Tuesday, after the freeze"))
        assert r.status_code == 200 and "answered by alice" in json.dumps(r.json()), r.text
        [resumed] = d.wait_resumed(ws)
        delivered = json.loads(resumed["answer"])  # the response file, as the run reads it
        assert (delivered["answer"], delivered["answered_by"]) == (
            "Tuesday, after the freeze",
            "alice",
        )
        assert delivered["channel"] == "teams"
        [answered] = d.wait_event("teams_answered", request_id=rid)
        assert answered["answered_by"] == "alice"

        # A number out of the question's bounds is refused by the answering path, the card
        # stays; one within them answers.
        nws, _ = _ask(
            tmp_path, "number", "How many replicas?", input_type="number", minimum=1, maximum=9
        )
        _, card = _card(bot, "How many replicas?")
        assert _input(card)["type"] == "Input.Number" and _input(card)["max"] == 9
        ref, key = _button(card, "Answer")
        r = bot.send(url, bot.invoke(ref, key, ALICE, answer="42"))
        assert r.status_code == 200 and r.json()["value"].startswith("Not taken"), r.text
        assert metadata_status(nws) == "WAITING_FOR_INPUT" and d.resumed(nws) == []
        r = bot.send(url, bot.invoke(ref, key, ALICE, answer="3"))
        assert r.status_code == 200 and "answered by alice" in json.dumps(r.json()), r.text
        [resumed] = d.wait_resumed(nws)
        assert json.loads(resumed["answer"])["answer"] == "3"

        # A secret gets no input and no button; a hand-made press with one answers nothing.
        sws, _ = _ask(tmp_path, "secret", "The deploy token?", input_type="text", sensitive=True)
        _, card = _card(bot, "The deploy token?")
        assert "actions" not in card and "Input." not in json.dumps(card)
        r = bot.send(url, bot.invoke(ref_of_card(sws), "", ALICE, answer="hunter2"))
        assert r.status_code == 200 and "never answered in Teams" in r.json()["value"], r.text
        assert metadata_status(sws) == "WAITING_FOR_INPUT" and d.resumed(sws) == []
    finally:
        d.stop()
        d.kill_children()


def ref_of_card(ws: Path) -> str:
    """The reference a card of `ws`'s question would carry (a secret's card carries none)."""
    from deltad.outbound.slack import ref_of
    from deltad.protocol.printable import show_path

    doc = json.loads((ws / ".delta" / "interaction" / "request.json").read_text())
    return ref_of(show_path(str(ws)), str(doc["request_id"]))
