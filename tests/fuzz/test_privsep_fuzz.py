"""The core's side of the inbox protocol under fuzzing: whatever a (hostile) inbox sends, a
frame is refused with a reason or answered with a reply to its call id; the core never raises,
and nothing in a workspace changes (no token here may answer the open question: a reader, an
answerer scoped elsewhere, unknown names). The framing: frames or the connection's end."""

from __future__ import annotations

import atexit
import json
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from deltad import wire
from deltad.inbox import links, ops, paging, quorum
from deltad.inbox.config import HttpConfig
from deltad.inbox.context import Context
from deltad.inbox.feed import Feed, View
from deltad.inbox.tokens import TokenStore
from deltad.outbound import mail
from deltad.outbound.base import Context as ChannelContext
from deltad.outbound.config import EmailConfig
from deltad.outbound.email import EmailChannel
from deltad.privsep import core, monitor
from deltad.protocol import Mailbox, Workspace
from deltad.testing.stub import paused_workspace
from tests.fuzz import fuzz_settings

FUZZ = fuzz_settings(300)

_tmp = Path(tempfile.mkdtemp(prefix="deltad-privsep-fuzz-"))
atexit.register(shutil.rmtree, _tmp, True)  # (300 examples a run: thousands of dirs)
WS = _tmp / "root" / "ws"
WS.mkdir(parents=True)
OPTIONS = [{"key": "a", "label": "Red"}, {"key": "b", "label": "Blue"}]
RID = paused_workspace(WS, "Which colour?", input_type="choice", options=OPTIONS)
RUN_ID = (WS / ".delta" / "runs" / "LATEST").read_text().strip()
_tokens = TokenStore(_tmp / "inbox")
_tokens.add("watcher", [], "reader")
_tokens.add("elsewhere", ["/nowhere/**"], "answerer")
_feed = Feed()
_feed.index.put(View(WS, "waiting", RUN_ID, "WAITING_FOR_INPUT", RID, "choice", 1.0))
CTX = Context(
    feed=_feed,
    tokens=TokenStore(_tmp / "inbox"),
    config=HttpConfig(),
    link_key=links.load_key(_tmp),
    base_url="http://127.0.0.1:1",
)
NAMES = (
    "list_requests",
    "get_request",
    "answer",
    "list_runs",
    "get_run",
    "history",
    "check_link",
    "link_request",
    "link_answer",
    "answer_many",
    "delegate",
    "mail_reply",
)
OPS = {name: ops.OPS[name] for name in NAMES}


def _fields(op: ops.Op) -> tuple[str, ...]:
    """What a call of `op` names: its token (if asked on behalf of one) and its arguments."""
    return (("token",) if op.token else ()) + tuple(op.Input.model_fields)


def _frame(doc: dict[str, Any]) -> dict[str, Any]:
    """A call written flat (its op, id, token and arguments side by side, as these tests draw
    them) as the frame carries it: the token beside `op` for an operation asked on behalf of
    one, the arguments in `args`."""
    op = ops.OPS.get(doc.get("op")) if isinstance(doc.get("op"), str) else None
    head = {"op", "id"} | ({"token"} if op is not None and op.token else set())
    args = {k: v for k, v in doc.items() if k not in head}
    return {k: v for k, v in doc.items() if k in head} | {"args": args}


def _call(doc: dict[str, Any]) -> monitor.Request:
    call = monitor.decode(_encoded(_frame(doc)))
    assert isinstance(call, monitor.Request), call
    return call


def _tree() -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(WS.rglob("*")) if p.is_file()}


BEFORE = _tree()

