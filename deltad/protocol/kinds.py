"""The vocabulary of questions: each input type, whole, in one entry.

An entry says how an answer is read (`read`), what a timeout means (`timeout`), what
`--auto-approve` answers (`auto`), how the question is shown to a person (`expects`,
`example`, `hints`) and what extra `ask_human` arguments it takes (`schema`, `from_args`).
`kind_of` dispatches with `match` and `assert_never`, so a new `InputType` without an entry
fails the type check instead of silently falling through to "text".

The edges are generated from these entries: the model's `ask_human` tool (the `input_type`
enum, its description, each kind's arguments), the HTTP API's question document (each kind's
request `fields`) and the inbox page's answer field (`form`: the input's type and attributes).

Adding a type: a member of `InputType` (models.py), any request fields it needs (models.py),
and its entry here.
"""

from __future__ import annotations

import re
from datetime import date
from typing import Any, Literal, assert_never

from pydantic import BaseModel, Field

from .accelerators import build_options
from .models import InputType, InteractionRequest
from .replies import AnswerRejected, CallDecision, Decision, Reply

NOT_CONSENT = "A timeout is not consent and not a refusal: do not retry the same action"


class FormKey(BaseModel):
    """A button of the page's answer form, with its accelerator key."""

    key: str = Field(description="Shown on the button; pressing it (any case) presses it.")
    label: str
    answer: str | None = Field(default=None, description="`keys`: the answer it sends.")
    decision: Decision | None = Field(
        default=None,
        description="`decisions`: the decision it sends for every call (`edit` first opens "
        "each call's arguments to edit).",
    )
    style: Literal["", "primary", "danger", "edit"] = ""
    reason: bool = Field(default=False, description="`decisions`: a reason field goes with it.")


class Form(BaseModel):
    """How the inbox page asks for the answer; the page knows these controls, not the kinds,
    so a new kind that uses them needs no page change."""

    control: Literal["input", "keys", "decisions"] = Field(
        description="`input`: a typed answer (`type`, `attrs`); `keys`: one button per answer; "
        "`decisions`: one button per decision on every gated call (`calls`)."
    )
    type: str | None = Field(default=None, description="`input`: the HTML input type.")
    attrs: dict[str, Any] = Field(
        default_factory=dict, description="`input`: its attributes (the browser's own hints)."
    )
    keys: list[FormKey] = Field(default_factory=list, description="`keys`, `decisions`.")


def shown(req: InteractionRequest, text: str) -> str:
    """How a refusal may quote an answer: never when the question is sensitive."""
    return "the answer" if req.is_secret else repr(text.strip()[:40])


