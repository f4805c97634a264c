"""The HTTP contract: a pydantic model for every request and response body, the error model,
which status codes each route can answer, the security schemes and the OpenAPI links that let
a client (or a fuzzer) go from a list to one question, its answer and its run.

The question's vocabulary comes from the protocol (`InputType`, `kinds`), so a new input type
shows up here without an edit: in the `input_type` enum, `expects`, the question's fields
(each kind's own request fields, typed as the request types them), its `form` (the page's
controls), the answer body's fields (each kind's `answer_fields`) and the answer examples.

Response models keep fields they do not name (`extra="allow"`): a newer daemon may add fields
to a document, and a typed client must not lose them. The routes send only what the handler
set (`response_model_exclude_unset`): a field a document leaves out stays out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel, WithJsonSchema, create_model

from deltad.inbox.answer_body import AnswerIn
from deltad.inbox.ops import BULK_MAX
from deltad.protocol import kinds
from deltad.protocol.kinds import Form, kind_of
from deltad.protocol.models import InputType, InteractionRequest, Option, QuestionContext
from deltad.protocol.states import RunStatus

JSON = "application/json"
PROBLEM = "application/problem+json"  # RFC 9457, every refusal (deltad/http/problems.py)
ERROR_REF = "#/components/schemas/ErrorOut"
EVENT_STREAM = "text/event-stream"


class _Out(BaseModel):
    model_config = ConfigDict(extra="allow")


def document(out: BaseModel) -> dict[str, Any]:
    """A response model as its JSON document: the fields its handler set, by their names in
    the document (as the routes send it: `response_model_exclude_unset`)."""
    return out.model_dump(mode="json", by_alias=True, exclude_unset=True)


def document_json(out: BaseModel) -> bytes:
    """`document(out)`, serialized (UTF-8 JSON)."""
    return out.model_dump_json(by_alias=True, exclude_unset=True).encode()


# -- errors ----------------------------------------------------------------------------------------
class ErrorOut(BaseModel):
    """Every refusal, as an RFC 9457 problem document (`application/problem+json`): one line for
    a person, a stable code for a program."""

    type: str = Field(default="about:blank", description="RFC 9457: always `about:blank`.")
    title: str = Field(default="", description="RFC 9457: the HTTP status's phrase.")
    status: int = Field(default=0, description="RFC 9457: the HTTP status code.")
    detail: str = Field(default="", description="RFC 9457: what is wrong, in one line.")
    error: str = Field(description="The same line as `detail` (kept for older clients).")
    code: str = Field(description="Stable, machine-readable: `unknown_request`, `misfit`, ...")
    workspaces: list[str] | None = Field(
        default=None,
        description="With 409 `ambiguous_request`/`ambiguous_run`: the workspaces to choose from.",
    )


# What each status means on this API, for the declared responses.
STATUS_MEANING: dict[int, str] = {
    400: "Malformed JSON (`bad_json`) or a malformed request line or header.",
    401: "No credential, or one that is not valid (`unauthorized`). Sent with "
    "`WWW-Authenticate: Bearer`.",
    403: "A reader's answer, an answer from "
    "someone the question does not name, or a session write without its `X-CSRF-Token` "
    "(`forbidden`, `not_a_respondent`, `csrf`).",
    404: "Unknown question (or one open only outside the token's scope), run, workspace (or "
    "one outside the token's scope: the same answer) or "
    "link (`unknown_request`, `unknown_run`, `unknown_workspace`, `bad_link`, `not_found`).",
    405: "Method not allowed; `Allow` lists those that are (`method_not_allowed`).",
    409: "Answered already, an answer waiting, or an id held by several workspaces "
    "(`already_answered`, `answer_waiting`, `ambiguous_request`, `ambiguous_run`, "
    "`workspace_problem`).",
    410: "The question expired, or the signed link did (`expired`).",
    413: "The body, or the answer file it would make, is over its limit (`too_large`).",
    415: "A body that is not JSON, or not sent as `Content-Type: application/json` "
    "(`unsupported_media_type`).",
    422: "The body or a parameter does not fit (`misfit`, `bad_request`, `bad_glob`, "
    "`idempotency_mismatch`, `unknown_delegate`).",
    429: "This token holds `max_streams_per_token` event streams already (`too_many_streams`); "
    "sent with `Retry-After`, and the connection closes.",
    502: "The OpenID provider could not be reached, or answered what is not its discovery "
    "document (`provider_unavailable`).",
}


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The `responses` entry for the error statuses a route can answer."""
    return {c: {"model": ErrorOut, "description": STATUS_MEANING[c]} for c in codes}


