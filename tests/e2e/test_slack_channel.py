"""The Slack channel end to end: a real `deltad serve --listen` posts a question through
`slack_sdk.WebClient` to a stand-in for Slack's Web API on 127.0.0.1 (tests/support/slackapi.py),
interactions are POSTed to the inbox signed with slack_sdk's own signer, and a real `delta run`
resumes. Nothing leaves 127.0.0.1."""

from __future__ import annotations

import json
import os
import pwd
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from deltad.testing import FakeLLM
from tests.support.daemon import Daemon, metadata_status
from tests.support.inbox import http_url
from tests.support.slackapi import SlackApi, interaction

from ..conftest import Delta, llm_env, wait_for, write_agent

REAL_CLIENT = ["delta", "run", "--work-dir", "{workspace}"]
TOKEN, SECRET = "xoxb-test-token-never-logged", "signing-secret-of-the-test"
CONVERSATION = "C0DELTAD"
ALICE, BOB, MALLORY, EVE = "U0ALICE", "U0BOB", "U0MALLORY", "U0EVE"  # eve: not mapped
ENDPOINT = "/v1/channels/slack/interactions"


@pytest.fixture
def slack() -> Iterator[SlackApi]:
    with SlackApi(token=TOKEN) as api:
        yield api


def _daemon(tmp: Path, api: SlackApi) -> Daemon:
    (tmp / "root").mkdir(parents=True)
    secrets = tmp / "secrets"
    secrets.mkdir(mode=0o700)
    (secrets / "token").write_text(TOKEN + "\n")
    (secrets / "signing").write_text(SECRET + "\n")
    for f in secrets.iterdir():
        f.chmod(0o600)
    channel = {
        "token": {"secret_file": str(secrets / "token")},
        "signing_secret": {"secret_file": str(secrets / "signing")},
        "channel": CONVERSATION,
        "users": {ALICE: "alice", BOB: {"name": "bob", "groups": ["ops"]}, MALLORY: "mallory"},
        "api_url": api.url,
    }
    return Daemon(
        tmp,
        [tmp / "root"],
        resume_command=REAL_CLIENT,
        http={"listen": "127.0.0.1:0"},
        channels={"slack": channel},
    )


def _ask(tmp: Path, fake: FakeLLM, **question: Any) -> tuple[Delta, str]:
    ws = tmp / "root" / "ws"
    ws.mkdir(parents=True)
    d = Delta(ws, fake, write_agent(tmp))
    fake.call("ask_human", question, id="q")
    fake.reply("done")
    assert d.start().code == 101
    return d, d.request()["request_id"]


def _posted(api: SlackApi, request_id: str) -> dict[str, Any]:
    [call] = wait_for(
        lambda: [c for c in api.calls("chat.postMessage") if request_id in json.dumps(c.args)],
        "the question posted to Slack",
    )
    assert call.token == TOKEN and call.args["channel"] == CONVERSATION
    return call.args


def _buttons(message: dict[str, Any]) -> dict[str, dict[str, Any]]:
    [actions] = [b for b in message["blocks"] if b["type"] == "actions"]
    return {e["text"]["text"]: e for e in actions["elements"]}


def _press(button: dict[str, Any], user: str) -> dict[str, Any]:
    return {
        "type": "block_actions",
        "user": {"id": user, "username": user.lower()},
        "trigger_id": f"trigger-{user}-{time.monotonic_ns()}",
        "channel": {"id": CONVERSATION},
        "container": {"type": "message", "channel_id": CONVERSATION},
        "actions": [{"type": "button", "action_id": button["action_id"], "value": button["value"]}],
    }


def _post(
    url: str, payload: dict[str, Any], at: float | None = None, secret: str = SECRET
) -> httpx.Response:
    body, headers = interaction(payload, secret, at)
    return httpx.post(url + ENDPOINT, content=body, headers=headers, timeout=30)