class Kind:
    """Text: the base every other kind refines."""

    expects = "text"
    asked_by_model = True  # offered to the model through ask_human
    fields: tuple[str, ...] = ()  # the request fields it adds (in the HTTP question document)
    per_call = False  # answered with a decision per gated tool call (response.json decisions)
    input = "text"  # the page's <input type> for a typed answer
    secret = False  # the answer is a secret whatever the question's `sensitive` says
    one_line = False  # a written reply's first line is the answer (else all of it: free text)

    def read(self, req: InteractionRequest, text: str) -> Reply:
        if not text.strip() and not req.allow_empty:
            # `touch response.txt`, an editor's first save, `: > response.txt`: not an answer.
            raise AnswerRejected(
                "the answer is empty (this question does not accept an empty answer)"
            )
        return Reply(value=text)

    def timeout(self, req: InteractionRequest) -> Reply:
        """Whoever notices first applies the same rule: the default if there is one,
        otherwise an explicit TIMEOUT."""
        if req.default is not None:
            reply = self.read(req, req.default)
            reply.outcome, reply.source = "timeout", "default"
            return reply
        return Reply(outcome="timeout", source="timeout")

    def auto(self, req: InteractionRequest) -> Reply:
        return self.read(req, req.default) if req.default is not None else self.stand_in(req)

    def stand_in(self, req: InteractionRequest) -> Reply:
        return Reply(value="auto-approved")

    def after_deadline(self, req: InteractionRequest) -> str:
        """What a timeout answers, in words (the guidance's `Deadline:` line)."""
        return f"the default, {req.default!r}" if req.default is not None else "TIMEOUT"

    def example(self, req: InteractionRequest) -> str | None:
        """An answer to show on a command line (None: never on one)."""
        return "your answer"

    def hints(self, req: InteractionRequest) -> list[str]:
        """Lines a terminal shows before its prompt."""
        return []

    def bounds(self, req: InteractionRequest) -> str | None:
        """What an answer must lie within, in words (the page's card shows it); None: no bound."""
        return None

    def schema(self) -> dict[str, Any]:
        """The ask_human arguments this kind adds (JSON schema properties)."""
        return {}

    def from_args(self, args: dict[str, Any]) -> dict[str, Any] | str:
        """Request fields from ask_human's arguments, or what is wrong (told to the model)."""
        return {}

    def form(self, req: InteractionRequest) -> Form:
        """How the inbox page asks for the answer; for a typed one, the input's type (hidden
        for a secret) and its attributes (the browser's own hints; `read` checks again)."""
        kind = "password" if req.is_secret else self.input
        return Form(control="input", type=kind, attrs=self.attrs(req))

    def answer_fields(self) -> dict[str, Any]:
        """The API answer body's fields this kind is answered with: name → (type, Field)."""
        return {"answer": (str | None, Field(default=None, description="The answer, as text."))}

    def body_examples(self) -> dict[str, dict[str, Any]]:
        """API answer bodies other than `{"answer": example}` (OpenAPI `examples`)."""
        return {}

    def attrs(self, req: InteractionRequest) -> dict[str, Any]:
        return {}


class Password(Kind):
    expects = "a password (typing hidden)"
    input = "password"
    secret = True

    def example(self, req: InteractionRequest) -> str | None:
        return None


class YesNo(Kind):
    one_line = True  # a reply's first line (mail): the rest is a reason or noise
    expects = "yes or no"

    def read(self, req: InteractionRequest, text: str) -> Reply:
        word = text.strip().lower()
        if word in {"y", "yes"}:
            return Reply(value="yes")
        if word in {"n", "no"}:
            return Reply(value="no")
        raise AnswerRejected(f"{shown(req, text)} must be yes or no")

    def stand_in(self, req: InteractionRequest) -> Reply:
        return Reply(value="yes")

    def example(self, req: InteractionRequest) -> str | None:
        return "yes"

    def hints(self, req: InteractionRequest) -> list[str]:
        return ["Please answer yes or no."]

    def form(self, req: InteractionRequest) -> Form:
        yes = FormKey(key="y", label="Yes", answer="yes", style="primary")
        return Form(control="keys", keys=[yes, FormKey(key="n", label="No", answer="no")])


class Choice(Kind):
    one_line = True  # a reply's first line (mail): the rest is a reason or noise
    expects = "one of the options, by key or label"
    fields = ("options",)

    def read(self, req: InteractionRequest, text: str) -> Reply:
        wanted = text.strip().lower()
        for opt in req.options:
            full = f"[{opt.key}] {opt.label}".lower()
            if wanted in (opt.key.lower(), opt.label.lower(), full):
                return Reply(value=opt.label, key=opt.key)
        listed = ", ".join(f"{o.key}) {o.label}" for o in req.options)
        raise AnswerRejected(f"{shown(req, text)} is not one of the options: {listed}")

    def stand_in(self, req: InteractionRequest) -> Reply:
        first = req.options[0]
        return Reply(value=first.label, key=first.key)

    def example(self, req: InteractionRequest) -> str | None:
        return req.options[0].key if req.options else None

    def hints(self, req: InteractionRequest) -> list[str]:
        return [f"  [{o.key}] {o.label}" for o in req.options]

    def form(self, req: InteractionRequest) -> Form:
        keys = [FormKey(key=o.key, label=o.label, answer=o.key) for o in req.options]
        return Form(control="keys", keys=keys)

    def schema(self) -> dict[str, Any]:
        return {
            "options": {
                "type": "array",
                "items": {"type": "string"},
                "description": "For choice: labels such as '[A] Approve' or 'R) Reject'.",
            }
        }

    def from_args(self, args: dict[str, Any]) -> dict[str, Any] | str:
        options = args.get("options")
        if (
            not isinstance(options, list)
            or len(options) < 2
            or not all(isinstance(o, str) and o.strip() for o in options)
        ):
            return "Error: a choice needs 'options': a list of at least two labels"
        return {"options": build_options(options)}