# -- questions -------------------------------------------------------------------------------------
def _expects() -> list[str]:
    """What a person is asked for, per input type (the kinds' own words)."""
    return sorted({kind_of(t).expects for t in InputType})


class GatedCallOut(_Out):
    action_id: str
    tool_name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    resolved_command: str = ""
    schema_: dict[str, Any] | None = Field(
        default=None,
        alias="schema",
        description="The tool's parameter schema (JSON Schema), when the agent could be read.",
    )


class DelegationOut(_Out):
    """One hand-over of a question."""

    by: str = Field(description="The token that handed it over.")
    to: str = Field(description="The token name or `group:NAME` it was handed to.")
    note: str = ""
    at: str = Field(description="When, RFC 3339 (UTC).")


class VoteOut(_Out):
    """One vote on a question needing several approvals (four eyes)."""

    by: str = Field(description="The token (or a channel's sender) that voted.")
    channel: str
    at: str = Field(description="When, RFC 3339 (UTC).")
    verdict: Literal["approve", "reject", "answer"]


class ApprovalsOut(_Out):
    """Four eyes: how many agreeing votes the question needs and those given so far."""

    required: int = Field(description="Distinct people who must agree (2 or more).")
    owner_may_approve: bool = Field(description="false: the workspace owner's vote is refused.")
    given: list[VoteOut] = Field(description="The votes so far, oldest first.")


VIA = (
    "What carried it to people: `email`, `slack`, `webhook`, `command`; [] when no channel "
    "is configured to (it was recorded and shown here, and nobody was told); null in a "
    "record from before deltad kept this."
)


class EscalationOut(_Out):
    at: str = Field(description="When, RFC 3339 (UTC).")
    to: list[str] = Field(description="The token names or `group:NAME`s added as respondents.")
    via: list[str] | None = Field(default=None, description=VIA)


class FollowUpOut(_Out):
    """Reminders and escalation of an open question (docs/inbox.md)."""

    reminders: list[str] = Field(default_factory=list, description="When each came due.")
    reminders_via: list[str] | None = Field(
        default=None, description="Of the last reminder: " + VIA
    )
    escalated: EscalationOut | None = None
    sla_due_at: str | None = Field(
        default=None, description="When the answer is due (the SLA); ends nothing."
    )
    overdue_at: str | None = Field(
        default=None, description="When the daemon said the SLA had passed (request.overdue)."
    )


class QuestionBase(_Out):
    """What every question has; `Question` adds each kind's own fields."""

    request_id: str
    workspace: str = Field(description="Escaped when the name is not plain UTF-8 text.")
    run_id: str
    action_id: str
    node_id: str | None = Field(description="A pipeline's gate or node asking, else null.")
    respondents: list[str] = Field(
        default_factory=list, description="Who may answer (token names or groups); [] is anyone."
    )
    delegations: list[DelegationOut] = Field(
        default_factory=list,
        description="Who the question was handed to, oldest first; each delegate may answer "
        "too (POST /v1/requests/{request_id}/delegate).",
    )
    approvals: ApprovalsOut | None = Field(
        default=None,
        description="Four eyes: null when one answer decides; else the votes given so far "
        '(docs/inbox.md, "Four eyes").',
    )
    follow_up: FollowUpOut | None = Field(
        default=None,
        description="Reminders sent, the escalation (its people may answer too) and the SLA's "
        "due time; null when the question asks for none.",
    )
    context: QuestionContext | None = Field(
        default=None, description="What to decide with, from the journal when it was asked."
    )
    prompt: str
    input_type: InputType
    expects: str = Field(description="What the answer is, in words.", examples=_expects())
    form: Form = Field(description="How the web page asks for the answer (from its kind).")
    calls: list[GatedCallOut] = Field(description="The gated calls a decision is asked on.")
    default: str | None
    expires_at: str | None = Field(description="RFC 3339 (UTC), or null for never.")
    bounds: str | None = Field(
        default=None,
        description="What the answer must lie within, in words (a number's range, a date's "
        "window), or null.",
    )
    after_deadline: str | None = Field(
        default=None,
        description="What an unanswered question gets at `expires_at`, in words: "
        "`the default, 'beta'`, `TIMEOUT` (reported to the agent; not consent) or `rejected`.",
    )
    sensitive: bool = Field(description="The answer is a secret (a password is always).")
    allow_empty: bool
    timestamp: str = Field(description="When it was asked, RFC 3339 (UTC).")
    agent: str
    task: str
    answer_waiting: bool
    last_refusal: str | None = Field(description="Why the last answer file was set aside.")
    url: str = Field(description="The question in the web page.")
    agent_error: str | None = Field(
        default=None, description="Why the calls are shown without their tools' schemas."
    )


