"""Human gates: the seed's accelerator-key and wait.human rows that live in the graph, plus
answer matching, the default choice, and no silent fallback to the first choice."""

from __future__ import annotations

from pathlib import Path

import pytest

from deltad.pipeline import Kind, Outcome, Status, gate, load_pipeline, select_edge
from deltad.pipeline.gates import LABEL, NO_EDGES, SELECTED, Gate
from deltad.pipeline.interactive import AUTO_APPROVE_REPLY, ending
from deltad.protocol.models import Option

from .helpers import graph_of, raw_graph

ENDS = "start [shape=Mdiamond]\nexit [shape=Msquare]\n"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "pipelines"


def gate_with(*labels: str, attrs: str = "") -> Gate:
    """A gate `g` with one edge per label, to targets t0, t1, ... (a None label: no label)."""
    lines = [f'g [shape=hexagon, label="Pick one"{", " + attrs if attrs else ""}]']
    for i, label in enumerate(labels):
        lines.append(f"t{i}\ng -> t{i}" + (f' [label="{label}"]' if label is not None else ""))
    return gate(raw_graph("\n".join(lines)), "g")


def keys_labels(g: Gate) -> list[tuple[str, str, str]]:
    return [(c.key, c.label, c.target) for c in g.choices]


# -- the seed's Wait.Human Handler and accelerator rows ---------------------------------------
def test_derive_choices_from_edges() -> None:
    g = gate_with("[A] Approve", "[R] Revise", "Fix issues")
    assert keys_labels(g) == [
        ("A", "Approve", "t0"),
        ("R", "Revise", "t1"),
        ("F", "Fix issues", "t2"),
    ]
    assert g.problems == ()


def test_accelerator_key_bracket_K_Label() -> None:
    assert keys_labels(gate_with("[A] Approve")) == [("A", "Approve", "t0")]


def test_accelerator_key_K_paren_Label() -> None:
    assert keys_labels(gate_with("Y) Yes, deploy")) == [("Y", "Yes, deploy", "t0")]


def test_accelerator_key_K_dash_Label() -> None:
    assert keys_labels(gate_with("Y - Yes, deploy")) == [("Y", "Yes, deploy", "t0")]


def test_accelerator_key_first_char() -> None:
    assert keys_labels(gate_with("Fix issues")) == [("F", "Fix issues", "t0")]


def test_accelerator_keys_are_upper_case_whatever_the_label() -> None:
    assert keys_labels(gate_with("[a] approve", "fix")) == [
        ("A", "approve", "t0"),
        ("F", "fix", "t1"),
    ]


def test_a_missing_label_is_the_target_id() -> None:
    assert keys_labels(gate_with(None, "")) == [("T", "t0", "t0"), ("1", "t1", "t1")]


def test_derived_keys_take_the_first_free_character() -> None:
    assert [c.key for c in gate_with("Fix", "Fail", "Fa", "F").choices] == ["F", "A", "B", "C"]


def test_keys_written_in_labels_are_reserved_before_derived_ones() -> None:
    """`Approve` must not take A from a later `[A] Abort`."""
    assert keys_labels(gate_with("Approve", "[A] Abort")) == [
        ("P", "Approve", "t0"),
        ("A", "Abort", "t1"),
    ]


def test_keys_are_unique_case_insensitively() -> None:
    g = gate_with("[A] Approve", "[a] Abort")
    [problem] = g.problems
    assert "key A is also the key of the edge to t0" in problem.message


def test_route_on_selection() -> None:
    """Human selects Approve: the outcome points at the approve edge's target, and edge
    selection routes there."""
    graph = graph_of(
        f"""{ENDS}work\nreview_gate [shape=hexagon, label="Review"]\napply\nrevise
        start -> work -> review_gate
        review_gate -> apply [label="[A] Approve"]
        review_gate -> revise [label="[R] Revise"]
        apply -> exit
        revise -> review_gate"""
    )
    g = gate(graph, "review_gate")
    for answer, target in (("Approve", "apply"), ("R", "revise")):
        outcome = g.on_answer(answer)
        assert outcome is not None and outcome.status == Status.SUCCESS
        assert outcome.suggested_next_ids == (target,)
        sel = select_edge(graph, "review_gate", outcome, {})
        assert sel.edge is not None and sel.edge.target == target


