"""A model's reply as a node outcome (attractor §4.5, §5.2, Appendix C), from a table."""

from __future__ import annotations

import pytest

from deltad.pipeline.outcome import Outcome, Status, parse_reply

FENCED = 'Tests ran.\n\n```json\n{"outcome": "fail", "failure_reason": "3 tests fail"}\n```\n'


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("All done.", Outcome(Status.SUCCESS)),
        ("", Outcome(Status.SUCCESS)),
        ('{"outcome": "fail"}', Outcome(Status.FAIL)),
        ('{"status": "RETRY"}', Outcome(Status.RETRY)),  # §5.2's name, any case
        ('{"outcome": "partial_success"}', Outcome(Status.PARTIAL_SUCCESS)),
        ('{"outcome": "partial"}', Outcome(Status.PARTIAL_SUCCESS)),
        (FENCED, Outcome(Status.FAIL, failure_reason="3 tests fail")),
        (
            '```\n{"outcome": "success", "preferred_label": "Ship",'
            ' "suggested_next_ids": ["deploy", 7], "notes": "ok",'
            ' "context_updates": {"tests": "passed", "n": 3}}\n```',
            Outcome(
                Status.SUCCESS,
                preferred_label="Ship",
                suggested_next_ids=("deploy",),
                context_updates={"tests": "passed", "n": 3},
                notes="ok",
            ),
        ),
        # The last fenced status block counts; a JSON example earlier does not.
        (
            '```json\n{"outcome": "fail"}\n```\nthen\n```json\n{"outcome": "success"}\n```',
            Outcome(Status.SUCCESS),
        ),
        ('{"answer": 42}', Outcome(Status.SUCCESS)),  # JSON, but no outcome: prose
        ('```json\n{"outcome": "fail",\n```', Outcome(Status.SUCCESS)),  # not JSON: prose
        ('I would write {"outcome": "fail"} here', Outcome(Status.SUCCESS)),  # inline: prose
        ('{"outcome": "success", "context_updates": "x"}', Outcome(Status.SUCCESS)),
    ],
)
def test_parse_reply(reply: str, expected: Outcome) -> None:
    assert parse_reply(reply) == expected


def test_an_outcome_that_is_no_status_fails_and_says_so() -> None:
    got = parse_reply('{"outcome": "maybe"}')
    assert got.status == Status.FAIL
    assert "'maybe': not one of success, partial_success" in got.failure_reason
