"""The vocabulary of input types: every type has an entry, and each entry answers the same
questions (read, timeout, auto-approve, display) consistently."""

from __future__ import annotations

from datetime import timedelta

import pytest

from deltad.protocol import InputType, InteractionRequest, utcnow
from deltad.protocol.accelerators import build_options
from deltad.protocol.kinds import auto_reply, kind_of, model_kinds, on_timeout, read_text
from deltad.protocol.models import GatedCall
from deltad.protocol.replies import AnswerRejected, Decision


def _req(t: InputType, **kw: object) -> InteractionRequest:
    extra: dict[str, object] = {}
    if t == InputType.CHOICE:
        extra["options"] = build_options(["[S] stable", "[B] beta"])
    if t == InputType.APPROVAL:
        extra["calls"] = [GatedCall(action_id="c1", tool_name="deploy")]
    return InteractionRequest(prompt="q", input_type=t, run_id="r", action_id="a", **extra, **kw)


@pytest.mark.parametrize("t", list(InputType))
def test_every_type_has_a_complete_entry(t: InputType) -> None:
    kind = kind_of(t)
    req = _req(t)
    assert kind.expects
    assert isinstance(kind.hints(req), list)
    timed_out = on_timeout(req.model_copy(update={"timeout_seconds": 5}))
    assert timed_out.outcome == "timeout"
    auto = auto_reply(req)
    assert auto.source == "auto"
    if (example := kind.example(req)) is not None:
        read_text(req, example)  # what guidance shows is itself a valid answer


def test_the_model_may_ask_every_type_but_approval() -> None:
    assert set(model_kinds()) == set(InputType) - {InputType.APPROVAL}


@pytest.mark.parametrize(
    ("t", "text", "value"),
    [
        (InputType.YES_NO, " Y ", "yes"),
        (InputType.CONFIRMATION, "no", "no"),
        (InputType.CHOICE, "b", "beta"),
        (InputType.CHOICE, "[S] stable", "stable"),
        (InputType.TEXT, "Ada", "Ada"),
    ],
)
def test_reading(t: InputType, text: str, value: str) -> None:
    assert read_text(_req(t), text).value == value


@pytest.mark.parametrize(
    ("t", "text"),
    [
        (InputType.YES_NO, "maybe"),
        (InputType.CHOICE, "x"),
        (InputType.TEXT, "  "),
        (InputType.APPROVAL, "perhaps"),
    ],
)
def test_misfits_are_refused(t: InputType, text: str) -> None:
    with pytest.raises(AnswerRejected):
        read_text(_req(t), text)


def test_empty_text_counts_only_when_allowed() -> None:
    assert read_text(_req(InputType.TEXT, allow_empty=True), "").value == ""


def test_timeouts_use_the_default_or_say_timeout_never_consent() -> None:
    assert on_timeout(_req(InputType.CHOICE, default="B")).value == "beta"
    assert on_timeout(_req(InputType.TEXT)).value is None
    approval = on_timeout(_req(InputType.APPROVAL, timeout_seconds=9))
    assert [d.decision for d in approval.decisions] == [Decision.REJECT]


def test_auto_approve_takes_the_default_and_never_invents_a_secret() -> None:
    assert auto_reply(_req(InputType.CHOICE, default="B")).value == "beta"
    assert auto_reply(_req(InputType.CHOICE)).value == "stable"
    assert auto_reply(_req(InputType.PASSWORD)).outcome == "skipped"
    assert auto_reply(_req(InputType.TEXT, sensitive=True)).outcome == "skipped"
    assert [d.decision for d in auto_reply(_req(InputType.APPROVAL)).decisions] == [
        Decision.APPROVE
    ]


def test_a_secret_is_never_quoted_in_a_refusal() -> None:
    req = _req(InputType.CHOICE, sensitive=True)
    with pytest.raises(AnswerRejected) as e:
        read_text(req, "hunter2")
    assert "hunter2" not in str(e.value)


def test_expiry_compares_aware_times() -> None:
    req = _req(InputType.TEXT, expires_at=utcnow() - timedelta(seconds=1))
    assert req.expired()


def test_the_secret_kinds_are_the_ones_a_question_knows_without_the_vocabulary() -> None:
    from deltad.protocol.kinds import KINDS
    from deltad.protocol.models import SECRET_INPUTS

    assert {t for t, kind in KINDS.items() if kind.secret} == SECRET_INPUTS
