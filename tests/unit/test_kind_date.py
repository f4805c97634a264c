"""The `date` input type, added as one entry in the vocabulary (kinds.py) and its two request
fields (models.py); the edges — ask_human's schema and description, the API's question
document, the page's answer field — follow from the entry."""

from __future__ import annotations

import re
from datetime import date
from typing import Any

import pytest

from deltad.engine.ask_human import ASK_HUMAN_TOOL, question_from_args
from deltad.protocol import InputType, InteractionRequest
from deltad.protocol.kinds import (
    auto_reply,
    form,
    kind_of,
    model_description,
    model_kinds,
    question_fields,
    read_text,
)
from deltad.protocol.replies import AnswerRejected


def _req(**kw: Any) -> InteractionRequest:
    return InteractionRequest(
        prompt="When?", input_type=InputType.DATE, run_id="r", action_id="a", **kw
    )


def _ask(args: str) -> InteractionRequest | str:
    return question_from_args(args, "r", "a")


def test_the_model_is_offered_every_kind_it_may_ask_with_its_arguments() -> None:
    params = ASK_HUMAN_TOOL["function"]["parameters"]["properties"]
    assert params["input_type"]["enum"] == [t.value for t in model_kinds()]
    for t in model_kinds():  # the description names each (it used to miss number)
        assert re.search(rf"\b{t.value}:", params["input_type"]["description"]), t
    assert params["input_type"]["description"] == model_description()
    assert "date" in params["input_type"]["enum"] and params["earliest"]["format"] == "date"
    assert "minimum" in params and "latest" in params


def test_the_model_asks_for_a_date_within_bounds() -> None:
    req = _ask('{"prompt": "When?", "input_type": "date", "earliest": "2030-01-01"}')
    assert isinstance(req, InteractionRequest)
    assert (req.earliest, req.latest) == (date(2030, 1, 1), None)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ('"earliest": "01/02/2030"', "earliest must be a date written YYYY-MM-DD"),
        ('"latest": "2030-02-30"', "latest must be a date written YYYY-MM-DD"),
        ('"earliest": "2030-02-02", "latest": "2030-02-01"', "earliest is after latest"),
    ],
)
def test_bad_bounds_are_told_to_the_model(args: str, says: str) -> None:
    said = _ask('{"prompt": "When?", "input_type": "date", ' + args + "}")
    assert isinstance(said, str) and says in said


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("tomorrow", "is not a date written YYYY-MM-DD"),
        ("2030-13-01", "is not a date written YYYY-MM-DD"),
        ("20300101", "is not a date written YYYY-MM-DD"),
        ("2029-12-31", "is before the earliest, 2030-01-01"),
        ("2030-02-01", "is after the latest, 2030-01-31"),
    ],
)
def test_answers_that_are_not_dates_in_range_are_refused(text: str, says: str) -> None:
    req = _req(earliest=date(2030, 1, 1), latest=date(2030, 1, 31))
    with pytest.raises(AnswerRejected, match=says):
        read_text(req, text)


def test_reading_auto_hints() -> None:
    req = _req(earliest=date(2030, 1, 1), latest=date(2030, 1, 31))
    assert read_text(req, " 2030-01-15 ").value == "2030-01-15"
    assert auto_reply(req).value == "2030-01-01"
    assert auto_reply(_req()).value == "2030-01-31"
    assert kind_of(InputType.DATE).hints(req) == [
        "Please answer with a date, YYYY-MM-DD from 2030-01-01 to 2030-01-31."
    ]


def test_the_api_document_and_the_page_field_come_from_the_kind() -> None:
    req = _req(earliest=date(2030, 1, 1))
    fields = question_fields(req)
    assert fields["earliest"] == "2030-01-01" and fields["latest"] is None
    assert {"options", "minimum", "maximum"} <= set(fields)  # the other kinds' fields too
    assert (form(req).control, form(req).type) == ("input", "date")
    assert form(req).attrs == {"min": "2030-01-01", "max": None}
    number = req.model_copy(update={"input_type": InputType.NUMBER, "minimum": 2.0})
    assert form(number).attrs == {"step": "any", "min": 2.0, "max": None}
    assert form(req.model_copy(update={"input_type": InputType.TEXT})).type == "text"
