"""The MCP adapter's mapping from the inbox's read model to MCP results, from tables: a
question as a list entry and whole, the tool arguments as an answer body, question URIs,
bearer tokens, refusals, the MCP path's body cap and its configuration; and the tools over a
stand-in for the core's calls (what reaches the core, what is refused before)."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from deltad.http import mcp_adapter as m
from deltad.http.limits import ANSWER_BODY_MAX, SMALL_BODY_MAX, Rule, rule_for
from deltad.inbox import ops
from deltad.inbox.config import HttpConfig, McpConfig
from deltad.inbox.ops import ApiError
from deltad.inbox.tokens import Identity, TokenStore
from deltad.protocol import InteractionRequest
from deltad.protocol.kinds import form

CHOICE = {
    "request_id": "r1",
    "workspace": "/srv/ws one",
    "run_id": "run1",
    "prompt": "Which release channel?",
    "input_type": "choice",
    "options": [{"key": "s", "label": "stable"}, {"key": "b", "label": "beta"}],
    "form": {
        "control": "keys",
        "keys": [
            {"key": "s", "label": "stable", "answer": "s"},
            {"key": "b", "label": "beta", "answer": "b"},
        ],
    },
    "sensitive": False,
    "timestamp": "2026-11-27T10:00:00Z",
    "expires_at": None,
    "task": "ship it",
    "url": "http://127.0.0.1:8470/#request=r1",
    "default": None,
}


@pytest.mark.parametrize(
    ("doc", "want"),
    [
        (
            CHOICE,
            {
                "request_id": "r1",
                "workspace": "/srv/ws one",
                "input_type": "choice",
                "prompt": "Which release channel?",
                "task": "ship it",
                "asked_at": "2026-11-27T10:00:00Z",
                "expires_at": None,
                "sensitive": False,
                "url": "http://127.0.0.1:8470/#request=r1",
                "options": ["s: stable", "b: beta"],
            },
        ),
        (  # a long prompt is cut to a preview; a secret says so; no options, no key
            {"request_id": "r2", "prompt": "x" * 500, "input_type": "password", "sensitive": True},
            {
                "request_id": "r2",
                "workspace": None,
                "input_type": "password",
                "prompt": "x" * (m.PROMPT_PREVIEW - 1) + "…",
                "task": None,
                "asked_at": None,
                "expires_at": None,
                "sensitive": True,
                "url": None,
            },
        ),
        (  # an option whose label is its key, and a bare string
            {"request_id": "r3", "options": [{"key": "y", "label": "y"}, "plain"]},
            {"options": ["y", "plain"], "prompt": "", "sensitive": False},
        ),
    ],
)
def test_a_question_as_a_list_entry(doc: dict[str, Any], want: dict[str, Any]) -> None:
    got = m.summary(doc)
    assert {k: got[k] for k in want} == want
    assert ("options" in got) == ("options" in want)


@pytest.mark.parametrize(
    ("page", "text", "structured"),
    [
        ({"requests": [], "next": None}, "No question is waiting for you.", []),
        (
            {"requests": [CHOICE], "next": "c2"},
            "[r1] (choice) Which release channel? — options: s: stable, b: beta — workspace "
            "/srv/ws one\n(more: call list_questions again with cursor = next_cursor)",
            ["r1"],
        ),
        (
            {"requests": [{**CHOICE, "options": None, "sensitive": True}], "next": None},
            "[r1] (choice) Which release channel? — a secret: answer it on the inbox page — "
            "workspace /srv/ws one",
            ["r1"],
        ),
    ],
)
def test_a_page_as_list_questions_result(
    page: dict[str, Any], text: str, structured: list[str]
) -> None:
    r = m.list_result(page)
    assert not r.is_error
    assert r.content[0].text == text  # type: ignore[union-attr]
    assert r.structured_content is not None
    assert [q["request_id"] for q in r.structured_content["questions"]] == structured
    assert r.structured_content["next_cursor"] == page["next"]


def test_a_question_whole_leaves_out_the_pages_form_and_what_is_unset() -> None:
    q = m.question(CHOICE)
    assert "form" not in q and "default" not in q and "expires_at" not in q
    assert q["options"] == CHOICE["options"] and q["run_id"] == "run1"
    r = m.question_result(
        {
            **CHOICE,
            "expects": "one of the options",
            "bounds": "s or b",
            "expires_at": "2026-11-28T10:00:00Z",
            "after_deadline": "the default, 'stable'",
            "calls": [{"action_id": "a1", "tool_name": "rm", "arguments": {"path": "/x"}}],
        }
    )
    text = r.content[0].text  # type: ignore[union-attr]
    for part in (
        "Which release channel?",
        "Expects: one of the options",
        "Bounds: s or b",
        'Gated call a1: rm({"path": "/x"})',
        "Expires at 2026-11-28T10:00:00Z (the default, 'stable')",
    ):
        assert part in text


@pytest.mark.parametrize(
    ("args", "body"),
    [
        ({"request_id": "r1", "answer": "beta"}, {"answer": "beta"}),
        (
            {"request_id": "r1", "workspace": "/w", "answer": "no", "comment": "later"},
            {"answer": "no", "comment": "later"},
        ),
        (
            {"request_id": "r1", "decisions": [{"action_id": "a", "decision": "approve"}]},
            {"decisions": [{"action_id": "a", "decision": "approve"}]},
        ),
        ({"request_id": "r1"}, {}),  # the answering path says what is missing
    ],
)
def test_tool_arguments_as_the_apis_answer_body(args: dict[str, Any], body: dict[str, Any]) -> None:
    assert m.answer_body(args) == body


@pytest.mark.parametrize(
    ("rid", "workspace"),
    [("r1", "/srv/ws one"), ("a/b?c", "/srv/ws?x=1&y#2"), ("é", "/srv/wé")],
)
def test_a_questions_uri_round_trips(rid: str, workspace: str) -> None:
    uri = m.uri_of({"request_id": rid, "workspace": workspace})
    assert uri.startswith(m.URI_PREFIX) and " " not in uri
    assert m.parse_uri(uri) == (rid, workspace)
    assert m.resource_of({"request_id": rid, "workspace": workspace}).uri == uri


@pytest.mark.parametrize(
    "uri", ["https://example.org/x", "deltad://questions/", "deltad://runs/r1", ""]
)
def test_what_is_not_a_questions_uri_is_refused(uri: str) -> None:
    with pytest.raises(ValueError):
        m.parse_uri(uri)


def test_refusals_say_the_apis_code_and_line() -> None:
    r = m.refused("unknown_request", "no question r9 for this token")
    assert r.is_error and r.structured_content == {
        "error": "no question r9 for this token",
        "code": "unknown_request",
    }
    assert r.content[0].text == "refused (unknown_request): no question r9 for this token"  # type: ignore[union-attr]
    s = m.secret_refused(CHOICE)
    assert s.is_error and s.structured_content is not None
    assert s.structured_content["code"] == "secret"
    assert "never answered over MCP" in s.structured_content["error"]
    assert CHOICE["url"] in s.structured_content["error"]


@pytest.fixture
def tokens(tmp_path: Path) -> tuple[TokenStore, dict[str, str]]:
    store = TokenStore(tmp_path)
    made = {
        "alice": store.add("alice", ["/srv/*"], "answerer"),
        "rita": store.add("rita", ["/srv/*"], "reader"),
        "prom": store.add("prom", [], "metrics"),
    }
    return store, made


@pytest.mark.parametrize(
    ("header", "want"),
    [
        ("Bearer {alice}", "alice"),
        ("bearer   {alice}  ", "alice"),
        ("Bearer {rita}", "rita"),  # a reader may list and read (answering is refused later)
        (None, (401, "a bearer token is needed")),
        ("", (401, "a bearer token is needed")),
        ("Basic {alice}", (401, "a bearer token is needed")),
        ("Bearer ", (401, "a bearer token is needed")),
        ("Bearer not-a-token", (401, "not valid")),
        ("Bearer {prom}", (403, "may only read /metrics")),
    ],
)
def test_who_calls_from_the_authorization_header(
    tokens: tuple[TokenStore, dict[str, str]], header: str | None, want: str | tuple[int, str]
) -> None:
    store, made = tokens
    value = header.format(**made) if header is not None else None
    if isinstance(want, str):
        assert m.identify(store, value).name == want
        return
    with pytest.raises(m.Unauthorized) as e:
        m.identify(store, value)
    assert (e.value.http, want[1] in str(e.value)) == (want[0], True)


class Core:
    """A stand-in for the core's operations: records what reaches it, answers from a table."""

    def __init__(self, docs: dict[str, dict[str, Any]]) -> None:
        self.docs = docs
        self.asked: list[tuple[str, ...]] = []

    def call(self, op: str, who: Identity | None = None, /, **args: Any) -> Any:
        ops.prepared(op, who, args)  # checked as the inbox's Remote checks it before sending
        return getattr(self, op)(who, **args)

    def list_requests(self, who: Identity, **kw: Any) -> Any:
        mine = ("mine",) if kw.get("mine") else ()
        self.asked.append(("list", str(kw["limit"]), str(kw["cursor"]), *mine))
        return {"requests": list(self.docs.values()), "next": None}

    def get_request(self, who: Identity, request_id: str, workspace: str | None) -> Any:
        self.asked.append(("get", request_id))
        if request_id not in self.docs:
            raise ApiError(404, "unknown_request", f"no question {request_id} for this token")
        return self.docs[request_id]

    def answer(
        self,
        who: Identity,
        request_id: str,
        body: Any,
        idempotency_key: Any,
        workspace: Any,
        channel: str,
    ) -> Any:
        rid, key, ws = request_id, idempotency_key, workspace
        self.asked.append(("answer", rid, str(body), str(key), str(ws), channel))
        doc = self.get_request(who, rid, ws)
        if doc.get("sensitive"):  # as the core refuses it
            raise ApiError(403, "secret", f"question {rid} asks for a secret (never over MCP)")
        return {"request_id": rid, "answered_by": who.name, "channel": channel, "workspace": ws}


