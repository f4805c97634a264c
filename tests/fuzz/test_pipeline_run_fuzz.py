"""Property-based runs of the review-gate example with any scripted answers: every answer
either fits a choice (and the run follows that choice's edge) or stops the run with a one-line
error before the gate decides anything. Never a fallback to the first choice."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from deltad.engine.interviewers import QueueInterviewer
from deltad.errors import UsageError
from deltad.protocol import RunStatus
from deltad.testing import ScriptedModel
from tests.fuzz import fuzz_settings
from tests.unit.helpers import Run, example

RUNS = fuzz_settings(30)
FITTING = {"a": "apply", "approve": "apply", "[a] approve": "apply", "r": "revise"}
FITTING |= {"revise": "revise", "[r] revise": "revise"}
answers = st.sampled_from(sorted(FITTING)).map(str.upper) | st.text(max_size=12)


@RUNS
@given(answer=answers)
def test_any_first_answer_routes_to_its_choice_or_is_refused(answer: str) -> None:
    model = ScriptedModel().reply("plan").reply("next").reply("applied")
    with tempfile.TemporaryDirectory() as tmp:
        run = Run(Path(tmp), example("review-gate.dot"), model)
        target = FITTING.get(answer.strip().lower())
        try:
            out = run.drive(QueueInterviewer([answer, "A"]))
        except UsageError as e:
            assert target is None and "\n" not in str(e)
            assert [p["node"] for p in run.events("NODE_OUTCOME")] == ["start", "do_work"]
            return
        assert target is not None, f"{answer!r} was taken as a choice"
        assert out.status == RunStatus.COMPLETED
        assert run.path()[3] == target