def _kind_fields() -> dict[str, Any]:
    """Each kind's request fields, typed as the request types them (null or empty for a
    question of another kind)."""
    fields: dict[str, Any] = {}
    for name in kinds.request_fields():
        if name in QuestionBase.model_fields:
            raise ValueError(f"a kind's request field {name!r} is already a question field")
        users = ", ".join(f"`{t}`" for t in kinds.kinds_with(name))
        annotation = InteractionRequest.model_fields[name].annotation
        fields[name] = (annotation, Field(description=f"For {users}."))
    return fields


if TYPE_CHECKING:
    Question = QuestionBase  # an annotation: the kinds' fields are added below
else:
    Question = create_model(
        "Question",
        __base__=QuestionBase,
        __doc__="A pending question, as `GET /v1/requests/{request_id}` shows it.",
        **_kind_fields(),
    )


class QuestionPage(_Out):
    requests: list[Question]
    next: str | None = Field(default=None, description="The cursor of the next page, if any.")


@dataclass(frozen=True)
class Spliced:
    """A response already serialized as `document_json` serializes its model (the core sends
    it as it is): a page joined from its items' kept JSON."""

    json: bytes


def question_page_json(items: list[bytes], next_: str | None) -> Spliced:
    """`document_json(QuestionPage(requests=..., next=next_))` for the documents whose JSON
    (each `document_json` of a Question) is `items`, without validating and dumping them
    again: what a page of kept documents costs is the join (tests/unit/test_inbox_documents)."""
    cursor = b"null" if next_ is None else json.dumps(next_, ensure_ascii=False).encode()
    return Spliced(b'{"requests":[' + b",".join(items) + b'],"next":' + cursor + b"}")


# -- answers ---------------------------------------------------------------------------------------
# The body of an answer: each kind's answer fields (what `response.json` holds, minus the
# `request_id`); the inbox's own model, so the document and the check are one.
AnswerBody = AnswerIn


def answer_examples() -> dict[str, dict[str, Any]]:
    """An answer to each input type, in the words its kind suggests (OpenAPI `examples`)."""
    out: dict[str, dict[str, Any]] = {}
    for t in InputType:
        req = InteractionRequest(
            prompt="?", input_type=t, run_id="r", action_id="a", options=_OPTIONS
        )
        word = kind_of(t).example(req)
        value: dict[str, Any] = {"answer": word if word is not None else "s3cret"}
        out[str(t)] = {"summary": f"a {t} question", "value": value}
        out |= kind_of(t).body_examples()  # a kind's other shapes of answer
    return out


_OPTIONS = [Option(key="a", label="Approve"), Option(key="r", label="Reject")]


class AnswerReceipt(_Out):
    """202: the answer is in the mailbox; the daemon resumes the run."""

    status: Literal["accepted"]
    request_id: str
    workspace: str
    run_id: str
    answered_by: str = Field(description="The token's name, or `signed link`.")
    # The API's routes answer `http` or `link`; the same receipt reaches an MCP host (not this
    # document's) with `mcp`.
    channel: Annotated[
        Literal["http", "link", "mcp"],
        WithJsonSchema({"type": "string", "enum": ["http", "link"]}),
    ]
    answered: bool | None = Field(
        default=None,
        description="Four eyes only: false when this was a vote and the question still waits "
        "for others; true when it completed the answer.",
    )
    approvals: ApprovalsOut | None = Field(default=None, description="Four eyes only.")


