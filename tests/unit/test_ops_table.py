"""The operation table (deltad/inbox/ops.py): every operation is asked by the inbox (a route, an
MCP tool, or the inbox process's own use: vitals, a channel's relay, a mail reply), has its
handler, and crosses the privsep socket as the table says: asked by the inbox's `Remote`,
taken and dispatched by the core's monitor over a real connection, answered back. An operation
not in the table, or asked against its token rule, is refused and the connection goes on."""

from __future__ import annotations

import ast
import inspect
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import deltad
from deltad import wire
from deltad.http import child
from deltad.inbox import ops, schemas
from deltad.inbox.config import HttpConfig
from deltad.inbox.context import Context
from deltad.inbox.feed import Feed
from deltad.inbox.ops import OPS, ApiError
from deltad.inbox.tokens import Identity, TokenStore
from deltad.privsep import core

HTTP = Path(deltad.__file__).parent / "http"

# One call of each operation as the inbox asks it: its arguments (a new operation needs one).
EXAMPLES: dict[str, dict[str, Any]] = {
    "list_requests": {"workspace": "/srv/**", "limit": 5, "sort": "deadline", "due_within": "1h"},
    "get_request": {"request_id": "r1", "workspace": "/srv/a"},
    "answer": {
        "request_id": "r1",
        "body": {"answer": "b"},
        "idempotency_key": "k",
        "channel": "mcp",
    },
    "answer_many": {"items": [{"request_id": "r1"}, {"request_id": "r2"}], "body": {"answer": "y"}},
    "delegate": {"request_id": "r1", "to": "group:ops", "note": "yours"},
    "list_runs": {"status": "COMPLETED", "owner": "alice", "cursor": "c"},
    "get_run": {"run_id": "20260101_000000_abcdef"},
    "history": {"limit": 7},
    "check_link": {"link": "e30.AAAA"},
    "link_request": {"link": "e30.AAAA"},
    "link_answer": {"link": "e30.AAAA", "body": {"answer": "b"}},
    "channel_interaction": {
        "channel": "slack",
        "body": "payload=x",
        "timestamp": "1",
        "signature": "v0=0",
    },
    "vitals": {},
    "mail_reply": {"message": "1.m1", "token": "abc", "sender": "a@example.org", "text": "yes"},
}


def asked_by_the_inbox() -> dict[str, set[str]]:
    """Each operation name the inbox process's code asks (`<caller>.call("name", ...)`, or
    `call_json`), by the file that asks it."""
    asked: dict[str, set[str]] = {}
    for path in sorted(HTTP.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("call", "call_json")
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                asked.setdefault(node.args[0].value, set()).add(path.name)
    return asked


def test_every_operation_is_asked_by_the_inbox_and_nothing_else_is() -> None:
    asked = asked_by_the_inbox()
    assert set(asked) == set(OPS), "an operation nobody asks, or a name not in the table"
    # The API's and MCP's operations from their routes and tools; the rest by the process.
    for name in ("list_requests", "get_request", "answer"):
        assert asked[name] == {"app.py", "mcp_adapter.py"}, name
    for name in ("vitals", "channel_interaction", "mail_reply"):
        assert asked[name] == {"child.py"}, name


def test_every_operation_has_its_handler_taking_its_input() -> None:
    assert set(EXAMPLES) == set(OPS)
    for name, op in OPS.items():
        assert op.name == name
        params = list(inspect.signature(op.handler).parameters.values())
        assert [p.name for p in params[:2]] in (["ctx", "who"], ["mail", "who"]), name
        assert str(params[2].annotation).endswith(f"ops.{op.Input.__name__}"), name
        op.Input.model_validate(EXAMPLES[name])  # the example is a call the table takes


def test_the_documents_name_every_operation() -> None:
    design = (Path(deltad.__file__).parents[1] / "docs" / "design.md").read_text()
    assert [name for name in OPS if f"`{name}`" not in design] == []


# -- over a real connection: the inbox's Remote, the core's Monitor ---------------------------
class Connected:
    """A core's monitor serving one inbox connection (a socket pair), and the inbox's side:
    its `Remote` and the thread handing the core's replies to it."""

    def __init__(self, ctx: Context, mail: Any) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock = ours
        serving = core.Serving(ctx, mail=mail)
        self.monitor = core.Monitor(serving, theirs, [], "test")
        self.served = threading.Thread(target=self.monitor.serve, daemon=True)
        self.served.start()
        wire.send(ours, wire.Hello(op="hello", version=wire.VERSION))
        reader = wire.Reader(ours, wire.CORE_FRAME_MAX)
        assert isinstance(wire.FROM_CORE.validate_json(reader.frame()), wire.Welcome)
        self.remote = child.Remote(ours)
        self.lost = threading.Event()
        args = (reader, self.remote, Feed(10), self.lost.set)
        threading.Thread(target=child.listen_from_core, args=args, daemon=True).start()

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)
        self.served.join(10)
        self.sock.close()
        assert not self.served.is_alive() and self.lost.wait(10)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Connected, list[tuple[str, Any, Any, Any]]]]:
    """A connection whose every handler is a fake that records what reached it."""
    store = TokenStore(tmp_path)
    store.add("alice", [], "answerer")
    ctx = Context(Feed(10), store, HttpConfig(), b"k" * 32)
    seen: list[tuple[str, Any, Any, Any]] = []

    def handler_of(op: ops.Op) -> Any:
        def fake(target: Any, who: Identity | None, args: ops.Args) -> dict[str, Any]:
            seen.append((op.name, target, who, args))
            return {"op": op.name, "who": who.name if who else None, "args": args.model_dump()}

        return fake

    def mail(got: Any) -> dict[str, Any]:
        raise AssertionError("the handler is given the email channel's intake, not run here")

    mp = pytest.MonkeyPatch()
    mp.setattr(ops.Op, "handler", property(handler_of))
    c = Connected(ctx, mail)
    try:
        yield c, seen
    finally:
        c.close()
        mp.undo()


