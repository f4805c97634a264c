"""The Slack channel in-process: Block Kit from the vocabulary of questions (a table over the
kinds), the answers buttons and modals stand for, the configuration's one-line errors, and
the channel's sends against the loopback stand-in (tests/support/slackapi.py)."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from structlog.testing import capture_logs

from deltad.core.config import ConfigError, load_config
from deltad.http.child import open_view
from deltad.inbox import ops, quorum
from deltad.inbox.ops import ApiError
from deltad.outbound import blocks, senders
from deltad.outbound.base import Closed, Context, Question
from deltad.outbound.config import ChannelsConfig, SlackConfig
from deltad.outbound.outbox import Delivery, target_key
from deltad.outbound.slack import SlackChannel, ref_of
from deltad.protocol import InputType, InteractionRequest, Mailbox, Workspace
from deltad.protocol.models import GatedCall, Option, QuestionContext
from deltad.protocol.replies import AnswerRejected
from deltad.testing.stub import paused_workspace
from tests.support.outbound import Inbox, inbox_side
from tests.support.slackapi import SlackApi, interaction

SECRET = "unit-signing-secret"


def _req(kind: InputType, **extra: Any) -> InteractionRequest:
    if kind == InputType.CHOICE:
        extra.setdefault(
            "options", [Option(key="S", label="stable"), Option(key="B", label="beta")]
        )
    if kind == InputType.APPROVAL:
        extra.setdefault("calls", [GatedCall(action_id="c1", tool_name="shell",
                                             resolved_command="rm -rf build")])  # fmt: skip
    extra.setdefault("prompt", "Go?")
    return InteractionRequest(input_type=kind, run_id="r1", action_id="a1", **extra)


def _message(req: InteractionRequest, page: str | None = None, **q: Any) -> list[dict[str, Any]]:
    _, message = blocks.question_message(Question(Path("/ws"), req, **q), "f" * 32, 600, page)
    return message


def _buttons(message: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    actions = [b for b in message if b["type"] == "actions"]
    if not actions:
        return []
    return [(e["text"]["text"], e["action_id"], e["value"]) for e in actions[0]["elements"]]


# -- Block Kit from the kinds ---------------------------------------------------------------
ANSWERS, OPENS = blocks.ANSWER, blocks.OPEN
REF = "f" * 32


@pytest.mark.parametrize(
    ("kind", "extra", "expected"),
    [
        (InputType.YES_NO, {}, [("Yes", ANSWERS, f"{REF}:y"), ("No", ANSWERS, f"{REF}:n")]),
        (InputType.CONFIRMATION, {}, [("Yes", ANSWERS, f"{REF}:y"), ("No", ANSWERS, f"{REF}:n")]),
        (InputType.CHOICE, {}, [("stable", ANSWERS, f"{REF}:S"), ("beta", ANSWERS, f"{REF}:B")]),
        (InputType.APPROVAL, {}, [("Approve", ANSWERS, f"{REF}:a"),
                                  ("Reject…", OPENS, f"{REF}:r"),
                                  ("Cancel run", ANSWERS, f"{REF}:c")]),
        (InputType.TEXT, {}, [("Answer…", OPENS, f"{REF}:")]),
        (InputType.NUMBER, {"minimum": 1, "maximum": 9}, [("Answer…", OPENS, f"{REF}:")]),
        (InputType.DATE, {}, [("Answer…", OPENS, f"{REF}:")]),
        (InputType.PASSWORD, {}, []),
        (InputType.TEXT, {"sensitive": True}, []),  # a secret: the page only
    ],
)  # fmt: skip
def test_buttons_come_from_the_kind(
    kind: InputType, extra: dict[str, Any], expected: list[tuple[str, str, str]]
) -> None:
    req = _req(kind, **extra)
    message = _message(req)
    assert _buttons(message) == expected
    if req.is_secret:
        assert "answered on the page, never here" in json.dumps(message)
    # Every button the message shows answers through the question itself, rebuilt from it.
    for _, action, value in expected:
        key = value.split(":")[1]
        if action == ANSWERS:
            assert blocks.answer_of(req, key) is not None


@pytest.mark.parametrize(
    ("kind", "extra", "key", "element", "check"),
    [
        (InputType.TEXT, {}, "", "plain_text_input", {"multiline": True}),
        (InputType.NUMBER, {"minimum": 1, "maximum": 9.5}, "", "number_input",
         {"min_value": "1", "max_value": "9.5", "is_decimal_allowed": True}),
        (InputType.DATE, {"default": "2026-12-01"}, "", "datepicker",
         {"initial_date": "2026-12-01"}),
        (InputType.APPROVAL, {}, "r", "plain_text_input", {"multiline": True}),
    ],
)  # fmt: skip
def test_a_modal_asks_by_the_kind(
    kind: InputType, extra: dict[str, Any], key: str, element: str, check: dict[str, Any]
) -> None:
    view = blocks.modal(_req(kind, **extra), REF, key)
    assert view["callback_id"] == blocks.MODAL and view["private_metadata"] == f"{REF}:{key}"
    [field] = [b for b in view["blocks"] if b["type"] == "input"]
    assert field["element"]["type"] == element
    assert check.items() <= field["element"].items()
    assert field["optional"] == (key == "r")  # a reason is optional; an answer is not


@pytest.mark.parametrize(
    ("kind", "key", "state", "expected"),
    [
        (InputType.YES_NO, "y", None, {"answer": "yes"}),
        (InputType.CHOICE, "B", None, {"answer": "B"}),
        (InputType.APPROVAL, "a", None,
         {"decisions": [{"action_id": "c1", "decision": "approve"}]}),
        (InputType.APPROVAL, "c", None,
         {"decisions": [{"action_id": "c1", "decision": "cancel"}]}),
        (InputType.APPROVAL, "r", {"type": "plain_text_input", "value": " not now "},
         {"decisions": [{"action_id": "c1", "decision": "reject", "reason": "not now"}]}),
        (InputType.APPROVAL, "r", {"type": "plain_text_input", "value": None},
         {"decisions": [{"action_id": "c1", "decision": "reject"}]}),
        (InputType.TEXT, "", {"type": "plain_text_input", "value": "hello"}, {"answer": "hello"}),
        (InputType.NUMBER, "", {"type": "number_input", "value": "4.5"}, {"answer": "4.5"}),
        (InputType.DATE, "", {"type": "datepicker", "selected_date": "2026-12-01"},
         {"answer": "2026-12-01"}),
    ],
)  # fmt: skip
def test_what_a_button_or_a_modal_answers(
    kind: InputType, key: str, state: dict[str, Any] | None, expected: dict[str, Any]
) -> None:
    req = _req(kind)
    if state is None:
        got = blocks.answer_of(req, key)
    else:
        values = {blocks.INPUT_BLOCK: {blocks.INPUT_ACTION: state}}
        got = blocks.submitted(req, key, values)
    assert got.model_dump(exclude_none=True, mode="json") == expected


@pytest.mark.parametrize(
    ("kind", "key"),
    [(InputType.YES_NO, "x"), (InputType.APPROVAL, "e"), (InputType.TEXT, "y")],
)
def test_a_button_the_question_does_not_have_is_refused(kind: InputType, key: str) -> None:
    with pytest.raises(AnswerRejected):  # a hand-made payload, or edit (the page's)
        blocks.answer_of(_req(kind), key)


def test_context_is_cut_and_mrkdwn_escaped() -> None:
    ctx = QuestionContext(task="t" * 5000, last_message="<!channel> & *bold*")
    req = _req(InputType.YES_NO, context=ctx)
    text = json.dumps(_message(req, page="https://inbox/#request=x"), ensure_ascii=False)
    assert "t" * 600 not in text and "t" * 599 + "…" in text
    assert "&lt;!channel&gt; &amp; *bold*" in text and "<!channel>" not in text
    assert '"url": "https://inbox/#request=x"' in text
    for b in _message(_req(InputType.TEXT, prompt="p" * 9000)):
        if b["type"] == "section":
            assert len(b["text"]["text"]) <= 3000


def test_a_closed_message_says_who_how_and_when() -> None:
    at = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
    c = Closed(Path("/ws"), "r", "answered", "carol", "http")
    for closed, user, line in [
        (c, None, "Answered by carol (http) at 2026-11-27 12:00:00 UTC."),
        (c, "U0ALICE", "Answered by <@U0ALICE> in Slack at 2026-11-27 12:00:00 UTC."),
        (Closed(Path("/ws"), "r", "expired"), None, "Expired at 2026-11-27 12:00:00 UTC"),
    ]:
        _, message = blocks.closed_message("Go?", closed, at, user)
        assert line in json.dumps(message)
        assert "actions" not in [b["type"] for b in message]


# -- configuration --------------------------------------------------------------------------
GOOD = {
    "token": {"secret_env": "SLACK_TOKEN"},
    "signing_secret": {"secret_env": "SLACK_SIGNING"},
    "channel": "C0123ABCD",
}


@pytest.mark.parametrize(
    ("slack", "message"),
    [
        ({"colour": "red"}, "channels.slack.colour: unknown key"),
        ({"token": "xoxb-inline"}, "channels.slack.token"),  # never written inline
        ({"channel": "#general"}, "is not a Slack conversation id"),
        ({"channel": None}, "give a channel, or dm: true"),
        ({"channel": None, "dm": True}, "needs users"),
        ({"users": {"alice": "alice"}}, "is not a Slack user id"),
        ({"api_url": "ftp://x"}, "is not an http(s) URL"),
        ({"context_chars": 5000}, "channels.slack.context_chars"),
    ],
)
def test_a_bad_slack_key_is_one_line(tmp_path: Path, slack: dict[str, Any], message: str) -> None:
    path = tmp_path / "deltad.yaml"
    path.write_text(
        json.dumps({"roots": [str(tmp_path)], "channels": {"slack": {**GOOD, **slack}}})
    )
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert message in str(e.value) and "\n" not in str(e.value)
    path.write_text(json.dumps({"roots": [str(tmp_path)], "channels": {"slack": GOOD}}))
    assert load_config(path).channels is not None


def test_the_documented_slack_example_is_valid() -> None:
    text = (Path(__file__).resolve().parents[2] / "config" / "deltad.yaml").read_text()
    block = text[text.index("# channels:\n") :].split("\n\n")[0]
    doc = yaml.safe_load("\n".join(line.removeprefix("# ") for line in block.splitlines()))
    slack = ChannelsConfig.model_validate(doc["channels"]).slack
    assert slack is not None and slack.person("U0BOB") is not None


# -- the channel, in-process ----------------------------------------------------------------
def _channel(tmp: Path, api: SlackApi, **over: Any) -> SlackChannel:
    (tmp / "token").write_text("xoxb-unit\n")
    (tmp / "signing").write_text(SECRET)
    config = SlackConfig.model_validate(
        {
            "token": {"secret_file": str(tmp / "token")},
            "signing_secret": {"secret_file": str(tmp / "signing")},
            "channel": "C0DELTAD",
            "dm": True,
            "users": {"U0ALICE": "alice", "U0BOB": {"name": "bob", "groups": ["ops"]}},
            "api_url": api.url,
            **over,
        }
    )
    inbox = inbox_side(tmp, senders.slack_target(config))
    ch = SlackChannel(config, Context(tmp / "state", quorum.answer_or_vote, inbox.hand))
    INBOX[ch] = inbox
    return ch


# Each channel's inbox side: what it hands over, in the inbox's courier, sent with the real
# sender (against the stand-in Web API).
INBOX: dict[SlackChannel, Inbox] = {}


def _ask(tmp: Path, ch: SlackChannel, **question: Any) -> tuple[Path, str]:
    ws = tmp / "ws"
    paused_workspace(ws, prompt="Deploy?", **question)
    req = Mailbox(Workspace.at(ws)).read_request()
    assert req is not None
    ch.send(Question(ws, req, "the task"))
    return ws, req.request_id


def _drain(ch: SlackChannel) -> list[str | None]:
    """Every queued delivery sent once, in order: what each attempt said (None: sent)."""
    said = INBOX[ch].drain()
    return [None if f is None else f"{f.why}|{f.permanent}" for f in said]


def test_posts_go_to_the_conversation_and_to_each_allowed_person(tmp_path: Path) -> None:
    with SlackApi(token="xoxb-unit") as api:
        ch = _channel(tmp_path, api)
        ws, request_id = _ask(tmp_path, ch, input_type="yes_no", respondents=["group:ops"])
        ch.send(Question(ws, Mailbox(Workspace.at(ws)).read_request(), "again"))  # type: ignore[arg-type]
        assert _drain(ch) == [None, None]  # once, however often told: C0DELTAD and bob's DM
        posts = api.calls("chat.postMessage")
        assert [c.args["channel"] for c in posts] == ["C0DELTAD", "U0BOB"]
        ch.withdraw(Closed(ws, request_id, "answered", "carol", "http"))
        assert _drain(ch) == [None]
        updates = api.calls("chat.update")
        assert [(u.args["channel"], u.args["ts"]) for u in updates] == [
            (p.result["channel"], p.result["ts"]) for p in posts
        ]
        assert "Answered by carol (http)" in json.dumps(updates[0].args["blocks"])


def test_a_reminder_and_an_escalation_reach_the_posts_and_those_added(tmp_path: Path) -> None:
    with SlackApi(token="xoxb-unit") as api:
        ch = _channel(tmp_path, api)
        ws, request_id = _ask(tmp_path, ch, input_type="yes_no", respondents=["alice"])
        assert _drain(ch) == [None, None]  # the conversation and alice's DM
        req = Mailbox(Workspace.at(ws)).read_request()
        assert req is not None
        ch.send(Question(ws, req, "t", follow_up="reminder"))
        assert _drain(ch) == [None]
        replies = api.calls("chat.postMessage")[2:]
        posts = api.calls("chat.postMessage")[:2]
        assert [(c.args["channel"], c.args["thread_ts"]) for c in replies] == [
            (p.result["channel"], p.result["ts"]) for p in posts
        ]
        assert all(c.args["reply_broadcast"] and "Reminder" in c.args["text"] for c in replies)
        # An escalation to bob: a note in each thread, and the question itself in bob's DM.
        ch.send(Question(ws, req, "t", follow_up="escalation", only=("bob",)))
        assert _drain(ch) == [None, None]
        calls = api.calls("chat.postMessage")[4:]
        assert ["thread_ts" in c.args for c in calls] == [True, True, False]
        assert "Escalated to bob" in calls[0].args["text"]
        assert calls[2].args["channel"] == "U0BOB" and calls[2].args["blocks"]
        # Once answered, a late reminder says nothing.
        ch.withdraw(Closed(ws, request_id, "answered", "alice", "slack"))
        ch.send(Question(ws, req, "t", follow_up="reminder"))
        _drain(ch)
        assert len(api.calls("chat.postMessage")) == 7


def test_a_question_closed_before_it_was_posted_is_posted_closed(tmp_path: Path) -> None:
    with SlackApi(token="xoxb-unit") as api:
        ch = _channel(tmp_path, api, dm=False)
        ws, request_id = _ask(tmp_path, ch, input_type="yes_no")
        ch.withdraw(Closed(ws, request_id, "expired"))
        assert _drain(ch) == [None, None]
        [post] = api.calls("chat.postMessage")
        assert "Expired at" in json.dumps(post.args["blocks"])


def test_slack_errors_retry_or_go_to_the_dead_letter(tmp_path: Path) -> None:
    with SlackApi(token="xoxb-unit") as api:
        ch = _channel(tmp_path, api, dm=False)
        _ask(tmp_path, ch, input_type="yes_no")
        [d] = INBOX[ch].waiting()
        send = INBOX[ch].courier.send
        api.fail("chat.postMessage", "channel_not_found")
        assert send(d) is not None and send(d) is None  # failed, then sent
        api.fail("chat.postMessage", "channel_not_found")
        failed = send(d)
        assert failed is not None and failed.permanent and "channel_not_found" in failed.why
        api.fail("chat.postMessage", "ratelimited")
        failed = send(d)
        assert failed is not None and not failed.permanent
        api.fail("chat.postMessage", status=503)
        failed = send(d)
        assert failed is not None and not failed.permanent
        (tmp_path / "other").mkdir()
        bad = _channel(tmp_path / "other", api, dm=False)
        wrong = INBOX[bad].courier.send
        assert isinstance(wrong, senders.SlackSender)
        wrong.client.token = "xoxb-wrong"
        failed = wrong(Delivery("m", 1, "question", "C0DELTAD", d.body, 0, 0))
        assert failed is not None and failed.permanent and "invalid_auth" in failed.why


def test_signatures_are_checked_before_anything_is_read(tmp_path: Path) -> None:
    with SlackApi() as api:
        ch = _channel(tmp_path, api)
        payload = {"type": "block_actions", "user": {"id": "U0ALICE"}, "actions": []}
        body, h = interaction(payload, SECRET)
        ts, sig = h["X-Slack-Request-Timestamp"], h["X-Slack-Signature"]
        assert ch.interaction(body, ts, sig) == {"response": None}
        for args, code in [
            ((body + "x", ts, sig), "bad_signature"),
            ((body, ts, "v0=" + "0" * 64), "bad_signature"),
            ((body, str(int(time.time()) - 301), sig), "stale_request"),
            ((body, "not-a-time", sig), "stale_request"),
        ]:
            with capture_logs() as logged, pytest.raises(ApiError) as e:
                ch.interaction(*args)
            assert e.value.code == code and e.value.http == 401
            said = [x["code"] for x in logged if x["event"] == "slack_request_refused"]
            assert said == [code]  # the log's code is the one Slack (and the docs) get
        junk, h = interaction({"type": "block_actions"}, SECRET)  # no user: not a payload
        with pytest.raises(ApiError) as e:
            ch.interaction(junk, h["X-Slack-Request-Timestamp"], h["X-Slack-Signature"])
        assert e.value.http == 400


def test_an_unknown_or_closed_question_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    with SlackApi() as api:
        ch = _channel(tmp_path, api, dm=False)
        ws, request_id = _ask(tmp_path, ch, input_type="yes_no")
        ref = ref_of(str(ws), request_id)

        def press(value: str, user: str = "U0ALICE") -> str:
            payload = {
                "type": "block_actions",
                "user": {"id": user},
                "channel": {"id": "C0DELTAD"},
                "actions": [{"action_id": blocks.ANSWER, "value": value}],
            }
            body, h = interaction(payload, SECRET)
            got = ch.interaction(body, h["X-Slack-Request-Timestamp"], h["X-Slack-Signature"])
            return str((got["response"] or {}).get("text"))

        assert "names no question" in press("nonsense:y")
        assert "names no question" in press("0" * 32 + ":y")
        assert "no button 'x'" in press(f"{ref}:x")
        ch.withdraw(Closed(ws, request_id, "expired"))
        assert "expired" in press(f"{ref}:y")
        box = ws / ".delta" / "interaction"
        assert not (box / "response.json").exists()
        ephemeral = [json.loads(d.body) for d in INBOX[ch].waiting() if d.event == "ephemeral"]
        assert len(ephemeral) == 4 and all(e["user"] == "U0ALICE" for e in ephemeral)


def test_sends_are_counted_by_result(tmp_path: Path) -> None:
    """The inbox's courier tells each attempt's result (what its report to the core counts)."""
    with SlackApi(token="xoxb-unit") as api:
        ch = _channel(tmp_path, api, dm=False)
        courier = INBOX[ch].courier
        counted: list[str] = []
        courier.tally = counted.append
        _ask(tmp_path, ch, input_type="yes_no")
        api.fail("chat.postMessage", "ratelimited")
        [d] = INBOX[ch].waiting()
        courier._attempt(d)  # a retry
        courier._attempt(courier._pending[d.msg_id])  # sent
        ch.withdraw(Closed(tmp_path / "ws", "r", "expired"))  # never posted here: nothing
        assert courier.waiting() == 0
    assert counted == ["retry", "sent"]


def test_records_of_long_closed_questions_are_pruned(tmp_path: Path) -> None:
    with SlackApi() as api:
        ch = _channel(tmp_path, api, dm=False)
        ws, request_id = _ask(tmp_path, ch, input_type="yes_no")
        ch.withdraw(Closed(ws, request_id, "expired"))
        assert ch.records.prune(time.time() + 86400) == 0  # a late click is still told why
        assert ch.records.prune(time.time() + 31 * 86400) == 1
        assert ch.records.get(ref_of(str(ws), request_id)) is None


# -- the relay: the inbox's call, the core's dispatch ---------------------------------------
def test_the_core_takes_a_relayed_interaction_only_for_a_configured_channel(
    tmp_path: Path,
) -> None:
    from deltad.inbox.config import HttpConfig
    from deltad.inbox.context import Context as HttpContext
    from deltad.inbox.feed import Feed
    from deltad.inbox.tokens import TokenStore
    from deltad.privsep import monitor

    ctx = HttpContext(
        feed=Feed(10), tokens=TokenStore(tmp_path), config=HttpConfig(), link_key=b"k"
    )
    args = {"channel": "slack", "body": "payload=x", "timestamp": "1", "signature": "v0=0"}
    frame = {"op": "channel_interaction", "id": 1, "args": args}
    call = monitor.decode(json.dumps(frame).encode())
    assert isinstance(call, monitor.Request) and call.op.name == "channel_interaction"
    with pytest.raises(ApiError) as e:
        monitor.serve(ctx, None, call)
    assert e.value.http == 404 and "slack channel is not configured" in str(e.value)
    seen: list[tuple[str, str, str]] = []
    ctx.interactions["slack"] = lambda *a: seen.append(a) or {"response": None}
    assert monitor.serve(ctx, None, call) == {"response": None}
    assert seen == [("payload=x", "1", "v0=0")]
    for bad, why in [
        ({"channel": "email"}, "channel"),
        ({"body": "x" * (ops.CHANNEL_BODY_MAX + 1)}, "body"),
        ({"signature": "s" * 300}, "signature"),
        ({"token": "alice"}, "Extra inputs"),
    ]:
        raw = json.dumps({**frame, "args": {**args, **bad}}).encode()
        got = monitor.decode(raw)
        assert isinstance(got, str) and why in got, got
    # A token beside the arguments: the interaction is asked on behalf of none.
    got = monitor.decode(json.dumps({**frame, "token": "alice"}).encode())
    assert isinstance(got, str) and "no token" in got, got


# -- an approval, in-process: approve at once; reject with a reason through a modal ---------
def _interact(ch: SlackChannel, payload: dict[str, Any]) -> dict[str, Any] | None:
    body, h = interaction(payload, SECRET)
    got = ch.interaction(body, h["X-Slack-Request-Timestamp"], h["X-Slack-Signature"])
    if (opening := got.get("open_view")) is not None:  # opened by the inbox process
        inbox = INBOX[ch]
        couriers = {target_key(ch.name): inbox.courier}
        return open_view(SimpleNamespace(slack=inbox.courier.send, couriers=couriers), opening)
    response: dict[str, Any] | None = got["response"]
    return response


def _press(value: str, action: str, user: str = "U0BOB") -> dict[str, Any]:
    return {
        "type": "block_actions",
        "user": {"id": user},
        "trigger_id": "t-1",
        "channel": {"id": "C0DELTAD"},
        "actions": [{"action_id": action, "value": value}],
    }


CALL = {"action_id": "c1", "tool_name": "shell", "arguments": {"cmd": "make deploy"}}


@pytest.mark.parametrize("reject", [False, True])
def test_an_approval_is_decided_for_every_call_and_bound_to_it(
    tmp_path: Path, reject: bool
) -> None:
    with SlackApi() as api:
        ch = _channel(tmp_path, api, dm=False)
        ws, request_id = _ask(
            tmp_path, ch, input_type="approval", calls=[CALL], respondents=["group:ops"]
        )
        ref = ref_of(str(ws), request_id)
        assert "make deploy" in json.dumps(json.loads(INBOX[ch].waiting()[0].body))
        # alice is mapped but not in group ops: refused before any form opens
        refused = _interact(ch, _press(f"{ref}:r", blocks.OPEN, user="U0ALICE"))
        assert refused is not None and "only group:ops may answer" in refused["text"]
        if reject:
            assert _interact(ch, _press(f"{ref}:r", blocks.OPEN)) is None
            [opened] = api.calls("views.open")
            view = opened.args["view"]
            reason = {"type": "plain_text_input", "value": "not on a Friday"}
            values = {blocks.INPUT_BLOCK: {blocks.INPUT_ACTION: reason}}
            submission = {
                "type": "view_submission",
                "user": {"id": "U0BOB"},
                "view": {
                    "callback_id": view["callback_id"],
                    "private_metadata": view["private_metadata"],
                    "state": {"values": values},
                },
            }
            assert _interact(ch, submission) is None
        else:
            assert _interact(ch, _press(f"{ref}:a", blocks.ANSWER)) is None
            assert api.calls("views.open") == []
        doc = json.loads((ws / ".delta" / "interaction" / "response.json").read_text())
        assert (doc["channel"], doc["answered_by"]) == ("slack", "U0BOB")
        [decision] = doc["decisions"]
        assert decision["decision"] == ("reject" if reject else "approve")
        if reject:
            assert decision["reason"] == "not on a Friday"
        else:  # bound to the exact call approved (protocol/calldigest.py)
            assert decision["digest"].startswith("sha256:")
        again = _interact(ch, _press(f"{ref}:a", blocks.ANSWER))
        assert again is not None and "already answered by <@U0BOB>" in again["text"]


@pytest.mark.parametrize("kind", list(InputType))
def test_every_kind_makes_blocks_slacks_own_models_accept(kind: InputType) -> None:
    """slack_sdk's Block Kit models (their length and count rules) as the judge, with every
    text at its longest."""
    from slack_sdk.models.blocks import Block
    from slack_sdk.models.views import View

    options = [Option(key=k, label=f"option {k} " * 20) for k in "ABCDEFGHIJKLMNOPQRSTUVWXYZ"]
    calls = [GatedCall(action_id=f"c{i}", tool_name="t" * 300, arguments={"a": "x" * 900})
             for i in range(30)]  # fmt: skip
    req = _req(
        kind,
        prompt="<why> & " * 1000,
        context=QuestionContext(task="t" * 9000, last_message="m" * 9000),
        minimum=1,
        maximum=3,
        default="not a date",
        **({"options": options} if kind == InputType.CHOICE else {}),
        **({"calls": calls} if kind == InputType.APPROVAL else {}),
    )
    _, message = blocks.question_message(Question(Path("/ws"), req, "x"), REF, 2900, "https://i/")
    for b in message:
        Block.parse(b).validate_json()  # type: ignore[union-attr]
    for key in ("", "r"):
        View(**blocks.modal(req, REF, key)).validate_json()
    closed = Closed(Path("/ws"), "r", "answered", "a" * 500, "http")
    _, done = blocks.closed_message(req.prompt, closed, datetime.now(UTC), None)
    for b in done:
        Block.parse(b).validate_json()  # type: ignore[union-attr]


def test_the_endpoint_takes_no_token_and_a_capped_body() -> None:
    from deltad.http import limits

    rule = limits.rule_for("POST", "/v1/channels/slack/interactions")
    assert rule == limits.Rule("none", 256 * 1024)  # Slack's signature is its credential
    assert limits.rule_for("POST", "/v1/channels/slack").credential == "token"
    assert limits.rule_for("GET", "/v1/channels/slack/interactions").credential == "token"


def test_a_form_slack_would_not_open_is_said_and_changes_nothing(tmp_path: Path) -> None:
    with SlackApi() as api:
        ch = _channel(tmp_path, api, dm=False)
        ws, request_id = _ask(tmp_path, ch, input_type="text")
        api.fail("views.open", "expired_trigger_id")  # a trigger lives 3 s
        said = _interact(ch, _press(f"{ref_of(str(ws), request_id)}:", blocks.OPEN, "U0ALICE"))
        assert said is not None and "could not be opened; try again" in said["text"]
        assert not (ws / ".delta" / "interaction" / "response.json").exists()


def test_four_eyes_in_slack_a_press_is_a_vote_by_the_mapped_person(tmp_path: Path) -> None:
    """Two people must approve: alice's press is her vote (as "alice", the name her token
    has, so the page cannot count her twice) and the message stays open; bob's completes it."""
    with SlackApi() as api:
        ch = _channel(tmp_path, api, dm=False)
        ws, request_id = _ask(
            tmp_path, ch, input_type="approval", calls=[CALL], approvals_required=2
        )
        ref = ref_of(str(ws), request_id)
        assert _interact(ch, _press(f"{ref}:a", blocks.ANSWER, user="U0ALICE")) is None
        assert not (ws / ".delta" / "interaction" / "response.json").exists()
        again = _interact(ch, _press(f"{ref}:a", blocks.ANSWER, user="U0ALICE"))
        assert again is not None and "already voted" in again["text"]
        assert _interact(ch, _press(f"{ref}:a", blocks.ANSWER)) is None
        doc = json.loads((ws / ".delta" / "interaction" / "response.json").read_text())
        assert [v["by"] for v in doc["approvals"]] == ["alice", "bob"]
        assert (doc["channel"], doc["decisions"][0]["decision"]) == ("slack", "approve")