text = st.text(st.characters(codec=None, exclude_categories=()), max_size=40)
scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | text
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=12,
)
FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "token": st.sampled_from(["watcher", "elsewhere", "mallory", "", "a" * 65]) | text,
    "request_id": st.sampled_from([RID, "nope", "../..", ""]) | text,
    "run_id": st.sampled_from([RUN_ID, "..", "x/y"]) | text,
    "workspace": st.sampled_from([None, str(WS), "/**", "/" + "*" * 40, str(WS) + "/.."]) | text,
    "body": st.sampled_from([{"answer": "b"}, {"answer": "Red"}, {"decisions": []}, {}])
    | st.dictionaries(text, json_values, max_size=3),
    "limit": st.integers(-5, 2000) | st.integers(),
    "cursor": st.none() | text,
    "owner": st.none() | st.sampled_from(["root", "0", "nobody"]) | text,
    "input_type": st.none() | st.sampled_from(["choice", "text", "bogus"]),
    "status": st.none() | st.sampled_from(["COMPLETED", "WAITING_FOR_INPUT", "bogus"]),
    "idempotency_key": st.none() | text,
    "link": st.sampled_from(["e30.AAAA", "", "."]) | text,
    "items": st.lists(
        st.fixed_dictionaries(
            {"request_id": st.sampled_from([RID, "nope", ""]) | text},
            optional={"workspace": st.sampled_from([None, str(WS), "/"]) | text},
        ),
        max_size=3,
    )
    | st.lists(st.just({"request_id": RID}), min_size=101, max_size=101)
    | json_values,
    "to": st.sampled_from(["elsewhere", "group:ops", "watcher", "", "x" * 81]) | text,
    "note": st.sampled_from(["", "n" * 2001]) | text,
    "sort": st.sampled_from(["newest", "oldest", "deadline", "bogus", ""]) | text,
    "older_than": st.none() | st.sampled_from(["1h", "0s", "999999d", "1" * 65]) | text,
    "due_within": st.none() | st.sampled_from(["10m", "-1m", "1h30m", "1s" * 40]) | text,
    "message": st.sampled_from(["1.m1", "../x", "", ".hidden", "a/b", "a" * 256]) | text,
    "sender": st.sampled_from(["alice@example.org", "mallory@example.org", ""]) | text,
    "text": st.none() | st.sampled_from(["b", "Blue", "yes", "x" * (ops.TEXT_MAX + 1)]) | text,
    "problem": st.none() | st.sampled_from(["unreadable", "unparsable", "bogus"]) | text,
    "automatic": st.booleans() | json_values,
    "message_id": st.none() | st.sampled_from(["<a@b>", "x" * 999]) | text,
    "authentication": st.lists(
        st.sampled_from(
            [
                "mta.example.test; dkim=pass header.d=example.org",
                "mta.example.test; dmarc=pass header.from=example.org",
                "x" * 3000,
            ]
        )
        | text,
        max_size=20,
    )
    | json_values,
}


@st.composite
def calls(draw: st.DrawFn) -> dict[str, Any]:
    """Calls shaped as the protocol's, with fields drawn from the nasty and the plausible,
    sometimes a field left out, sometimes one too many."""
    op = draw(st.sampled_from(sorted(OPS)))
    doc: dict[str, Any] = {"op": op, "id": draw(st.integers(-1, 2**60))}
    for name in _fields(OPS[op]):
        if draw(st.integers(0, 9)) > 0:
            doc[name] = draw(FIELDS.get(name, json_values))
    if draw(st.integers(0, 9)) == 0:
        doc[draw(text)] = draw(json_values)
    return _frame(doc)


def _encoded(doc: Any) -> bytes:
    return json.dumps(doc, ensure_ascii=False).encode("utf-8", "surrogatepass")


frames = (
    st.binary(max_size=300)
    | calls().map(_encoded)
    | st.dictionaries(text, json_values, max_size=5).map(_encoded)
    | json_values.map(_encoded)
)


@FUZZ
@given(frames)
@example(b'{"op": "answer", "id": 1, "token": "elsewhere", "request_id": "x", "body": {}}')
@example(b'{"op": "hello", "version": 1}')
@example(b'{"op": "answer", "id": 1, "token": "watcher", "args": {"request_id": "R", "body": {}}}')
@example(_encoded(_frame({"op": "answer", "id": 7, "token": "elsewhere", "request_id": RID,
                          "body": {}})))  # fmt: skip
@example(_encoded(_frame({"op": "link_answer", "id": 7, "link": "e30.AAAA",
                          "body": {"answer": "b"}})))  # fmt: skip
@example(_encoded(_frame({"op": "list_requests", "id": 2, "token": "watcher",
                          "workspace": "/" * 2000})))  # fmt: skip
@example(_encoded(_frame({"op": "get_request", "id": 3, "token": "watcher", "request_id": RID})))
def test_any_frame_is_refused_or_answered_and_changes_nothing(raw: bytes) -> None:
    call = monitor.decode(raw)
    if isinstance(call, str):
        assert call  # a reason, for the log
    else:
        frame = monitor.reply_to(CTX, None, call)
        reply = wire.FROM_CORE.validate_json(frame[wire.HEADER.size :])
        assert isinstance(reply, wire.Reply) and reply.id == call.id
        assert (reply.result is None) != (reply.error is None)
        if reply.error is not None:
            assert 400 <= reply.error.http < 600 and reply.error.http != 500, reply.error
    assert _tree() == BEFORE