class AnswerItem(BaseModel):
    model_config = ConfigDict(extra="forbid")
    request_id: str
    workspace: str | None = Field(
        default=None, description="Which workspace, where the id is open in several (exact path)."
    )


class AnswersIn(BaseModel):
    """One answer for many questions of the same kind and options."""

    model_config = ConfigDict(extra="forbid")
    items: list[AnswerItem] = Field(
        min_length=1, max_length=BULK_MAX, description=f"1 to {BULK_MAX} questions."
    )
    answer: AnswerBody = Field(description="The answer each question gets, as for one.")


class AnswerResult(_Out):
    """One question's result: `accepted` (as `answer_request`'s 202) or `refused`, with the
    code and line that question alone would have got."""

    status: Literal["accepted", "refused"]
    request_id: str
    workspace: str | None = None
    code: str | None = Field(default=None, description="With `refused`: `misfit`, ...")
    http: int | None = Field(default=None, description="With `refused`: the status alone.")
    error: str | None = Field(default=None, description="With `refused`: why, in one line.")


class AnswersOut(_Out):
    accepted: int
    refused: int
    results: list[AnswerResult] = Field(description="One per item, in the order given.")


class DelegateIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    to: str = Field(
        min_length=1,
        max_length=80,
        description="A token name, `group:NAME` or (with `http.oidc`) `oidc:NAME` to hand it to.",
    )
    note: str = Field(default="", max_length=2000, description="Why; shown with the question.")


class DelegateOut(_Out):
    status: Literal["delegated"]
    request_id: str
    workspace: str
    run_id: str
    respondents: list[str]
    delegations: list[DelegationOut]


# -- runs ------------------------------------------------------------------------------------------
class RunSummary(_Out):
    workspace: str
    run_id: str
    status: RunStatus
    task: str
    agent: str
    start_time: str
    updated_at: str
    end_time: str | None
    iterations_completed: int
    error: str | None
    error_kind: str | None


class RunPage(_Out):
    runs: list[RunSummary]
    next: str | None = Field(default=None, description="The cursor of the next page, if any.")


class HistoryDecision(_Out):
    action_id: str | None
    decision: str | None
    tool_name: str | None = None
    asked_arguments: dict[str, Any] | None = Field(
        default=None, description="With `edit`: the call's arguments as the model asked."
    )
    arguments: dict[str, Any] | None = Field(
        default=None, description="With `edit`: the arguments it ran with instead."
    )
    reason: str | None = None


class HistoryEntry(_Out):
    """An answer given (`kind: answered`) or a run that ended (`kind: run_ended`)."""

    kind: str = Field(description="answered | run_ended")
    at: str | None
    workspace: str
    run_id: str
    request_id: str | None = None
    input_type: str | None = None
    prompt: str | None = None
    outcome: str | None = None
    answered_by: str | None = None
    channel: str | None = None
    answer: str | None = Field(default=None, description="Never shown for a sensitive question.")
    decisions: list[HistoryDecision] = Field(default_factory=list)
    status: str | None = None
    reason: str | None = Field(
        default=None, description="Why a run that did not complete stopped (run_ended)."
    )
    final_message: str | None = Field(
        default=None,
        description="run_ended: the outcome's final message (the last message at COMPLETED, the "
        "reason otherwise), at most 2,000 characters; the whole of it is in GET /v1/runs/{id}.",
    )
    final_message_truncated: bool | None = Field(
        default=None, description="run_ended: whether final_message was cut."
    )
    duration_seconds: float | None = Field(
        default=None, description="run_ended: from the run's start to this end."
    )


class History(_Out):
    history: list[HistoryEntry]


class RunDetail(RunSummary):
    last_message: str | None = Field(description="The model's last message.")
    outcome: dict[str, Any] | None = Field(
        default=None, description="A finished run's outcome (null while it is not finished)."
    )
    journal: list[dict[str, Any]] = Field(description="The journal's last 50 events.")