class Approval(Kind):
    one_line = True  # a reply's first line (mail): the rest is a reason or noise
    """Gated tool calls: a decision per call. Never asked by the model itself."""

    expects = "a decision for each tool call"
    asked_by_model = False
    per_call = True

    def read(self, req: InteractionRequest, text: str) -> Reply:
        """Plain text: one word for every call; `reject: reason` carries a reason."""
        word, _, reason = text.strip().partition(":")
        word = word.strip().lower()
        if word in {"y", "yes", "approve", "approved"}:
            decision = Decision.APPROVE
        elif word in {"n", "no", "reject", "rejected"}:
            decision = Decision.REJECT
        elif word == "cancel":
            decision = Decision.CANCEL
        else:
            raise AnswerRejected(
                f"{shown(req, text)} is not approve, reject[: reason] or cancel "
                "(use response.json for per-call decisions or edits)"
            )
        return self.everyone(req, decision, reason.strip() or None)

    @staticmethod
    def everyone(req: InteractionRequest, decision: Decision, reason: str | None) -> Reply:
        return Reply(
            decisions=[
                CallDecision(action_id=c.action_id, decision=decision, reason=reason)
                for c in req.calls
            ]
        )

    def timeout(self, req: InteractionRequest) -> Reply:
        reply = self.everyone(
            req, Decision.REJECT, f"no decision within {req.timeout_seconds or 0:g} s"
        )
        reply.outcome, reply.source = "timeout", "timeout"
        return reply

    def auto(self, req: InteractionRequest) -> Reply:
        return self.everyone(req, Decision.APPROVE, None)

    def after_deadline(self, req: InteractionRequest) -> str:
        return "rejected"

    def example(self, req: InteractionRequest) -> str | None:
        return "approve"

    def form(self, req: InteractionRequest) -> Form:
        keys = [
            FormKey(key="a", label="Approve", decision=Decision.APPROVE, style="primary"),
            FormKey(key="r", label="Reject", decision=Decision.REJECT, style="danger", reason=True),
            FormKey(key="e", label="Edit", decision=Decision.EDIT, style="edit"),
            FormKey(key="c", label="Cancel run", decision=Decision.CANCEL),
        ]
        return Form(control="decisions", keys=keys)

    def answer_fields(self) -> dict[str, Any]:
        decisions = Field(
            default=None,
            description="A decision per gated call (`edit` with its `arguments`, `reject` "
            "with a `reason`).",
        )
        return super().answer_fields() | {"decisions": (list[CallDecision] | None, decisions)}

    def body_examples(self) -> dict[str, dict[str, Any]]:
        edit = {"action_id": "call_1", "decision": "edit", "arguments": {"path": "x"}}
        reject = {"action_id": "call_2", "decision": "reject", "reason": "not now"}
        body = {"decisions": [edit, reject], "comment": "the first one, edited"}
        return {"approval per call": {"summary": "an approval, call by call", "value": body}}