def test_routing_follows_the_chosen_edge_when_two_edges_share_a_target() -> None:
    graph = raw_graph('g [shape=hexagon]\nx\ng -> x [label="[Q] Quick"]\ng -> x [label="[S] Slow"]')
    g = gate(graph, "g")
    outcome = g.on_answer("S")
    assert outcome is not None
    assert select_edge(graph, "g", outcome, {}).edge is g.choices[1].edge


def test_context_updated() -> None:
    outcome = gate_with("[A] Approve", "[R] Revise").on_answer("r")
    assert outcome is not None
    assert dict(outcome.context_updates) == {SELECTED: "R", LABEL: "Revise"}
    assert outcome.preferred_label == "Revise"


def test_no_outgoing_edges() -> None:
    g = gate_with()
    for outcome in (g.on_answer("A"), g.on_timeout(), g.on_skipped()):
        assert outcome is not None
        assert (outcome.status, outcome.failure_reason) == (Status.FAIL, NO_EDGES)


@pytest.mark.parametrize("default", ["R", "r", "Revise", "[R] Revise", "t1"])
def test_timeout_with_default(default: str) -> None:
    g = gate_with(
        "[A] Approve", "[R] Revise", attrs=f'timeout=5m, human.default_choice="{default}"'
    )
    outcome = g.on_timeout()
    assert (outcome.status, outcome.suggested_next_ids) == (Status.SUCCESS, ("t1",))
    assert outcome.context_updates[SELECTED] == "R"


def test_timeout_without_default() -> None:
    outcome = gate_with("[A] Approve", attrs="timeout=5m").on_timeout()
    assert (outcome.status, outcome.failure_reason) == (
        Status.RETRY,
        "human gate timeout, no default",
    )


def test_skipped_answer_is_fail() -> None:
    outcome = gate_with("[A] Approve").on_skipped()
    assert (outcome.status, outcome.failure_reason) == (Status.FAIL, "human skipped interaction")


# -- answers ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "answer",
    [
        "Y",
        "y",
        " y ",
        "Yes, deploy",
        "yes, DEPLOY",
        "[Y] Yes, deploy",
        "y) yes, deploy",
        "Y - Yes, deploy",
    ],
)
def test_choice_for_a_key_or_a_label_any_case_prefix_optional(answer: str) -> None:
    choice = gate_with("[N] No", "Y) Yes, deploy").choice_for(answer)
    assert choice is not None and choice.target == "t1"


@pytest.mark.parametrize(
    "answer", ["", "  ", "maybe", "Z", "[N] Yes, deploy", "yes", "t1", "1", "Yes, deploy now"]
)
def test_no_silent_fallback_to_the_first_choice(answer: str) -> None:
    """A misfit answer (or a prefix naming another choice's key) is no choice: the caller
    refuses it, as it refuses any misfit answer."""
    g = gate_with("[N] No", "Y) Yes, deploy")
    assert g.choice_for(answer) is None
    assert g.on_answer(answer) is None


def test_a_label_that_looks_like_an_accelerator_still_matches_in_full() -> None:
    g = gate_with("[A] B) later")
    assert keys_labels(g) == [("A", "B) later", "t0")]
    assert g.choice_for("B) later") is g.choices[0]
    assert g.choice_for("[A] B) later") is g.choices[0]


def test_a_default_given_as_a_node_id_reached_by_two_choices_is_ambiguous() -> None:
    graph = raw_graph(
        'g [shape=hexagon, human.default_choice="x"]\nx\n'
        'g -> x [label="[Q] Quick"]\ng -> x [label="[S] Slow"]'
    )
    choice, why = gate(graph, "g").resolve_default()
    assert choice is None and why is not None and "is the target of 2 choices" in why


def test_a_key_wins_over_a_node_id_of_the_same_name_in_a_default() -> None:
    graph = raw_graph(
        'g [shape=hexagon, human.default_choice="A"]\nA\nb\n'
        'g -> A [label="[B] Back"]\ng -> b [label="[A] Ahead"]'
    )
    choice, _ = gate(graph, "g").resolve_default()
    assert choice is not None and choice.target == "b"