ALICE = Identity("alice", "answerer", ("/srv/*",))
RITA = Identity("rita", "reader", ("/srv/*",))


@pytest.mark.parametrize(
    ("who", "tool", "args", "code", "reached"),
    [
        (ALICE, "list_questions", {}, None, [("list", "20", "None")]),
        (ALICE, "list_questions", {"limit": 100, "cursor": "c"}, None, [("list", "100", "c")]),
        (ALICE, "list_questions", {"limit": 101}, "bad_page", []),
        (ALICE, "list_questions", {"limit": True}, "bad_page", []),
        (ALICE, "list_questions", {"workspace": 3}, "bad_request", []),
        (ALICE, "list_questions", {"mine": True}, None, [("list", "20", "None", "mine")]),
        (ALICE, "list_questions", {"mine": False}, None, [("list", "20", "None")]),
        (ALICE, "list_questions", {"mine": "yes"}, "bad_request", []),
        (ALICE, "get_question", {}, "bad_request", []),
        (ALICE, "get_question", {"request_id": "r9"}, "unknown_request", [("get", "r9")]),
        (ALICE, "get_question", {"request_id": "r1"}, None, [("get", "r1")]),
        (
            ALICE,
            "answer_question",
            {"request_id": "r1", "answer": "b", "workspace": "/w", "idempotency_key": "k1"},
            None,
            [("answer", "r1", "{'answer': 'b'}", "k1", "/w", "mcp"), ("get", "r1")],
        ),
        (
            ALICE,
            "answer_question",
            {"request_id": "pw", "answer": "x"},
            "secret",
            [("answer", "pw", "{'answer': 'x'}", "None", "None", "mcp"), ("get", "pw")],
        ),
        (RITA, "answer_question", {"request_id": "r1", "answer": "b"}, "forbidden", []),
        (
            ALICE,
            "answer_question",
            {"request_id": "r9"},
            "unknown_request",
            [("answer", "r9", "{}", "None", "None", "mcp"), ("get", "r9")],
        ),
        (ALICE, "answer_question", {"request_id": "r1", "idempotency_key": 7}, "bad_request", []),
        (ALICE, "drop_tables", {}, "unknown_tool", []),
    ],
)
def test_the_tools_over_the_cores_calls(
    tokens: tuple[TokenStore, dict[str, str]],
    who: Identity,
    tool: str,
    args: dict[str, Any],
    code: str | None,
    reached: list[tuple[str, ...]],
) -> None:
    core = Core({"r1": CHOICE, "pw": {**CHOICE, "request_id": "pw", "sensitive": True}})
    result = m.Inbox(core, tokens[0]).tool(who, tool, args)  # type: ignore[arg-type]
    assert result.is_error == (code is not None)
    if code is not None:
        assert result.structured_content is not None
        assert result.structured_content["code"] == code
    assert core.asked == reached