# -- sessions, links, health -----------------------------------------------------------------------
class LoginIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    token: str = Field(description="A bearer token, exchanged for a session cookie.")


class SessionOut(_Out):
    signed_in: Literal[True] = Field(description="This credential is signed in.")
    name: str
    role: Literal["reader", "answerer", "admin"]
    scopes: list[str]
    csrf: str | None = Field(description="Send it as `X-CSRF-Token` on every write.")


class SignedOut(_Out):
    """`GET /v1/session` with no credential at all (no `Authorization`, no session cookie):
    nobody is signed in. A credential that does not check out is a 401 instead."""

    signed_in: Literal[False]
    sign_in_with: str | None = Field(
        default=None,
        description="The OpenID provider's name when `http.oidc` is set: the page offers "
        "signing in through it (`GET /v1/oidc/login`).",
    )


class WhoAmI(RootModel[SessionOut | SignedOut]):
    """`GET /v1/session`: who this credential is, or that nobody is signed in."""


class LoggedOut(_Out):
    status: Literal["logged out"]


class HealthCheck(_Out):
    name: str
    ok: bool
    detail: str


class Health(_Out):
    """The status code decides (Kubernetes' convention); the body is for people."""

    status: Literal["ok", "failing"]
    checks: list[HealthCheck] | None = None  # with ?verbose


# -- OpenAPI: security and links -------------------------------------------------------------------
SECURITY_SCHEMES: dict[str, Any] = {
    "bearer": {"type": "http", "scheme": "bearer", "description": "`deltad token add`"},
    "session": {
        "type": "apiKey",
        "in": "cookie",
        "name": "deltad_session",
        "description": "The web page's login (`POST /v1/session`).",
    },
    "csrf": {
        "type": "apiKey",
        "in": "header",
        "name": "X-CSRF-Token",
        "description": "With a session, on every write: the `csrf` the login returned.",
    },
}
READ_SECURITY: list[dict[str, list[str]]] = [{"bearer": []}, {"session": []}]
WRITE_SECURITY: list[dict[str, list[str]]] = [{"bearer": []}, {"session": [], "csrf": []}]

# From a list or a receipt to what a client does next (also what a fuzzer follows).
LINKS: dict[str, dict[str, dict[str, Any]]] = {
    "list_requests": {
        "GetRequest": {
            "operationId": "get_request",
            "parameters": {"request_id": "$response.body#/requests/0/request_id"},
        },
        "AnswerRequest": {
            "operationId": "answer_request",
            "parameters": {
                "request_id": "$response.body#/requests/0/request_id",
                "workspace": "$response.body#/requests/0/workspace",
            },
        },
    },
    "answer_request": {
        "GetRun": {
            "operationId": "get_run",
            "parameters": {
                "run_id": "$response.body#/run_id",
                "workspace": "$response.body#/workspace",
            },
        }
    },
    "list_runs": {
        "GetRun": {
            "operationId": "get_run",
            "parameters": {
                "run_id": "$response.body#/runs/0/run_id",
                "workspace": "$response.body#/runs/0/workspace",
            },
        }
    },
}


def finish(
    doc: dict[str, Any],
    writes: set[str],
    public: set[str],
    anonymous_too: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """The generated document, completed: security schemes, each operation's security
    (`writes` need the CSRF header with a session; `public` none; `anonymous_too` answer
    without a credential as well: `{}` among their requirements), and the links."""
    doc.setdefault("components", {})["securitySchemes"] = SECURITY_SCHEMES
    for item in doc.get("paths", {}).values():
        for op in item.values():
            op_id = op.get("operationId")
            if op_id not in public:
                op["security"] = WRITE_SECURITY if op_id in writes else READ_SECURITY
            if op_id in anonymous_too:
                op["security"] = [*READ_SECURITY, {}]
            for status, response in op.get("responses", {}).items():
                if status.startswith("4"):  # a refusal is a problem document on any route
                    response["content"] = {PROBLEM: {"schema": {"$ref": ERROR_REF}}}
            for link_status in ("200", "202"):
                if op_id in LINKS and link_status in op.get("responses", {}):
                    op["responses"][link_status]["links"] = LINKS[op_id]
    return doc