def test_options_for_the_mailbox_and_auto_approve_takes_the_first_edge_as_written() -> None:
    g = gate_with("[R] Revise", "[A] Approve")
    assert g.options() == [Option(key="R", label="Revise"), Option(key="A", label="Approve")]
    assert g.question == "Pick one"


def test_one_letter_labels_that_are_other_choices_keys_are_refused() -> None:
    g = gate_with("[A] B", "[B] A")
    assert g.problems and "overlap" in g.problems[0].message


def test_more_choices_than_keys() -> None:
    g = gate_with(*["x"] * 37)
    assert len(g.choices) == 36 and "no key left" in g.problems[0].message


# -- interactive nodes ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("reply", "status"),
    [
        ("/done", Status.SUCCESS),
        ("/approve", Status.SUCCESS),
        ("/reject", Status.FAIL),
        (" /DONE\n", Status.SUCCESS),
    ],
)
def test_interactive_commands_end_the_node(reply: str, status: Status) -> None:
    assert ending(reply) == status


@pytest.mark.parametrize("reply", ["done", "/done please", "looks good", "", "/stop"])
def test_anything_else_goes_back_to_the_agent(reply: str) -> None:
    assert ending(reply) is None


def test_auto_approve_ends_an_interactive_node() -> None:
    assert ending(AUTO_APPROVE_REPLY) == Status.SUCCESS


# -- the seed's end-to-end rows, walked on paper over the example graphs ------------------------
def walk(name: str, answers: list[str]) -> list[str]:
    """Visit nodes as a runner would: every LLM step succeeds, each gate takes the next answer
    (none left: SKIPPED), and edge selection picks the way on."""
    graph = load_pipeline(EXAMPLES / name)
    queue, node, seen = list(answers), graph.start, []
    assert node is not None
    while True:
        seen.append(node.id)
        if node.kind == Kind.EXIT:
            return seen
        if node.kind == Kind.WAIT_HUMAN:
            g = gate(graph, node.id)
            outcome = g.on_answer(queue.pop(0)) if queue else g.on_skipped()
            assert outcome is not None
        else:
            outcome = Outcome(Status.SUCCESS)
        if outcome.status == Status.FAIL:
            return [*seen, f"FAIL: {outcome.failure_reason}"]
        sel = select_edge(graph, node.id, outcome, dict(outcome.context_updates))
        assert sel.edge is not None
        node = graph.nodes[sel.edge.target]


def test_pipeline_with_human_gate_approve_routes_to_exit() -> None:
    assert walk("review-gate.dot", ["A"]) == ["start", "do_work", "review_gate", "apply", "exit"]


def test_pipeline_with_reject_routes_to_the_retry_path() -> None:
    assert walk("review-gate.dot", ["Revise", "approve"]) == [
        "start", "do_work", "review_gate", "revise", "review_gate", "apply", "exit",
    ]  # fmt: skip


def test_pipeline_with_auto_approve_takes_the_first_option() -> None:
    graph = load_pipeline(EXAMPLES / "review-gate.dot")
    first = gate(graph, "review_gate").options()[0]
    assert walk("review-gate.dot", [first.key])[3] == "apply"


def test_multiple_human_gates_each_route_correctly() -> None:
    assert walk("two-gates.dot", ["A", "h"]) == [
        "start", "plan", "plan_gate", "build", "release_gate", "hold", "exit",
    ]  # fmt: skip
    assert walk("two-gates.dot", ["R", "A", "[S] Ship"])[-3:] == ["release_gate", "ship", "exit"]


def test_an_exhausted_answer_queue_fails_at_the_gate() -> None:
    assert walk("review-gate.dot", [])[-1] == "FAIL: human skipped interaction"


def test_the_two_gates_example_release_gate_times_out_to_hold() -> None:
    graph = load_pipeline(EXAMPLES / "two-gates.dot")
    outcome = gate(graph, "release_gate").on_timeout()
    assert select_edge(graph, "release_gate", outcome, {}).edge.target == "hold"  # type: ignore[union-attr]