def test_four_eyes_in_slack_each_press_is_a_receipt_naming_the_click(tmp_path: Path) -> None:
    from dataclasses import replace

    from deltad.inbox import audit
    from deltad.outbound.hub import voting

    log = tmp_path / "audit.jsonl"
    with SlackApi() as api:
        ch = _channel(tmp_path, api, dm=False)
        ch.ctx = replace(ch.ctx, answer=voting(log))
        ws, request_id = _ask(
            tmp_path, ch, input_type="approval", calls=[CALL], approvals_required=2
        )
        ref = ref_of(str(ws), request_id)
        for user, ts in (("U0ALICE", "1700000000.000100"), ("U0BOB", "1700000000.000200")):
            press = _press(f"{ref}:a", blocks.ANSWER, user=user)
            press["container"] = {"channel_id": "C0DELTAD", "message_ts": ts}
            assert _interact(ch, press) is None
    entries = [json.loads(x) for x in audit.read_lines(log)]
    assert [(e["channel"], e["answered_by"], e["voter"], e["origin"]) for e in entries] == [
        ("slack", "U0ALICE", "alice",
         {"user": "U0ALICE", "conversation": "C0DELTAD", "message_ts": "1700000000.000100"}),
        ("slack", "U0BOB", "bob",
         {"user": "U0BOB", "conversation": "C0DELTAD", "message_ts": "1700000000.000200"}),
    ]  # fmt: skip
    assert [e["quorum"]["outcome"] for e in entries] == ["pending", "answered"]