@pytest.mark.parametrize(
    ("path", "rule"),
    [
        ("/mcp", Rule("token", ANSWER_BODY_MAX)),
        ("/mcp/", Rule("token", ANSWER_BODY_MAX)),
        ("/mcpx", Rule("none", SMALL_BODY_MAX)),
        ("/", Rule("none", SMALL_BODY_MAX)),
    ],
)
def test_the_mcp_path_takes_a_token_and_an_answers_body(path: str, rule: Rule) -> None:
    assert rule_for("POST", path, "/mcp") == rule
    assert rule_for("POST", "/mcp") == Rule("none", SMALL_BODY_MAX)  # not mounted


@pytest.mark.parametrize(
    ("given", "want"),
    [
        ({}, McpConfig(enabled=True, path="/mcp")),
        ({"path": "/inbox/mcp/"}, McpConfig(path="/inbox/mcp")),
        ({"enabled": False}, McpConfig(enabled=False)),
        ({"path": "mcp"}, "should match pattern"),
        ({"path": "/v1"}, "must not be under a path the inbox already serves"),
        ({"path": "/v1/mcp"}, "must not be under a path the inbox already serves"),
        ({"path": "/metrics/"}, "must not be under a path the inbox already serves"),
        ({"path": "/a/x"}, "must not be under a path the inbox already serves"),
        ({"path": "/"}, "should match pattern"),
        ({"max_sessions": 0}, "greater than or equal to 1"),
        ({"session_idle_seconds": 0}, "greater than 0"),
        ({"tools": []}, "Extra inputs are not permitted"),
    ],
)
def test_the_mcp_config(given: dict[str, Any], want: McpConfig | str) -> None:
    if isinstance(want, McpConfig):
        assert HttpConfig.model_validate({"mcp": given}).mcp == want
        return
    with pytest.raises(ValidationError, match=want):
        HttpConfig.model_validate({"mcp": given})