def test_a_button_answers_once_and_the_message_says_who(
    tmp_path: Path, fake: FakeLLM, slack: SlackApi
) -> None:
    daemon = _daemon(tmp_path, slack).start(env=llm_env(fake))
    try:
        url = http_url(daemon)
        d, request_id = _ask(
            tmp_path,
            fake,
            prompt="Which release channel?",
            input_type="choice",
            options=["[s] stable", "[b] beta"],
        )
        message = _posted(slack, request_id)
        assert "Which release channel?" in message["text"]
        buttons = _buttons(message)
        assert set(buttons) == {"stable", "beta", "Open on the page"}
        assert buttons["Open on the page"]["url"] == f"{url}/#request={request_id}"
        beta = buttons["beta"]
        assert beta["action_id"] == "deltad.answer" and beta["value"].endswith(":B")

        r = _post(url, _press(beta, ALICE))
        assert r.status_code == 200, r.text
        wait_for(lambda: metadata_status(d.ws) == "COMPLETED", "the run to finish")
        assert "beta" in fake.tool_results()["q"]
        [answered] = daemon.wait_event("slack_answered", request_id=request_id)
        assert answered["answered_by"] == ALICE

        # Pressed again (a replay, a second person): refused with the reason, nothing changes.
        again = _post(url, _press(beta, BOB))
        assert again.status_code == 200 and "already answered" in again.json()["text"]
        [refused] = daemon.wait_event("slack_action_refused", code="replayed")
        assert refused["user"] == BOB
        wait_for(lambda: slack.calls("chat.postEphemeral"), "the refusal, told to bob")
        [told] = slack.calls("chat.postEphemeral")
        assert told.args["user"] == BOB and "already answered" in told.args["text"]

        # The message itself now says who answered, through what and when.
        [update] = wait_for(lambda: slack.calls("chat.update"), "the message updated")
        assert update.args["channel"] == CONVERSATION
        [post] = slack.calls("chat.postMessage")
        assert update.args["ts"] == post.result["ts"]
        assert f"Answered by <@{ALICE}> in Slack" in json.dumps(update.args["blocks"])
        assert "actions" not in [b["type"] for b in update.args["blocks"]]
        assert len(daemon.events("resume_spawned", workspace=str(d.ws))) == 1
    finally:
        daemon.stop()
    assert TOKEN not in json.dumps(daemon.lines()) and SECRET not in json.dumps(daemon.lines())
    status = d("status")
    assert status.code == 0 and f"{ALICE} (slack)" in status.out, status.out
    [got] = json.loads(d("status", "--json").out)["outcome"]["answers"]
    assert (got["channel"], got["answered_by"]) == ("slack", ALICE)
    [reply] = [
        e["payload"]["reply"]
        for e in d.events("HUMAN_INTERACTION")
        if e["payload"].get("phase") == "answered"
    ]
    assert (reply["channel"], reply["answered_by"], reply["key"]) == ("slack", ALICE, "B")