def test_posts_an_older_deltad_recorded_in_the_core_are_still_updated(tmp_path: Path) -> None:
    """Before the sender kept the posts, the core's record did: they go along with the update,
    so a question posted before an upgrade is still marked answered after it."""
    with SlackApi(token="xoxb-unit") as api:
        ch = _channel(tmp_path, api, dm=False)
        ws, request_id = _ask(tmp_path, ch, input_type="yes_no")
        _drain(ch)
        ref = ref_of(str(ws), request_id)
        ch.records.change(ref, posts=[{"channel": "C0OLD", "ts": "1.000001"}])
        ch.withdraw(Closed(ws, request_id, "expired"))
        assert _drain(ch) == [None]
        [post] = api.calls("chat.postMessage")
        updated = [(u.args["channel"], u.args["ts"]) for u in api.calls("chat.update")]
        assert updated == [(post.result["channel"], post.result["ts"]), ("C0OLD", "1.000001")]


def test_a_press_by_someone_mapped_to_nobody_is_refused_and_on_record(tmp_path: Path) -> None:
    """A refusal before the answering path (a Slack user no deltad person) is a receipt with
    the click's origin, once; a press naming no question of ours puts nothing on record."""
    from dataclasses import replace

    from deltad.inbox import audit
    from deltad.outbound.hub import noting

    log = tmp_path / "audit.jsonl"
    with SlackApi() as api:
        ch = _channel(tmp_path, api, dm=False)
        ch.ctx = replace(ch.ctx, refused=noting(log, "slack"))
        ws, request_id = _ask(tmp_path, ch, input_type="approval", calls=[CALL])
        ref = ref_of(str(ws), request_id)
        assert _interact(ch, _press("0" * 32 + ":a", blocks.ANSWER, user="U0MALLORY"))
        press = _press(f"{ref}:a", blocks.ANSWER, user="U0MALLORY")
        press["container"] = {"channel_id": "C0DELTAD", "message_ts": "1700000000.000300"}
        said = _interact(ch, press)
        assert said is not None and "not a deltad user" in str(said.get("text"))
    assert not (ws / ".delta" / "interaction" / "response.json").exists()
    [entry] = [json.loads(x) for x in audit.read_lines(log)]
    assert (entry["kind"], entry["code"], entry["channel"], entry["answered_by"]) == (
        "refused",
        "not_mapped",
        "slack",
        "U0MALLORY",
    )
    assert entry["origin"] == {
        "user": "U0MALLORY",
        "conversation": "C0DELTAD",
        "message_ts": "1700000000.000300",
    }
