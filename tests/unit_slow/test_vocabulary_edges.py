"""A new input type is one entry in the vocabulary (protocol/kinds.py) plus its enum member and
request fields (protocol/models.py): the edges — the API's document, ask_human's schema, the
page's answer form — are generated from the entries, and the page knows controls, not kinds.

Proved two ways: a kind of the test's own, put in a type's place in a fresh interpreter, shows
up at every edge with nothing else touched; and the product files that name the `date` kind
are counted."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from deltad.protocol import InputType, InteractionRequest
from deltad.protocol.kinds import form, kind_of, model_arguments

PRODUCT = Path(__file__).resolve().parents[2] / "deltad"

# A kind the product has never seen, registered in-process in a type's place (`confirmation`):
# its words, an ask_human argument, an API answer field and a form of buttons of its own.
RATING = """
import json, sys
from typing import Any
from pydantic import Field
from deltad.protocol import kinds
from deltad.protocol.models import InputType, InteractionRequest

class Rating(kinds.Kind):
    expects = "a rating, 1 to 5 stars"
    fields = ("timeout_seconds",)

    def schema(self) -> dict[str, Any]:
        return {"stars": {"type": "integer", "description": "For rating: the most stars."}}

    def answer_fields(self) -> dict[str, Any]:
        return {"stars": (int | None, Field(default=None, description="How many stars."))}

    def form(self, req: InteractionRequest) -> kinds.Form:
        keys = [kinds.FormKey(key=str(n), label="*" * n, answer=str(n)) for n in range(1, 6)]
        return kinds.Form(control="keys", keys=keys)

kinds.KINDS[InputType.CONFIRMATION] = Rating()

from deltad import inbox
from deltad.inbox import schemas
from deltad.engine.ask_human import ASK_HUMAN_TOOL

req = InteractionRequest(prompt="?", input_type="confirmation", run_id="r", action_id="a")
json.dump({
    "question": schemas.Question.model_json_schema(),
    "answer": schemas.AnswerBody.model_json_schema(),
    "ask_human": ASK_HUMAN_TOOL["function"]["parameters"]["properties"],
    "form": kinds.form(req).model_dump(mode="json"),
    "read": inbox.AnswerIn.parse({"stars": 4}).model_dump(exclude_none=True),
}, sys.stdout)
"""


def test_a_kind_of_its_own_shows_up_at_every_edge() -> None:
    out = subprocess.run(
        [sys.executable, "-c", RATING], capture_output=True, text=True, timeout=120, check=True
    )
    edges = json.loads(out.stdout)
    question = edges["question"]["properties"]
    assert question["timeout_seconds"]["description"] == "For `confirmation`."
    assert "a rating, 1 to 5 stars" in question["expects"]["examples"]
    assert edges["answer"]["properties"]["stars"]["description"] == "How many stars."
    args = edges["ask_human"]
    assert args["stars"]["type"] == "integer"
    assert "confirmation: a rating, 1 to 5 stars" in args["input_type"]["description"]
    assert edges["form"]["control"] == "keys"
    assert [k["key"] for k in edges["form"]["keys"]] == ["1", "2", "3", "4", "5"]
    assert edges["read"] == {
        "stars": 4
    }  # the inbox reads the kind's own field (delta respond, HTTP)


def _names_the_date_kind(path: Path) -> bool:
    text = path.read_text(encoding="utf-8")
    # the type, its entry, its request fields (as code, not the English word)
    return bool(
        re.search(r"\bDATE\b|\bclass Date\b|\.earliest\b|\bearliest:|[\"']earliest[\"']", text)
    )


def test_the_date_kind_is_named_in_at_most_three_product_files() -> None:
    files = sorted(
        str(p.relative_to(PRODUCT))
        for p in PRODUCT.rglob("*")
        if p.suffix in (".py", ".js", ".html") and _names_the_date_kind(p)
    )
    assert files == ["protocol/kinds.py", "protocol/models.py"]


def test_the_page_names_no_input_type() -> None:
    """It builds the answer from the question's `form`; the filter lists the API's types."""
    page = "".join(
        (PRODUCT / "http" / "static" / f).read_text() for f in ("inbox.js", "index.html")
    )
    named = [t.value for t in InputType if re.search(rf"""["']{t.value}["']|>{t.value}<""", page)]
    # text, password, number and date are HTML input types too: only as a form's `type`.
    assert set(named) <= {"text", "password", "number", "date"}
    assert "input_type ===" not in page and "r.input_type)" not in page


CONTROLS = {"input", "keys", "decisions"}  # what the page builds (inbox.js answerControls)


@pytest.mark.parametrize("t", list(InputType))
def test_every_kind_asks_with_a_control_the_page_knows(t: InputType) -> None:
    extra: dict[str, Any] = {"options": [{"key": "A", "label": "Apple"}]}
    req = InteractionRequest(prompt="?", input_type=t, run_id="r", action_id="a", **extra)
    f = form(req)
    assert f.control in CONTROLS
    if f.control == "input":
        assert f.type and not f.keys
    else:
        keys = [k.key.lower() for k in f.keys]
        assert keys and len(set(keys)) == len(keys)  # accelerators are unique
        assert all((k.answer is None) == (f.control == "decisions") for k in f.keys)


def test_a_secret_s_field_is_hidden_whatever_its_kind() -> None:
    req = InteractionRequest(prompt="?", run_id="r", action_id="a", sensitive=True)
    assert form(req).type == "password"
    assert form(req.model_copy(update={"input_type": InputType.PASSWORD})).type == "password"
    assert kind_of(InputType.PASSWORD).secret and not kind_of(InputType.TEXT).secret


def test_two_kinds_cannot_give_one_ask_human_argument_two_meanings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from deltad.protocol import kinds

    class Clash(kinds.Kind):
        def schema(self) -> dict[str, Any]:
            return {"minimum": {"type": "string"}}  # number's, meant otherwise

    monkeypatch.setitem(kinds.KINDS, InputType.CONFIRMATION, Clash())
    with pytest.raises(ValueError, match="'minimum' is defined twice"):
        model_arguments()


BRANCH = re.compile(
    r"(==|!=)\s*InputType\.|InputType\.\w+\s*(==|!=)|case InputType\.|\bin \(?InputType\."
    r"|input_type\s*(==|!=)\s*[\"']|[\"']\s*(==|!=)\s*\w*\.?input_type"
)


def test_no_product_file_but_the_vocabulary_branches_on_an_input_type() -> None:
    """What differs between kinds is the kind's to say: `kind_of(t).per_call`, `.secret`, ..."""
    branching = sorted(
        str(p.relative_to(PRODUCT))
        for p in PRODUCT.rglob("*.py")
        if BRANCH.search(p.read_text(encoding="utf-8"))
    )
    assert branching == ["protocol/kinds.py"]