@FUZZ
@given(st.lists(st.binary(max_size=64), max_size=8), st.integers(16, 4096))
@example([b"\x00\x00\x00\x02{}", b"\x00\x00\x00\x03[1]"], 64)
@example([b"\xff\xff\xff\xff"], 1024)
def test_the_framing_yields_frames_or_ends_the_connection(chunks: list[bytes], cap: int) -> None:
    a, b = socket.socketpair()
    try:
        for c in chunks:
            a.sendall(c)
        a.shutdown(socket.SHUT_WR)
        reader = wire.Reader(b, cap)
        got: list[bytes] = []
        try:
            while True:
                got.append(reader.frame())
        except wire.WireError:
            pass
        assert all(len(f) <= cap for f in got)
        data = b"".join(chunks)
        assert sum(len(f) + wire.HEADER.size for f in got) <= len(data)
    finally:
        a.close()
        b.close()


def _refusal(doc: dict[str, Any]) -> str | tuple[int, str] | None:
    """What the core makes of a call: a refusal's reason, the error's status and code, or
    None for a result."""
    call = monitor.decode(_encoded(_frame(doc)))
    if isinstance(call, str):
        return call
    reply = wire.FROM_CORE.validate_json(monitor.reply_to(CTX, None, call)[wire.HEADER.size :])
    assert isinstance(reply, wire.Reply)
    return None if reply.error is None else (reply.error.http, reply.error.code)


def test_list_requests_sort_and_durations_are_bounded_and_rechecked_by_the_core() -> None:
    ask = {"op": "list_requests", "id": 5, "token": "watcher"}
    for bad in (
        {"sort": "bogus"},  # not one of the sorts
        {"sort": None},
        {"older_than": ""},  # a duration is at least one character
        {"older_than": "1" * 65},  # over its bound (64)
        {"due_within": "1s" * 33},
        {"due_within": 600},  # a duration is text
        {"older_than": "1h", "younger_than": "1h"},  # a field too many
    ):
        assert isinstance(_refusal({**ask, **bad}), str), bad
    # Within bounds but not a duration: refused by the core as the API would refuse it.
    assert _refusal({**ask, "older_than": "ten minutes"}) == (422, "bad_page")
    assert _refusal({**ask, "due_within": "400d"}) == (422, "bad_page")
    # Within bounds and well formed: answered, in every sort, with the handlers' page.
    for extra in ({"sort": "oldest"}, {"sort": "deadline", "due_within": "10m"}, {}):
        got = monitor.serve(CTX, None, _call({**ask, **extra}))
        assert set(got) == {"requests", "next"} and got["next"] is None, extra
    # A cursor of another sort is refused by the core (the cursor carries its sort).
    crossed = {**ask, "sort": "deadline", "cursor": paging.encode("requests", (1.0, "a", "b"))}
    assert _refusal(crossed) == (422, "bad_page")
    # Out of scope: the token's scope is the core's, whatever the sort.
    far = {**ask, "token": "elsewhere", "sort": "deadline", "older_than": "1s"}
    assert monitor.serve(CTX, None, _call(far))["requests"] == []
    assert _refusal({**ask, "token": "mallory", "sort": "oldest"}) == (401, "unauthorized")


def test_forged_bulk_answers_are_bounded_and_rechecked_by_the_core() -> None:
    ask = {"op": "answer_many", "id": 6, "token": "elsewhere", "body": {"answer": "b"}}
    one = [{"request_id": RID, "workspace": str(WS)}]
    for bad in (
        {"items": []},  # at least one
        {"items": [{"request_id": RID}] * (ops.BULK_MAX + 1)},  # over its bound
        {"items": [{"request_id": RID, "workspace": str(WS), "run_id": "x"}]},  # extra field
        {"items": [{"request_id": "r" * (ops.TEXT_MAX + 1)}]},
        {"items": one, "body": "b"},  # a body is an object
        {"items": one, "token": "a" * 65},
    ):
        assert isinstance(_refusal({**ask, **bad}), str), bad
    # Well formed: the core checks the token's role and scope for each question.
    assert _refusal({**ask, "token": "watcher", "items": one}) == (403, "forbidden")
    assert _refusal({**ask, "token": "mallory", "items": one}) == (401, "unauthorized")
    got = monitor.serve(CTX, None, _call({**ask, "items": one * 2}))
    assert got["accepted"] == 0 and got["refused"] == 2
    assert all(r["status"] == "refused" for r in got["results"])
    assert _tree() == BEFORE