class Number(Kind):
    one_line = True  # a reply's first line (mail): the rest is a reason or noise
    """A number, optionally within `minimum`..`maximum`."""

    expects = "a number"
    fields = ("minimum", "maximum")
    input = "number"

    def read(self, req: InteractionRequest, text: str) -> Reply:
        try:
            value = float(text.strip())
        except ValueError:
            raise AnswerRejected(f"{shown(req, text)} is not a number") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise AnswerRejected(f"{shown(req, text)} is not a finite number")
        if req.minimum is not None and value < req.minimum:
            raise AnswerRejected(f"{shown(req, text)} is below the minimum, {req.minimum:g}")
        if req.maximum is not None and value > req.maximum:
            raise AnswerRejected(f"{shown(req, text)} is above the maximum, {req.maximum:g}")
        return Reply(value=f"{value:g}")

    def stand_in(self, req: InteractionRequest) -> Reply:
        return self.read(req, self.example(req) or "0")

    def example(self, req: InteractionRequest) -> str | None:
        return f"{req.minimum:g}" if req.minimum is not None else "42"

    def hints(self, req: InteractionRequest) -> list[str]:
        return [f"Please answer with {self.bounds(req) or 'a number'}."]

    def bounds(self, req: InteractionRequest) -> str | None:
        if req.minimum is None and req.maximum is None:
            return None
        low = "" if req.minimum is None else f" from {req.minimum:g}"
        high = "" if req.maximum is None else f" to {req.maximum:g}"
        return f"a number{low}{high}"

    def schema(self) -> dict[str, Any]:
        return {
            "minimum": {"type": "number", "description": "For number: the smallest answer."},
            "maximum": {"type": "number", "description": "For number: the largest answer."},
        }

    def from_args(self, args: dict[str, Any]) -> dict[str, Any] | str:
        low, high = args.get("minimum"), args.get("maximum")
        for v in (low, high):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)):
                return "Error: minimum and maximum must be numbers"
        if low is not None and high is not None and low > high:
            return "Error: minimum is larger than maximum"
        return {"minimum": low, "maximum": high}

    def attrs(self, req: InteractionRequest) -> dict[str, Any]:
        return {"step": "any", "min": req.minimum, "max": req.maximum}


ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def iso_date(text: object) -> date | None:
    """A calendar date written YYYY-MM-DD, or None."""
    if not isinstance(text, str) or not ISO_DATE.fullmatch(text.strip()):
        return None
    try:
        return date.fromisoformat(text.strip())
    except ValueError:
        return None


class Date(Kind):
    one_line = True  # a reply's first line (mail): the rest is a reason or noise
    """A calendar date (ISO, YYYY-MM-DD), optionally within `earliest`..`latest`."""

    expects = "a date, YYYY-MM-DD"
    fields = ("earliest", "latest")
    input = "date"

    def read(self, req: InteractionRequest, text: str) -> Reply:
        day = iso_date(text)
        if day is None:
            raise AnswerRejected(f"{shown(req, text)} is not a date written YYYY-MM-DD")
        if req.earliest is not None and day < req.earliest:
            raise AnswerRejected(f"{shown(req, text)} is before the earliest, {req.earliest}")
        if req.latest is not None and day > req.latest:
            raise AnswerRejected(f"{shown(req, text)} is after the latest, {req.latest}")
        return Reply(value=day.isoformat())

    def stand_in(self, req: InteractionRequest) -> Reply:
        return self.read(req, self.example(req))

    def example(self, req: InteractionRequest) -> str:
        return str(req.earliest or req.latest or "2030-01-31")

    def hints(self, req: InteractionRequest) -> list[str]:
        return [f"Please answer with {self._window(req)}."]

    def bounds(self, req: InteractionRequest) -> str | None:
        return None if req.earliest is None and req.latest is None else self._window(req)

    def _window(self, req: InteractionRequest) -> str:
        low = "" if req.earliest is None else f" from {req.earliest}"
        high = "" if req.latest is None else f" to {req.latest}"
        return f"a date, YYYY-MM-DD{low}{high}"

    def schema(self) -> dict[str, Any]:
        return {
            name: {"type": "string", "format": "date", "description": f"For date: the {name}."}
            for name in ("earliest", "latest")
        }

    def from_args(self, args: dict[str, Any]) -> dict[str, Any] | str:
        low, high = iso_date(args.get("earliest")), iso_date(args.get("latest"))
        for name, day in (("earliest", low), ("latest", high)):
            if args.get(name) is not None and day is None:
                return f"Error: {name} must be a date written YYYY-MM-DD"
        if low is not None and high is not None and low > high:
            return "Error: earliest is after latest"
        return {"earliest": low, "latest": high}

    def attrs(self, req: InteractionRequest) -> dict[str, Any]:
        bounds = req.model_dump(mode="json", include={"earliest", "latest"})
        return {"min": bounds["earliest"], "max": bounds["latest"]}


