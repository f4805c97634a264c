"""The HTTP contract in-process: the OpenAPI document (valid, typed, with its security schemes
and every refusal declared as the error model), HEAD on every GET route, `Allow` on 405,
`WWW-Authenticate` on 401, and every error code's body as the document declares it (ASGI
in-process client, real workspace files)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from openapi_spec_validator import validate

from deltad.http.app import PUBLIC, WRITES, create_app, validation_refusal
from deltad.inbox import handlers, links, ops, schemas
from deltad.inbox.config import HttpConfig
from deltad.inbox.feed import Feed, View
from deltad.inbox.handlers import Context
from deltad.inbox.tokens import TokenStore
from deltad.protocol import InteractionRequest, Mailbox, Workspace, utcnow
from deltad.protocol.models import InputType, Option
from deltad.testing.stub import paused_workspace

# What each input type's question carries besides its prompt.
EXTRA: dict[InputType, dict[str, Any]] = {
    InputType.CHOICE: {"options": [Option(key="a", label="Apple"), Option(key="p", label="Pear")]},
    InputType.NUMBER: {"minimum": 1, "maximum": 9},
    InputType.APPROVAL: {"calls": [{"action_id": "call_1", "tool_name": "deploy"}]},
}


@dataclass
class Api:
    http: TestClient
    feed: Feed
    store: TokenStore
    root: Path
    auth: dict[str, str]

    def ask(self, name: str, **fields: Any) -> str:
        """A question waiting in workspace `name`, known to the index; its request id."""
        ws = self.root / name
        run_id = paused_workspace(ws)
        (ws / ".delta" / "interaction" / "request.json").unlink()
        fields.setdefault("prompt", "?")
        req = InteractionRequest(run_id=run_id, action_id="act_1", **fields)
        Mailbox(Workspace.at(ws)).post(req)
        self.feed.index.put(View(ws, "waiting", run_id, "WAITING_FOR_INPUT", req.request_id))
        return req.request_id

    def document(self) -> dict[str, Any]:
        doc: dict[str, Any] = self.http.get("/openapi.json").json()
        return doc


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    feed, store = Feed(), TokenStore(tmp_path / "state")
    ctx = Context(feed, store, HttpConfig(), os.urandom(32), base_url="http://127.0.0.1:1")
    token = store.add("alice", [], "answerer")
    with TestClient(create_app(ctx)) as http:
        yield Api(http, feed, store, tmp_path / "root", {"Authorization": f"Bearer {token}"})


def operations(doc: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in doc["paths"].items():
        for method, op in item.items():
            yield path, method, op


# -- the document ----------------------------------------------------------------------------------
def test_the_document_is_valid_openapi_with_its_security_schemes(api: Api) -> None:
    doc = api.document()
    validate(doc)
    assert doc["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "`deltad token add`",
    }
    for _, _, op in operations(doc):
        names = {p["name"].lower() for p in op.get("parameters", [])}
        assert not names & {"authorization", "x-csrf-token"}, op["operationId"]
        if op["operationId"] in PUBLIC:
            assert "security" not in op
        elif op["operationId"] == "whoami":  # the page's question before its login, too
            assert op["security"] == [{"bearer": []}, {"session": []}, {}]
        elif op["operationId"] in WRITES:
            assert op["security"] == [{"bearer": []}, {"session": [], "csrf": []}]
        else:
            assert op["security"] == [{"bearer": []}, {"session": []}]


def test_every_success_is_a_named_model_and_every_refusal_the_error_model(api: Api) -> None:
    doc = api.document()
    error = {"$ref": "#/components/schemas/ErrorOut"}
    for path, _, op in operations(doc):
        for status, response in op["responses"].items():
            if status.startswith("3"):  # the sign-in's redirects (OIDC): a Location, no body
                assert "content" not in response and response["description"], (path, status)
                continue
            content = response["content"]
            if status.startswith("4"):
                assert content == {"application/problem+json": {"schema": error}}, (path, status)
            elif path == "/v1/events":
                assert content == {"text/event-stream": {"schema": {"type": "string"}}}
            else:
                assert set(content) == {"application/json"}, (path, status)
                assert content["application/json"]["schema"]["$ref"].startswith(
                    "#/components/schemas/"
                )
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    question = doc["components"]["schemas"]["Question"]
    assert question["properties"]["input_type"] == {"$ref": "#/components/schemas/InputType"}
    assert doc["components"]["schemas"]["InputType"]["enum"] == [str(t) for t in InputType]


def test_links_lead_from_the_list_to_the_question_its_answer_and_the_run(api: Api) -> None:
    paths = api.document()["paths"]
    listed = paths["/v1/requests"]["get"]["responses"]["200"]["links"]
    assert {x["operationId"] for x in listed.values()} == {"get_request", "answer_request"}
    answered = paths["/v1/requests/{request_id}/answer"]["post"]["responses"]["202"]["links"]
    assert answered["GetRun"]["parameters"]["run_id"] == "$response.body#/run_id"


def test_the_answer_examples_are_answers_every_input_type_takes(api: Api) -> None:
    examples = schemas.answer_examples()
    for t in InputType:
        # The examples are for questions without bounds: a number's example is any number.
        fields = {} if t == InputType.NUMBER else EXTRA.get(t, {})
        rid = api.ask(f"ws-{t}", input_type=t, **fields)
        body = examples[str(t)]["value"]
        r = api.http.post(f"/v1/requests/{rid}/answer", json=body, headers=api.auth)
        assert r.status_code == 202, (t, r.text)
        schemas.AnswerReceipt.model_validate(r.json())


def test_a_document_goes_out_as_the_handler_made_it(api: Api) -> None:
    """Typed, but nothing added: a field a document leaves out (`agent_error`) stays out."""
    rid = api.ask("ws", input_type="approval", calls=[{"action_id": "c1", "tool_name": "t"}])
    ctx = api.http.app.state.ctx  # type: ignore[attr-defined]
    who = ctx.tokens.verify(api.auth["Authorization"].split()[1])
    made = schemas.document(handlers.get_request(ctx, who, ops.GetRequest(request_id=rid)))
    assert api.http.get(f"/v1/requests/{rid}", headers=api.auth).json() == made
    assert "schema" not in made["calls"][0]
    listed = api.http.get("/v1/requests", headers=api.auth).json()
    assert listed == {"requests": [made], "next": None}


# -- HTTP semantics --------------------------------------------------------------------------------
def test_head_answers_every_get_route_as_get_does_without_a_body(api: Api) -> None:
    rid = api.ask("ws", input_type="text")
    run_id = api.http.get(f"/v1/requests/{rid}", headers=api.auth).json()["run_id"]
    ws = str(api.root / "ws")
    link = links.sign(api.http.app.state.ctx.link_key, rid, ws, 60)  # type: ignore[attr-defined]
    gets = [
        "/",
        "/healthz",
        "/openapi.json",
        "/static/inbox.css",
        f"/a/{link}",
        "/v1/session",
        "/v1/requests",
        f"/v1/requests/{rid}",
        "/v1/requests/unknown",
        "/v1/runs",
        f"/v1/runs/{run_id}?workspace={ws}",
        f"/v1/links/{link}",
    ]
    for path in gets:
        got, head = api.http.get(path, headers=api.auth), api.http.head(path, headers=api.auth)
        assert (head.status_code, head.content) == (got.status_code, b""), path
        assert head.headers["content-type"] == got.headers["content-type"], path
    stream = api.http.head("/v1/events", headers=api.auth)  # endless as GET: headers only
    assert stream.status_code == 200 and stream.content == b""
    assert stream.headers["content-type"].startswith("text/event-stream")


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("TRACE", "/healthz", "GET, HEAD"),
        ("PUT", "/v1/session", "DELETE, GET, HEAD, POST"),
        ("DELETE", "/v1/requests", "GET, HEAD"),
        ("GET", "/v1/requests/x/answer", "POST"),
        ("PATCH", "/v1/links/x", "GET, HEAD"),
        ("POST", "/static/inbox.css", "GET, HEAD"),
        ("OPTIONS", "/", "GET, HEAD"),
    ],
)
def test_405_says_which_methods_are_allowed(api: Api, method: str, path: str, allow: str) -> None:
    r = api.http.request(method, path, headers=api.auth)
    assert r.status_code == 405 and r.headers["allow"] == allow
    assert r.json()["code"] == "method_not_allowed"


@pytest.mark.parametrize(
    ("method", "path", "headers", "body"),
    [
        ("GET", "/v1/requests", {}, None),
        ("GET", "/v1/events", {"Authorization": "Bearer dlt_forged"}, None),
        ("GET", "/v1/session", {"Authorization": "Basic eDp5"}, None),
        ("POST", "/v1/requests/x/answer", {}, {"answer": "yes"}),  # refused before the body
        ("POST", "/v1/session", {}, {"token": "dlt_forged"}),
    ],
)
def test_401_names_the_bearer_scheme(
    api: Api, method: str, path: str, headers: dict[str, str], body: object
) -> None:
    r = api.http.request(method, path, headers=headers, json=body)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert r.json()["code"] == "unauthorized"


@pytest.mark.parametrize(
    ("path", "problem", "status", "doc"),
    [
        (
            "/v1/session",
            {"type": "json_invalid", "loc": ("body", 1), "msg": "JSON decode error"},
            400,
            {"error": "the body is not valid JSON", "code": "bad_json"},
        ),
        (
            "/v1/requests/q/answer",
            {"type": "extra_forbidden", "loc": ("body", "answr"), "msg": "Extra inputs"},
            422,
            {"error": "answr: Extra inputs", "code": "misfit"},
        ),
        (
            "/v1/links/t/answer",
            {"type": "model_attributes_type", "loc": ("body",), "msg": "Not an object"},
            422,
            {"error": "(top level): Not an object", "code": "misfit"},
        ),
        (
            "/v1/session",
            {"type": "missing", "loc": ("body", "token"), "msg": "Field required"},
            422,
            {"error": "body.token: Field required", "code": "bad_request"},
        ),
        (
            "/v1/requests/q/answer",
            {"type": "enum", "loc": ("query", "workspace"), "msg": "Bad"},
            422,
            {"error": "query.workspace: Bad", "code": "bad_request"},
        ),
    ],
)
def test_what_a_request_that_does_not_fit_its_declaration_gets(
    path: str, problem: dict[str, Any], status: int, doc: dict[str, str]
) -> None:
    assert validation_refusal(path, [problem]) == (status, doc)


# -- every refusal, as declared --------------------------------------------------------------------
@dataclass(frozen=True)
class Refused:
    method: str
    path: str
    status: int
    code: str
    body: object = None
    raw: bytes | None = None
    reader: bool = False
    content_type: str = "application/json"  # with `raw`


FORM = "application/x-www-form-urlencoded"
REFUSALS = [
    Refused("POST", "/v1/requests/{open}/answer", 400, "bad_json", raw=b'{"answer": '),
    Refused("POST", "/v1/links/{link}/answer", 400, "bad_json", raw=b"[1,"),
    Refused("POST", "/v1/session", 400, "bad_json", raw=b"{"),
    Refused("POST", "/v1/requests/{open}/answer", 400, "bad_json", raw=b"[" * 10**5 + b"]" * 10**5),
    Refused("POST", "/v1/requests/{open}/answer", 403, "forbidden", {"answer": "x"}, reader=True),
    Refused("POST", "/v1/requests/{named}/answer", 403, "not_a_respondent", {"answer": "x"}),
    Refused("POST", "/v1/links/{named_link}/answer", 403, "not_a_respondent", {"answer": "x"}),
    Refused("GET", "/v1/requests/nope", 404, "unknown_request"),
    Refused("GET", "/v1/requests/{open}?workspace=/nowhere", 404, "unknown_workspace"),
    Refused("POST", "/v1/requests/nope/answer", 404, "unknown_request", {"answer": "x"}),
    Refused("GET", "/v1/runs/nope", 404, "unknown_run"),
    Refused("GET", "/v1/links/forged", 404, "bad_link"),
    Refused("POST", "/v1/requests/{waiting}/answer", 409, "answer_waiting", {"answer": "x"}),
    Refused("GET", "/v1/requests/{late}", 410, "expired"),
    Refused("POST", "/v1/requests/{late}/answer", 410, "expired", {"answer": "x"}),
    Refused("POST", "/v1/requests/{open}/answer", 413, "too_large", {"answer": "x" * 2**20}),
    Refused("POST", "/v1/requests/{open}/answer", 422, "misfit", {"answr": "x"}),
    Refused("POST", "/v1/requests/{open}/answer", 422, "misfit", [1]),
    Refused("POST", "/v1/requests/{open}/answer", 422, "misfit", {"comment": "no answer"}),
    Refused("POST", "/v1/links/{link}/answer", 422, "misfit", {"answer": 7}),
    Refused("POST", "/v1/session", 422, "bad_request", {}),
    Refused("POST", "/v1/answers", 415, "unsupported_media_type", raw=b"{}", content_type="text/x"),
    Refused(
        "POST", "/v1/session", 415, "unsupported_media_type", raw=b"token=x", content_type=FORM
    ),
    Refused(
        "POST",
        "/v1/requests/{open}/delegate",
        415,
        "unsupported_media_type",
        raw=b"to=b",
        content_type=FORM,
    ),
    Refused("GET", "/v1/requests?due_within=10", 422, "bad_page"),
    Refused("GET", "/v1/requests?input_type=essay", 422, "bad_request"),
    Refused("GET", "/v1/runs?status=SLEEPING", 422, "bad_request"),
    Refused("GET", "/v1/events?type=request.lost", 422, "bad_request"),
    Refused("GET", "/v1/requests?workspace=" + "*" * 1025, 422, "bad_glob"),
]


@pytest.mark.parametrize("case", REFUSALS, ids=lambda c: f"{c.status}-{c.code}-{c.path}")
def test_every_refusal_is_the_error_model_with_a_declared_status(api: Api, case: Refused) -> None:
    ids = {
        "open": api.ask("open", prompt="Name?"),
        "waiting": api.ask("waiting", prompt="Name?"),
        "late": api.ask("late", expires_at=utcnow() - timedelta(seconds=5)),
        "named": api.ask("named", respondents=["bob"]),
    }
    (api.root / "waiting" / ".delta" / "interaction" / "response.txt").write_text("Ann")
    ctx = api.http.app.state.ctx  # type: ignore[attr-defined]
    ids["link"] = links.sign(ctx.link_key, ids["open"], str(api.root / "open"), 60)
    ids["named_link"] = links.sign(ctx.link_key, ids["named"], str(api.root / "named"), 60)
    headers = dict(api.auth)
    if case.reader:
        headers["Authorization"] = "Bearer " + api.store.add("rita", [], "reader")
    path = case.path.format(**ids)
    if case.raw is not None:
        headers["Content-Type"] = case.content_type
        r = api.http.request(case.method, path, headers=headers, content=case.raw)
    else:
        r = api.http.request(case.method, path, headers=headers, json=case.body)
    assert (r.status_code, r.json()["code"]) == (case.status, case.code), r.text
    schemas.ErrorOut.model_validate(r.json())
    assert "\n" not in r.json()["error"]
    assert str(case.status) in _declared(api.document(), case.method, path)


def _declared(doc: dict[str, Any], method: str, path: str) -> set[str]:
    """The statuses the document declares for the operation serving `path`."""
    parts = path.split("?")[0].strip("/").split("/")
    for template, item in doc["paths"].items():
        pattern = template.strip("/").split("/")
        if len(pattern) == len(parts) and all(
            p.startswith("{") or p == q for p, q in zip(pattern, parts, strict=True)
        ):
            return set(item[method.lower()]["responses"])
    raise AssertionError(f"{method} {path} is not in the document")