@pytest.mark.parametrize(
    ("workspace", "told"),
    [
        ("/srv/a/ws", ["alice", "root"]),
        ("/srv/b/ws", ["bob", "root"]),
        ("/elsewhere", ["root"]),
        (None, ["alice", "bob", "root"]),  # an event naming no workspace: a hint to all
    ],
)
def test_listeners_are_told_only_of_the_workspaces_their_token_sees(
    tmp_path: Path, workspace: str | None, told: list[str]
) -> None:
    store = TokenStore(tmp_path)
    for name, scope in (("alice", "/srv/a/*"), ("bob", "/srv/b/*"), ("root", "/**")):
        store.add(name, [scope], "answerer")
    hub = m.Hub(store, cap=3)
    heard: list[str] = []
    unsubscribe = {}
    for name in ("alice", "bob", "root"):
        held = store.by_name(name)
        assert held is not None
        unsubscribe[name] = hub.view(held[1]).subscribe(lambda e, n=name: heard.append(n))
    hub.changed(workspace)
    assert heard == told
    with pytest.raises(m.MCPError, match="3 listening streams are open already"):
        hub.subscribe(ALICE, lambda e: None)
    # A revoked token hears nothing more; one gone is forgotten.
    store.revoke("root")
    unsubscribe["alice"]()
    heard.clear()
    hub.changed(None)
    assert heard == ["bob"] and len(hub) == 2


def test_a_person_signed_in_through_oidc_is_told_within_their_workspaces(tmp_path: Path) -> None:
    """A person has no token to look up: told as their scope allows (not dropped as revoked)."""
    hub = m.Hub(TokenStore(tmp_path), cap=2)
    carol = Identity("oidc:carol@x.org", "answerer", ("/srv/a/*",), also=("oidc:c1",))
    heard: list[str] = []
    hub.view(carol).subscribe(lambda e: heard.append("carol"))
    hub.changed("/srv/b/ws")
    assert heard == []
    hub.changed("/srv/a/ws")
    hub.changed(None)
    assert heard == ["carol", "carol"]