def test_forged_hand_overs_are_bounded_and_rechecked_by_the_core() -> None:
    ask = {"op": "delegate", "id": 7, "token": "elsewhere", "request_id": RID, "to": "watcher"}
    for bad in (
        {"to": ""},
        {"to": "x" * 81},  # over its bound
        {"note": "n" * 2001},
        {"request_id": None},
        {"to": "watcher", "respondents": ["mallory"]},  # a field too many
    ):
        assert isinstance(_refusal({**ask, **bad}), str), bad
    assert _refusal({**ask, "token": "watcher"}) == (403, "forbidden")  # a reader
    assert _refusal({**ask, "token": "mallory"}) == (401, "unauthorized")
    # An answerer whose scope does not hold the workspace cannot hand its question over.
    out = _refusal({**ask, "workspace": str(WS)})
    assert isinstance(out, tuple) and out[0] in (403, 404), out
    assert _tree() == BEFORE


COUNT = st.integers(-1, 2**60) | st.sampled_from([1e300, "1", None])
counts = st.fixed_dictionaries(
    {"op": st.just("deliveries"), "target": st.sampled_from(["email", "pager", ""]) | text},
    optional={"sent": COUNT, "retry": COUNT, "dead": COUNT, "depth": COUNT},
)


@FUZZ
@given(st.lists(counts.map(_encoded) | st.binary(max_size=80), max_size=6))
def test_channel_counts_from_the_inbox_never_shrink_a_counter_or_raise(
    frames: list[bytes],
) -> None:
    """Whatever counts a taken-over inbox sends: refused in one line, or added to the core's
    counter for a configured channel only, never taken back."""
    from prometheus_client import CollectorRegistry, Counter

    from deltad.outbound.handoff import Handoff

    sends = Counter("s", "s", ["target", "kind", "result"], registry=CollectorRegistry())
    d = Path(tempfile.mkdtemp(prefix="deltad-counts-fuzz-", dir=_tmp))
    (d / "inbox").mkdir()
    box = Handoff(d / "inbox", d, [], [], None, sends, [("email", 10)])

    def total() -> dict[tuple[str, str], float]:
        return {
            (s.labels["target"], s.labels["result"]): s.value
            for s in sends.collect()[0].samples
            if s.name.endswith("_total")
        }

    try:
        for raw in frames:
            before = total()
            msg = core.decode_message(raw)
            if isinstance(msg, wire.Deliveries):
                box.report(msg)
            after = total()
            assert all(after.get(k, 0.0) >= v for k, v in before.items())
            assert {c for c, _ in after} <= {"email"}
    finally:
        box.close()
        shutil.rmtree(d, ignore_errors=True)


# -- mail the inbox relays (deltad/outbound/maildir.py), decided by the email channel ----------
MAIL_WS = _tmp / "root" / "mailed"
MAIL_WS.mkdir(parents=True)
# Only bob may answer; the reply address below is alice's: every relay is refused, however deep
# its checks go (a real grant, a configured person, the question read from the workspace).
paused_workspace(MAIL_WS, "Ship it?", input_type="yes_no", respondents=["bob"])
_asked = Mailbox(Workspace.at(MAIL_WS)).read_request()
assert _asked is not None
MAIL_RID = _asked.request_id
EMAIL = EmailChannel(
    EmailConfig.model_validate(
        {
            "from_address": "deltad@d.example",
            "reply_domain": "d.example",
            "maildir": str(_tmp / "Maildir"),
            "smtp": {"host": "127.0.0.1", "port": 9, "security": "none"},
            "people": {"alice@example.org": "alice", "bob@example.org": "bob"},
        }
    ),
    ChannelContext(_tmp / "email", quorum.answer_or_vote, lambda d: None),  # nothing goes out
)
MAIL_GRANT, MAIL_TOKEN = EMAIL.grants.issue(MAIL_RID, MAIL_WS, "alice@example.org", 2e9)
TAMPERED = MAIL_TOKEN[:-1] + ("1" if MAIL_TOKEN[-1] == "0" else "0")  # its MAC, one digit off
FIELDS["token"] = FIELDS["token"] | st.sampled_from(
    [MAIL_TOKEN, MAIL_TOKEN.upper(), TAMPERED, "0" * 36, None]
)


