"""Edge selection (attractor spec §3.3): each of the five steps, and their precedence."""

from __future__ import annotations

from typing import Any

import pytest

from deltad.pipeline import Outcome, Status, Step, normalize_label, select_edge

from .helpers import raw_graph

OK = Outcome(Status.SUCCESS)


def route(body: str, outcome: Outcome = OK, **context: Any) -> tuple[str | None, Step]:
    sel = select_edge(raw_graph(body), "n", outcome, context)
    assert sel.reason and "\n" not in sel.reason
    return (sel.edge.target if sel.edge else None), sel.step


def test_step1_a_holding_condition_wins_over_weight() -> None:
    body = (
        'n -> heavy [weight=100]\nn -> ok [condition="outcome=success"]\n'
        'n -> bad [condition="outcome=fail"]'
    )
    assert route(body) == ("ok", Step.CONDITION)
    assert route(body, Outcome(Status.FAIL)) == ("bad", Step.CONDITION)


def test_step1_several_holding_conditions_best_by_weight_then_target() -> None:
    body = (
        'n -> b [condition="outcome=success", weight=1]\n'
        'n -> a [condition="outcome!=fail", weight=1]\n'
        'n -> c [condition="outcome=success"]'
    )
    assert route(body) == ("a", Step.CONDITION)
    body += '\nn -> z [condition="context.go=yes", weight=2]'
    assert route(body, go="yes") == ("z", Step.CONDITION)


def test_step1_beats_preferred_label_and_suggested_ids() -> None:
    body = 'n -> cond [condition="context.x=1"]\nn -> fix [label="Fix"]'
    outcome = Outcome(Status.SUCCESS, preferred_label="Fix", suggested_next_ids=("fix",))
    assert route(body, outcome, x="1") == ("cond", Step.CONDITION)
    assert route(body, outcome) == ("fix", Step.PREFERRED_LABEL)


def test_step1_conditions_see_the_outcome_preferred_label_and_context() -> None:
    body = 'n -> a [condition="preferred_label=Ship && context.env=prod"]\nn -> b'
    assert route(body, Outcome(Status.SUCCESS, preferred_label="Ship"), env="prod") == (
        "a",
        Step.CONDITION,
    )
    assert route(body, Outcome(Status.SUCCESS, preferred_label="Ship"), env="dev")[0] == "b"


@pytest.mark.parametrize(
    "preferred",
    [
        "Yes, deploy",
        "yes, deploy",
        "  YES, DEPLOY ",
        "[Y] Yes, deploy",
        "Y) Yes, deploy",
        "Y - Yes, deploy",
    ],
)
@pytest.mark.parametrize(
    "label", ["[Y] Yes, deploy", "Y) Yes, deploy", "Y - Yes, deploy", "Yes, deploy"]
)
def test_step2_preferred_label_normalised(preferred: str, label: str) -> None:
    body = f'n -> deploy [label="{label}"]\nn -> other [label="No", weight=9]'
    assert route(body, Outcome(Status.SUCCESS, preferred_label=preferred)) == (
        "deploy",
        Step.PREFERRED_LABEL,
    )


def test_step2_beats_suggested_ids_and_weight() -> None:
    body = 'n -> a [label="Fix"]\nn -> b [weight=10]'
    outcome = Outcome(Status.SUCCESS, preferred_label="fix", suggested_next_ids=("b",))
    assert route(body, outcome) == ("a", Step.PREFERRED_LABEL)


def test_step2_skips_conditional_edges_and_takes_the_first_match() -> None:
    body = (
        'n -> c [label="Fix", condition="context.x=1"]\n'
        'n -> first [label="Fix"]\nn -> second [label="fix"]'
    )
    assert route(body, Outcome(Status.SUCCESS, preferred_label="Fix")) == (
        "first",
        Step.PREFERRED_LABEL,
    )


def test_step2_a_label_that_matches_nothing_falls_through() -> None:
    body = 'n -> a [label="Fix"]\nn -> b [weight=1]'
    assert route(body, Outcome(Status.SUCCESS, preferred_label="Ship")) == ("b", Step.WEIGHT)


def test_step3_suggested_ids_in_their_order_beat_weight() -> None:
    body = "n -> a [weight=5]\nn -> b\nn -> c"
    assert route(body, Outcome(Status.SUCCESS, suggested_next_ids=("zz", "c", "b"))) == (
        "c",
        Step.SUGGESTED_ID,
    )


def test_step3_skips_conditional_edges() -> None:
    body = 'n -> a [condition="context.x=1"]\nn -> b'
    assert route(body, Outcome(Status.SUCCESS, suggested_next_ids=("a",))) == ("b", Step.WEIGHT)


def test_step4_highest_weight_among_unconditional_edges() -> None:
    assert route("n -> a [weight=1]\nn -> b [weight=3]\nn -> c [weight=-2]") == ("b", Step.WEIGHT)


def test_step4_a_single_unconditional_edge() -> None:
    assert route('n -> a\nn -> b [condition="outcome=fail"]') == ("a", Step.WEIGHT)


def test_step5_lexical_by_target_when_weights_tie() -> None:
    assert route("n -> beta\nn -> alpha\nn -> gamma") == ("alpha", Step.LEXICAL)
    assert route("n -> b [weight=2]\nn -> a [weight=2]\nn -> c [weight=3]") == ("c", Step.WEIGHT)
    assert route("n -> b [weight=2]\nn -> a [weight=2]\nn -> c [weight=1]") == ("a", Step.LEXICAL)


def test_no_edge_only_when_the_node_has_none() -> None:
    assert route("m -> n") == (None, Step.NONE)


def test_step6_every_edge_conditional_and_none_holds_falls_back_to_any_edge() -> None:
    """Attractor spec 1.0 §3.3 "Fallback: any edge": a graph whose conditions read a key nobody
    sets (`context.tool.last_line`) goes on to its heaviest edge instead of ending there and
    skipping the gates after it."""
    assert route('n -> a [condition="outcome=fail"]') == ("a", Step.FALLBACK)
    body = (
        'n -> fix [condition="context.tool.last_line=fail"]\n'
        'n -> final_review [condition="context.tool.last_line=pass", weight=10]\n'
        'n -> abort [condition="context.tool.last_line=abort", weight=10]'
    )
    assert route(body) == ("abort", Step.FALLBACK)  # weight 10 tied: `abort` first by id
    sel = select_edge(raw_graph(body), "n", OK, {})
    assert sel.reason == (
        "no condition holds and every edge has one: fallback to any edge, abort "
        "(highest weight 10, then id)"
    )
    # a condition that holds still wins over the fallback
    assert route(body, **{"tool.last_line": "fail"}) == ("fix", Step.CONDITION)


def test_the_reason_names_what_decided() -> None:
    sel = select_edge(raw_graph('n -> a [condition="outcome=success"]'), "n", OK, {})
    assert sel.reason == "condition 'outcome=success' holds"
    sel = select_edge(raw_graph("n -> a\nn -> b"), "n", OK, {})
    assert sel.reason == "unconditional: weight 0 tied, a first by id"


def test_normalize_label() -> None:
    assert normalize_label("[Y] Yes, deploy") == "yes, deploy"
    assert normalize_label("  Fix Issues ") == "fix issues"