TEXT, PASSWORD, YES_NO, CHOICE, APPROVAL = Kind(), Password(), YesNo(), Choice(), Approval()
NUMBER, DATE = Number(), Date()


def _entry(t: InputType) -> Kind:
    match t:
        case InputType.TEXT:
            return TEXT
        case InputType.PASSWORD:
            return PASSWORD
        case InputType.CONFIRMATION | InputType.YES_NO:
            return YES_NO
        case InputType.CHOICE:
            return CHOICE
        case InputType.APPROVAL:
            return APPROVAL
        case InputType.NUMBER:
            return NUMBER
        case InputType.DATE:
            return DATE
        case _:
            assert_never(t)


# Every type's entry, made once (a test may put a kind of its own in a type's place).
KINDS: dict[InputType, Kind] = {t: _entry(t) for t in InputType}


def kind_of(t: InputType) -> Kind:
    return KINDS[t]


def asked_type(args: dict[str, Any]) -> str:
    """The input type of an ask_human call that names none: a choice if it gives options."""
    return str(InputType.CHOICE if args.get("options") else InputType.TEXT)


def read_text(req: InteractionRequest, text: str) -> Reply:
    return kind_of(req.input_type).read(req, text)


def on_timeout(req: InteractionRequest) -> Reply:
    return kind_of(req.input_type).timeout(req)


def auto_reply(req: InteractionRequest) -> Reply:
    """`--auto-approve`: never invents a secret (SKIPPED), else the kind's stand-in."""
    reply = Reply(outcome="skipped") if req.is_secret else kind_of(req.input_type).auto(req)
    reply.source, reply.answered_by = "auto", "auto-approve"
    return reply


def model_kinds() -> list[InputType]:
    return [t for t in InputType if kind_of(t).asked_by_model]


def model_description() -> str:
    """The `input_type` argument's description for the model: every kind it may ask."""
    return "; ".join(f"{t.value}: {kind_of(t).expects}" for t in model_kinds()) + " (default text)"


def question_fields(req: InteractionRequest) -> dict[str, Any]:
    """Every kind's own request fields, as JSON (null where they do not apply)."""
    return req.model_dump(mode="json", include=set(request_fields()))


def form(req: InteractionRequest) -> Form:
    return kind_of(req.input_type).form(req)


def kinds_with(name: str) -> list[InputType]:
    """The input types whose kind adds request field `name`."""
    return [t for t in InputType if name in kind_of(t).fields]


def request_fields() -> list[str]:
    """Every kind's own request fields, in the vocabulary's order (the API's question)."""
    return list(dict.fromkeys(f for t in InputType for f in kind_of(t).fields))


def model_arguments() -> dict[str, Any]:
    """The ask_human arguments the kinds add; two kinds naming one argument must mean the
    same by it (a clash would silently give one kind's schema to the other)."""
    merged: dict[str, Any] = {}
    for t in model_kinds():
        for name, schema in kind_of(t).schema().items():
            if merged.setdefault(name, schema) != schema:
                raise ValueError(f"ask_human argument {name!r} is defined twice ({t})")
    return merged


def answer_fields() -> dict[str, Any]:
    """The API answer body's fields, from every kind (name → (type, Field))."""
    fields: dict[str, Any] = {}
    for t in InputType:
        fields |= kind_of(t).answer_fields()
    return fields
