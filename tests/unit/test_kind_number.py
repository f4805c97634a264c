"""The `number` input type: added as one entry in the vocabulary (kinds.py) and its request
fields (models.py); everything else — ask_human's schema, reading answers, timeouts,
--auto-approve, guidance, the terminal prompt, `delta respond` — follows from the entry."""

from __future__ import annotations

import pytest

from deltad.engine.ask_human import ASK_HUMAN_TOOL, question_from_args
from deltad.inbox import guidance
from deltad.protocol import InputType, InteractionRequest, Workspace
from deltad.protocol.kinds import auto_reply, kind_of, on_timeout, read_text
from deltad.protocol.replies import AnswerRejected


def _req(**kw: object) -> InteractionRequest:
    return InteractionRequest(
        prompt="Replicas?", input_type=InputType.NUMBER, run_id="r", action_id="a", **kw
    )


def test_the_model_can_ask_for_a_number_within_bounds() -> None:
    params = ASK_HUMAN_TOOL["function"]["parameters"]["properties"]
    assert "number" in params["input_type"]["enum"] and "minimum" in params
    req = question_from_args(
        '{"prompt": "Replicas?", "input_type": "number", "minimum": 1, "maximum": 9}', "r", "a"
    )
    assert isinstance(req, InteractionRequest) and (req.minimum, req.maximum) == (1, 9)
    bad = question_from_args('{"prompt": "p", "input_type": "number", "minimum": "x"}', "r", "a")
    assert isinstance(bad, str) and "must be numbers" in bad


@pytest.mark.parametrize("text", ["abc", "0", "10", "nan"])
def test_answers_outside_the_bounds_are_refused(text: str) -> None:
    with pytest.raises(AnswerRejected):
        read_text(_req(minimum=1, maximum=9), text)


def test_reading_timeouts_auto_and_display() -> None:
    req = _req(minimum=2, maximum=9, default="3")
    assert read_text(req, " 4 ").value == "4"
    assert on_timeout(req.model_copy(update={"timeout_seconds": 5})).value == "3"
    assert auto_reply(_req(minimum=2)).value == "2"
    assert kind_of(InputType.NUMBER).hints(req) == ["Please answer with a number from 2 to 9."]
    shown = guidance(Workspace.at("/tmp/ws"), "r", req)
    assert "Expects:  a number" in shown and "delta respond --work-dir /tmp/ws 2" in shown