def _asked(input_type: str, **fields: Any) -> dict[str, Any]:
    """A question document as the API serves it: its `form` from the kind (protocol/kinds.py)."""
    req = InteractionRequest(prompt="?", input_type=input_type, run_id="r", action_id="a", **fields)
    return {**req.model_dump(mode="json"), "form": form(req).model_dump(mode="json")}


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        (_asked("text"), {"type": "string", "title": "Answer"}),
        (
            _asked(
                "choice", options=[{"key": "s", "label": "stable"}, {"key": "b", "label": "beta"}]
            ),
            {
                "type": "string",
                "title": "Answer",
                "oneOf": [{"const": "s", "title": "stable"}, {"const": "b", "title": "beta"}],
            },
        ),
        (
            _asked("yes_no"),
            {
                "type": "string",
                "title": "Answer",
                "oneOf": [{"const": "yes", "title": "Yes"}, {"const": "no", "title": "No"}],
            },
        ),
        (
            _asked("number", minimum=1, maximum=20),
            {"type": "number", "title": "Answer", "minimum": 1, "maximum": 20},
        ),
        (_asked("number"), {"type": "number", "title": "Answer"}),
        (_asked("date"), {"type": "string", "title": "Answer", "format": "date"}),
        (
            _asked("approval", calls=[{"action_id": "c1", "tool_name": "shell"}]),
            {"type": "string", "title": "Decision", "enum": ["approve", "reject"]},
        ),
        (_asked("password"), None),  # never in a form
        (_asked("text", sensitive=True), None),
        ({"input_type": "something-new"}, None),  # no form: nothing to build one from
    ],
)
def test_a_question_as_an_elicitation_form(
    doc: dict[str, Any], field: dict[str, Any] | None
) -> None:
    schema = m.elicitation(doc)
    if field is None:
        assert schema is None
        return
    assert schema is not None and schema["required"] == ["answer"]
    assert schema["properties"]["answer"] == field
    assert ("reason" in schema["properties"]) == (doc["input_type"] == "approval")


@pytest.mark.parametrize(
    ("control", "content", "text"),
    [
        ("input", {"answer": "to staging"}, "to staging"),
        ("input", {"answer": 3.0}, "3"),
        ("input", {"answer": 2.5}, "2.5"),
        ("keys", {"answer": "b"}, "b"),
        ("decisions", {"answer": "approve", "reason": "fine"}, "approve"),
        ("decisions", {"answer": "reject", "reason": "too wide"}, "reject: too wide"),
        ("decisions", {"answer": "reject"}, "reject"),
        ("keys", {"answer": "reject", "reason": "x"}, "reject"),  # a reason only for decisions
        ("input", {}, ""),  # the kind says what is wrong with an empty answer
    ],
)
def test_a_filled_form_as_the_answers_text(
    control: str, content: dict[str, Any], text: str
) -> None:
    assert m.elicited_text(control, content) == text


@pytest.mark.parametrize(
    ("who", "responses", "state", "kind", "reached"),
    [
        (ALICE, None, None, "input_required", [("get", "r1")]),
        (ALICE, None, None, "secret", [("get", "pw")]),
        (RITA, None, None, "forbidden", []),
        (
            ALICE,
            {"answer": m.types.ElicitResult(action="accept", content={"answer": "b"})},
            '{"workspace": "/srv/ws one", "control": "keys"}',
            None,
            [("answer", "r1", "{'answer': 'b'}", "None", "/srv/ws one", "mcp"), ("get", "r1")],
        ),
        (
            ALICE,
            {"answer": m.types.ElicitResult(action="decline")},
            '{"workspace": "/srv/ws one", "control": "keys"}',
            "declined",
            [],
        ),
    ],
)
def test_answering_through_a_form(
    tokens: tuple[TokenStore, dict[str, str]],
    who: Identity,
    responses: dict[str, Any] | None,
    state: str | None,
    kind: str | None,
    reached: list[tuple[str, ...]],
) -> None:
    core = Core({"r1": CHOICE, "pw": {**CHOICE, "request_id": "pw", "sensitive": True}})
    rid = "pw" if kind == "secret" else "r1"
    got = m.Inbox(core, tokens[0]).elicit(who, {"request_id": rid}, responses, state)  # type: ignore[arg-type]
    if kind == "input_required":
        assert isinstance(got, m.types.InputRequiredResult) and got.input_requests is not None
        assert got.request_state is not None
        assert set(got.input_requests) == {"answer"}
    else:
        assert isinstance(got, m.types.CallToolResult)
        assert got.is_error == (kind is not None)
        if kind is not None:
            assert got.structured_content is not None
            assert got.structured_content["code"] == kind
    assert core.asked == reached


class Session:
    """A handshake-era session as the hub holds it: told on its standalone stream."""

    def __init__(self, name: str, heard: list[str], gone: bool = False) -> None:
        self.name, self.heard, self.gone = name, heard, gone

    async def send_resource_list_changed(self) -> None:
        if self.gone:
            raise ConnectionError("the client left")
        self.heard.append(self.name)