def _mail_tree() -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(MAIL_WS.rglob("*")) if p.is_file()}


MAIL_BEFORE = _mail_tree()


@st.composite
def relays(draw: st.DrawFn) -> dict[str, Any]:
    doc: dict[str, Any] = {"op": "mail_reply", "id": draw(st.integers(-1, 2**53))}
    for name in ops.MailReply.model_fields:
        if draw(st.integers(0, 9)) > 0:
            doc[name] = draw(FIELDS[name])
    if draw(st.integers(0, 19)) == 0:
        doc[draw(text)] = draw(json_values)
    return _frame(doc)


@FUZZ
@given(relays().map(_encoded))
@example(_encoded(_frame({"op": "mail_reply", "id": 1, "message": "1", "token": MAIL_TOKEN,
                          "sender": "alice@example.org", "text": "yes"})))  # fmt: skip
@example(_encoded(_frame({"op": "mail_reply", "id": 2, "message": "1", "token": MAIL_TOKEN,
                          "sender": "ALICE@example.org", "text": "yes",
                          "automatic": False})))  # fmt: skip
@example(_encoded(_frame({"op": "mail_reply", "id": 3, "message": "1", "token": MAIL_TOKEN,
                          "sender": "mallory@example.org", "text": "yes"})))  # fmt: skip
@example(_encoded(_frame({"op": "mail_reply", "id": 4, "message": "1",
                          "problem": "unparsable"})))  # fmt: skip
def test_any_relayed_mail_is_refused_or_decided_and_answers_nothing(raw: bytes) -> None:
    """Whatever a hostile inbox relays as mail, the core refuses the frame or the channel
    decides on it (never a 500, never an exception), and no answer is written."""
    call = monitor.decode(raw)
    if isinstance(call, str):
        assert call
    else:
        assert call.op.name == "mail_reply"
        reply = wire.FROM_CORE.validate_json(monitor.reply_to(None, EMAIL.receive, call)[4:])
        assert isinstance(reply, wire.Reply) and reply.id == call.id
        assert reply.error is None and reply.result is not None, reply
        assert reply.result["result"] == "refused", reply.result
        assert EMAIL.grants.claimed_by(MAIL_GRANT) is None  # nothing claimed its address
    assert _mail_tree() == MAIL_BEFORE


def test_a_relayed_mail_is_bounded_and_rechecked_by_the_core() -> None:
    ask = {"op": "mail_reply", "id": 8, "message": "1.m1", "sender": "alice@example.org"}
    for bad in (
        {"message": "../tokens.json"},  # a name, never a path
        {"message": ".hidden"},
        {"message": "a" * 256},
        {"text": "x" * (ops.TEXT_MAX + 1)},
        {"sender": "a" * (ops.SENDER_MAX + 1)},
        {"token": "0" * 65},
        {"problem": "bogus"},
        {"answered_by": "root"},  # a field too many: who answered is the core's to say
    ):
        assert isinstance(monitor.decode(_encoded(_frame({**ask, **bad}))), str), bad

    def verdict(**over: Any) -> str:
        call = _call({**ask, "token": MAIL_TOKEN, "text": "yes", **over})
        reply = wire.FROM_CORE.validate_json(monitor.reply_to(None, EMAIL.receive, call)[4:])
        assert isinstance(reply, wire.Reply) and reply.result is not None
        return str(reply.result.get("code"))

    assert verdict(token="0" * 36) == "unknown_address"  # forged: not signed with our key
    assert verdict(token=TAMPERED) == "unknown_address"
    assert verdict(token=None) == "no_reply_address"
    assert verdict(sender="mallory@example.org") == "not_allowed"  # not whom it was given to
    assert verdict() == "not_a_respondent"  # alice's address, bob's question
    assert verdict(automatic=True) == "auto_reply"
    assert verdict(problem="unparsable") == "unreadable"
    # Before the channel is started, the core says so and the inbox keeps the message.
    call = _call({**ask, "token": MAIL_TOKEN})
    reply = wire.FROM_CORE.validate_json(monitor.reply_to(None, None, call)[4:])
    assert isinstance(reply, wire.Reply) and reply.error is not None
    assert (reply.error.http, reply.error.code) == (503, "not_ready")
    assert _mail_tree() == MAIL_BEFORE
    assert mail.SENDER_MAX == ops.SENDER_MAX