def test_refusals_change_nothing_and_a_modal_answers_text(
    tmp_path: Path, fake: FakeLLM, slack: SlackApi
) -> None:
    daemon = _daemon(tmp_path, slack).start(env=llm_env(fake))
    try:
        url = http_url(daemon)
        d, request_id = _ask(
            tmp_path, fake, prompt="What should the release note say?", respondents=["alice"]
        )
        box = d.delta_dir / "interaction"
        open_form = _buttons(_posted(slack, request_id))["Answer…"]
        assert open_form["action_id"] == "deltad.open"

        def unchanged() -> None:
            assert not (box / "response.json").exists() and not (box / "response.txt").exists()
            assert metadata_status(d.ws) == "WAITING_FOR_INPUT"

        # Not signed by Slack (a forged signature), or signed too long ago: 401, with why.
        forged = _post(url, _press(open_form, ALICE), secret="not-the-secret")
        assert forged.status_code == 401 and forged.json()["code"] == "bad_signature"
        stale = _post(url, _press(open_form, ALICE), at=time.time() - 6 * 60)
        assert stale.status_code == 401 and stale.json()["code"] == "stale_request"
        unsigned = httpx.post(url + ENDPOINT, content=b"payload=%7B%7D", timeout=30)
        assert unsigned.status_code == 401
        # Someone Slack knows but deltad does not; someone mapped who is not a respondent.
        for user, code in ((EVE, "not_mapped"), (MALLORY, "not_a_respondent")):
            r = _post(url, _press(open_form, user))
            assert r.status_code == 200 and r.json()["text"].startswith("Not taken:")
            daemon.wait_event("slack_action_refused", code=code, user=user)
        assert "only alice may answer" in _post(url, _press(open_form, MALLORY)).json()["text"]
        assert slack.calls("views.open") == []
        unchanged()

        # Alice opens the form (with the trigger Slack gave her) and submits it.
        press = _press(open_form, ALICE)
        assert _post(url, press).status_code == 200
        [opened] = wait_for(lambda: slack.calls("views.open"), "the modal opened")
        assert opened.args["trigger_id"] == press["trigger_id"]
        view = opened.args["view"]
        [field] = [b for b in view["blocks"] if b["type"] == "input"]
        assert field["element"]["type"] == "plain_text_input"
        state = {field["block_id"]: {field["element"]["action_id"]: {
            "type": "plain_text_input", "value": "Faster builds."}}}  # fmt: skip
        submission = {
            "type": "view_submission",
            "user": {"id": ALICE},
            "view": {
                "callback_id": view["callback_id"],
                "private_metadata": view["private_metadata"],
                "state": {"values": state},
            },
        }
        # Mallory cannot submit alice's form either: the modal says why, nothing changes.
        theirs = _post(url, {**submission, "user": {"id": MALLORY}})
        assert theirs.json()["response_action"] == "errors"
        unchanged()
        r = _post(url, submission)
        assert r.status_code == 200 and r.content == b""
        wait_for(lambda: metadata_status(d.ws) == "COMPLETED", "the run to finish")
        assert "Faster builds." in fake.tool_results()["q"]
        assert len(daemon.events("resume_spawned", workspace=str(d.ws))) == 1
        [update] = wait_for(lambda: slack.calls("chat.update"), "the message updated")
        assert f"<@{ALICE}>" in json.dumps(update.args["blocks"])
    finally:
        daemon.stop()
    [got] = json.loads(d("status", "--json").out)["outcome"]["answers"]
    assert (got["channel"], got["answered_by"]) == ("slack", ALICE)


def test_slack_is_called_by_the_inbox_user_and_a_killed_inbox_loses_no_post(
    tmp_path: Path, fake: FakeLLM, slack: SlackApi
) -> None:
    """Every Web API call (the post, the modal a button opens) comes from the inbox process's
    user, never root (the uid in /proc/net/tcp); kill -9 of the inbox while Slack hangs on the
    post: the core starts another, which posts it from the outbox, once. The bot token is in
    neither process's argv nor environment nor the log."""
    inbox_uid = pwd.getpwnam("deltad-inbox").pw_uid
    slack.hang("chat.postMessage")
    daemon = _daemon(tmp_path, slack).start(env=llm_env(fake))
    try:
        url = http_url(daemon)
        _, request_id = _ask(tmp_path, fake, prompt="What changed?", respondents=["alice"])
        wait_for(lambda: slack.calls("chat.postMessage"), "the first post, left hanging")
        [started] = daemon.events("inbox_started")
        for part in ("cmdline", "environ"):
            assert TOKEN.encode() not in Path(f"/proc/{started['pid']}/{part}").read_bytes()
        os.kill(started["pid"], signal.SIGKILL)
        hung, posted = wait_for(
            lambda: slack.calls("chat.postMessage")[1:] and slack.calls("chat.postMessage"),
            "the post, from the next inbox",
        )
        open_form = _buttons(posted.args)["Answer…"]
        assert _post(url, _press(open_form, ALICE)).status_code == 200
        wait_for(lambda: slack.calls("views.open"), "the modal opened")
        restarted = daemon.events("inbox_started")
    finally:
        daemon.stop()
    assert len(restarted) == 2 and restarted[1]["pid"] != started["pid"]
    assert len(slack.calls("chat.postMessage")) == 2 and request_id in json.dumps(posted.args)
    assert hung.result == {} and posted.result["ok"] and hung.args["text"] == posted.args["text"]
    assert posted.token == TOKEN
    assert {c.uid for c in slack.calls()} == {inbox_uid} and inbox_uid != 0
    assert TOKEN not in json.dumps(daemon.lines())