def test_handshake_era_sessions_are_told_in_scope_and_forgotten_when_gone(
    tmp_path: Path,
) -> None:
    store = TokenStore(tmp_path)
    for name, scope in (("alice", "/srv/a/*"), ("bob", "/srv/b/*")):
        store.add(name, [scope], "answerer")
    hub = m.Hub(store, cap=1, sessions=2)
    heard: list[str] = []

    async def main() -> None:
        for sid, name, gone in (
            ("s0", "alice", False),
            ("s1", "alice", True),
            ("s2", "bob", False),
        ):
            held = store.by_name(name)
            assert held is not None
            hub.remember(sid, held[1], Session(sid, heard, gone))  # type: ignore[arg-type]
        assert list(hub._legacy) == ["s1", "s2"]  # the oldest beyond the cap is forgotten
        hub.changed("/srv/a/ws")
        await asyncio.gather(*hub._sending, return_exceptions=True)
        assert heard == [] and list(hub._legacy) == ["s2"]  # s1 left: forgotten
        hub.changed("/srv/b/ws")
        await asyncio.gather(*hub._sending, return_exceptions=True)
        assert heard == ["s2"]

    asyncio.run(main())


def test_the_documented_mcp_block_is_valid_and_the_defaults() -> None:
    """config/deltad.yaml's commented `http.mcp` block, uncommented, is the defaults."""
    import yaml

    text = (Path(__file__).resolve().parents[2] / "config" / "deltad.yaml").read_text()
    lines = text[text.index("#   mcp:") :].splitlines()
    block = [lines[0]] + [
        x for x in itertools.takewhile(lambda x: x.startswith("#     "), lines[1:])
    ]
    doc = yaml.safe_load("\n".join(x.removeprefix("#   ") for x in block))
    assert McpConfig.model_validate(doc["mcp"]) == McpConfig()
    assert set(doc["mcp"]) == set(McpConfig.model_fields)  # every key documented


def test_the_mcp_path_is_bounded_like_an_answer_and_a_stranger_gets_401_first(
    tmp_path: Path,
) -> None:
    """In-process: the credential from the headers, then the body's cap, before the SDK (which
    is not even loaded for a refusal)."""
    import os

    from fastapi.testclient import TestClient

    from deltad.http.app import create_app
    from deltad.inbox.feed import Feed
    from deltad.inbox.handlers import Context

    store = TokenStore(tmp_path / "state")
    ctx = Context(Feed(), store, HttpConfig(), os.urandom(32), base_url="http://127.0.0.1:1")
    app = create_app(ctx)
    auth = {"Authorization": f"Bearer {store.add('alice', [], 'answerer')}"}
    big = b'{"jsonrpc": "2.0", "id": 1, "x": "' + b"x" * ANSWER_BODY_MAX + b'"}'
    with TestClient(app) as http:
        r = http.post("/mcp", content=big)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        r = http.post("/mcp", content=big, headers=auth)
        assert r.status_code == 413 and r.json()["code"] == "too_large"
        r = http.get("/mcp", headers={"Authorization": "Bearer nope"})  # no body: the endpoint's
        assert r.status_code == 401 and r.json()["code"] == "unauthorized"
    assert app.state.mcp.endpoint is None  # nothing reached the SDK


@pytest.mark.parametrize(
    ("doc", "text"),
    [
        (
            {"request_id": "r1", "answered_by": "alice", "workspace": "/w", "channel": "mcp"},
            "Answered question r1 as alice: the run in /w resumes.",
        ),
        (  # four eyes: a vote that does not complete the answer yet
            {
                "request_id": "r1",
                "answered_by": "alice",
                "answered": False,
                "approvals": {"required": 2, "given": [{"by": "alice"}]},
            },
            "Vote counted on question r1 as alice: 1 of 2 approvals; the run resumes once "
            "enough people agree.",
        ),
        (  # the vote that completes it
            {
                "request_id": "r1",
                "answered_by": "bob",
                "workspace": "/w",
                "answered": True,
                "approvals": {"required": 2, "given": [{"by": "alice"}, {"by": "bob"}]},
            },
            "Answered question r1 as bob: the run in /w resumes.",
        ),
    ],
)
def test_the_cores_answer_as_a_tool_result(doc: dict[str, Any], text: str) -> None:
    r = m.answered_result(doc)
    assert not r.is_error and r.content[0].text == text  # type: ignore[union-attr]
    assert r.structured_content == doc