def test_every_operation_round_trips_over_the_wire(
    served: tuple[Connected, list[tuple[str, Any, Any, Any]]],
) -> None:
    c, seen = served
    alice = Identity("alice", "answerer", ())
    for name, args in EXAMPLES.items():
        op = OPS[name]
        got = c.remote.call(name, alice if op.token else None, **args)
        want = op.Input.model_validate(args)
        assert got == {
            "op": name,
            "who": "alice" if op.token else None,
            "args": want.model_dump(mode="json"),
        }
        [(handled, target, who, taken)] = seen
        seen.clear()
        assert handled == name and taken == want  # validated by the core as the table says
        assert (who is not None) == op.token  # the core read the token itself
        if op.http:
            assert isinstance(target, Context)
        else:  # mail_reply: the email channel's intake, not the HTTP context
            assert callable(target) and not isinstance(target, Context)


def test_an_operation_not_in_the_table_or_against_its_token_rule_is_refused(
    served: tuple[Connected, list[tuple[str, Any, Any, Any]]],
) -> None:
    c, seen = served
    for op, token, args, why in [
        ("drop_tables", "alice", {}, "no such operation"),
        ("answer ", "alice", {"request_id": "r", "body": {}}, "no such operation"),
        ("history", None, {}, "on behalf of a token"),  # a token's operation without one
        ("vitals", "alice", {}, "with no token"),  # a tokenless one with one
        ("history", "alice", {"limit": 501}, "args.limit"),  # over its input's cap
        ("check_link", None, {"link": "x", "as": "root"}, "args.as"),  # a field too many
    ]:
        with pytest.raises(ApiError) as e:
            c.remote.send(op, token, args)
        assert (e.value.http, e.value.code) == (400, "protocol"), op
        assert why in str(e.value), (op, str(e.value))
    assert seen == []  # no handler ran
    assert c.monitor.refused == 6
    assert c.remote.call("vitals")["op"] == "vitals"  # the connection goes on


def test_a_response_model_crosses_as_the_document_the_routes_send() -> None:
    """A handler's model is serialized once, straight to the reply frame: the same frame (and
    the same JSON data) its document would make, with what the handler left unset left out."""
    receipt = schemas.AnswerReceipt(
        status="accepted",
        request_id="r1",
        workspace="/srv/ws-\u00e9",
        run_id="20260101_000000_abcdef",
        answered_by="alice",
        channel="mcp",
    )
    frame = wire.encode_result(7, schemas.document_json(receipt))
    assert frame == wire.encode(wire.Reply(id=7, result=schemas.document(receipt)))
    reply = wire.FROM_CORE.validate_json(frame[wire.HEADER.size :])
    assert isinstance(reply, wire.Reply) and reply.id == 7 and reply.result is not None
    assert "answered" not in reply.result and "approvals" not in reply.result
