"""Warnings (W codes) and the acceptance rules: nodes only in edges, nodes reached only through a
retry target; `check` on large graphs scans the edges a fixed number of times."""

from __future__ import annotations

import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from deltad.pipeline import (
    Code,
    GraphError,
    Kind,
    check_file,
    check_pipeline,
    gate,
    lint,
    validate,
)
from deltad.pipeline.describe import describe
from deltad.pipeline.lint import NO_TIMEOUT, attr_warning

from .helpers import graph_of, only, problems_in, raw_graph

ENDS = "start [shape=Mdiamond]\nexit [shape=Msquare]\n"


def warnings_in(body: str) -> list[str]:
    """The warning lines of a graph that must be accepted."""
    text = f"digraph t {{\n{textwrap.dedent(body)}\n}}"
    return check_pipeline(text, "t.dot", check_files=False).warning_lines()


# -- W001, W002: one table, the pure rule --------------------------------------------------
@pytest.mark.parametrize(
    ("what", "key", "kind", "code", "says"),
    [
        ("node", "manager.poll_interval", Kind.MANAGER, Code.IGNORED_ATTRIBUTE, "§4.11"),
        ("node", "stack.child_autostart", Kind.MANAGER, Code.IGNORED_ATTRIBUTE, "starts it"),
        ("graph", "stack.child_workdir", None, Code.IGNORED_ATTRIBUTE, "workspace"),
        ("node", "tool_hooks.pre", Kind.CODERGEN, Code.IGNORED_ATTRIBUTE, "§9.7"),
        ("node", "timeout", Kind.EXIT, Code.IGNORED_ATTRIBUTE, "timeout has no effect here"),
        ("node", "timeout", Kind.CONDITIONAL, Code.IGNORED_ATTRIBUTE, "an LLM node's are"),
        ("node", "promt", Kind.CODERGEN, Code.UNKNOWN_ATTRIBUTE, "did you mean prompt?"),
        ("edge", "conditon", None, Code.UNKNOWN_ATTRIBUTE, "did you mean condition?"),
        ("graph", "gaol", None, Code.UNKNOWN_ATTRIBUTE, "did you mean goal?"),
        ("node", "zzz", Kind.CODERGEN, Code.UNKNOWN_ATTRIBUTE, "'zzz': it has no effect (a typo?)"),
        ("node", "command", Kind.CODERGEN, Code.UNKNOWN_ATTRIBUTE, "did you mean tool_command?"),
    ],
)
def test_an_attribute_not_carried_out_is_a_warning(
    what: str, key: str, kind: Kind | None, code: Code, says: str
) -> None:
    found = attr_warning(what, key, kind)
    assert found is not None and found[0] == code and says in found[1], found


@pytest.mark.parametrize(
    ("what", "key", "kind"),
    [
        ("graph", "goal", None),
        ("graph", "default_max_retry", None),
        ("graph", "rankdir", None),  # Graphviz drawing: no effect on a run, and none expected
        ("graph", "model_stylesheet", None),  # model settings and fidelity are carried out
        ("graph", "default_fidelity", None),
        ("node", "llm_model", Kind.CODERGEN),
        ("node", "llm_provider", Kind.CODERGEN),
        ("node", "reasoning_effort", Kind.CODERGEN),
        ("node", "class", Kind.CODERGEN),
        ("node", "fidelity", Kind.CODERGEN),
        ("node", "thread_id", Kind.CODERGEN),
        ("edge", "fidelity", None),
        ("edge", "thread_id", None),
        ("node", "allow_partial", Kind.CODERGEN),  # retries, parallel branches: carried out
        ("node", "join_policy", Kind.PARALLEL),
        ("node", "max_parallel", Kind.PARALLEL),
        ("node", "auto_status", Kind.CODERGEN),
        ("edge", "loop_restart", None),
        ("graph", "stack.child_dotfile", None),  # the manager loop: carried out
        ("node", "manager.max_cycles", Kind.MANAGER),
        ("node", "manager.stop_condition", Kind.MANAGER),
        ("node", "manager.actions", Kind.MANAGER),
        ("node", "timeout", Kind.WAIT_HUMAN),
        ("node", "timeout", Kind.TOOL),
        ("node", "timeout", Kind.CODERGEN),
        ("node", "human.default_choice", Kind.WAIT_HUMAN),
        ("node", "color", Kind.CODERGEN),
        ("node", "command", Kind.TOOL),  # an error there (E008), not a warning too
        ("edge", "weight", None),
        ("edge", "style", None),
    ],
)
def test_an_attribute_carried_out_or_only_drawn_is_no_warning(
    what: str, key: str, kind: Kind | None
) -> None:
    assert attr_warning(what, key, kind) is None


def test_warnings_name_the_place_and_the_code_and_do_not_refuse() -> None:
    warnings = warnings_in(
        f"""\
        graph [tool_hooks.pre="audit.sh"]
        {ENDS}w [prompt=p, tool_hooks.post="x", promt=q]
        start -> w -> exit [loop_restrat=true]
        """
    )
    assert warnings == [
        "t.dot:2:31: graph: tool_hooks.pre is ignored by this runner (attractor spec §9.7: tool "
        "approvals and hooks come from the agent directory) [W001 ignored-attribute]",
        "t.dot:5:30: node w: tool_hooks.post is ignored by this runner (attractor spec "
        "§9.7: tool approvals and hooks come from the agent directory) [W001 ignored-attribute]",
        "t.dot:5:41: node w: unknown attribute 'promt': it has no effect: did you mean prompt? "
        "[W002 unknown-attribute]",
        "t.dot:6:42: edge start -> w and 1 more: unknown attribute 'loop_restrat': it has no "
        "effect: did you mean loop_restart? [W002 unknown-attribute]",
    ]


def test_a_default_block_warns_once_not_once_per_node() -> None:
    warnings = warnings_in(
        f"{ENDS}node [tool_hooks.pre=x, prompt=p]\na\nb\nc\nstart -> a -> b -> c -> exit"
    )
    [line] = warnings
    assert line.startswith("t.dot:4:22: node a and 2 more: tool_hooks.pre is ignored")


def test_a_timeout_default_says_nothing_on_the_kinds_it_cannot_apply_to() -> None:
    """`node [timeout=...]` is meant for the LLM nodes and gates; start, exit and a diamond
    inheriting it is no mistake of the author's (four corpus graphs warned on it)."""
    warnings = warnings_in(
        f"node [timeout=5m]\n{ENDS}w [prompt=p]\nc [shape=diamond]\ng [shape=hexagon]\n"
        "start -> w -> c -> g -> exit"
    )
    assert warnings == []
    # written on the node itself it still warns
    warnings = warnings_in(
        f"node [timeout=5m]\n{ENDS}c [shape=diamond, timeout=1s]\nstart -> c -> exit"
    )
    assert [w.split(": ", 2)[1:] for w in warnings] == [
        ["node c", f"{NO_TIMEOUT} [W001 ignored-attribute]"]
    ]


def test_a_conditional_timeout_warns_but_a_gate_or_llm_timeout_does_not() -> None:
    warnings = warnings_in(
        f"{ENDS}w [prompt=p, timeout=5m]\ng [shape=hexagon, timeout=5m]\n"
        "c [shape=diamond, timeout=1s]\n"
        "start -> w -> g -> c -> exit"
    )
    assert [w.split(": ", 2)[1:] for w in warnings] == [
        ["node c", f"{NO_TIMEOUT} [W001 ignored-attribute]"]
    ]


def test_strict_refuses_warnings_as_errors() -> None:
    text = f"digraph t {{\n{ENDS}w [tool_hooks.pre=x, prompt=p]\nstart -> w -> exit\n}}"
    assert check_pipeline(text, "t.dot").graph.nodes["w"].kind == Kind.CODERGEN
    with pytest.raises(GraphError) as err:
        check_pipeline(text, "t.dot", strict=True)
    [line] = err.value.lines()
    assert line.startswith("t.dot:4:19: node w: tool_hooks.pre is ignored") and "W001" in line


def test_errors_and_warnings_are_kept_apart() -> None:
    with pytest.raises(GraphError) as err:
        check_pipeline(
            f"digraph t {{\n{ENDS}w [tool_hooks.pre=x, shape=star, prompt=p]\n"
            "start -> w -> exit\n}",
            "t.dot",
        )
    assert [line.rsplit("[", 1)[1] for line in err.value.lines()] == ["E003 bad-value]"]
    assert [line.rsplit("[", 1)[1] for line in err.value.warning_lines()] == [
        "W001 ignored-attribute]"
    ]


@pytest.mark.parametrize(
    ("body", "warned"),
    [
        ("w [goal_gate=true]", True),
        ("w [goal_gate=false]", False),
        ("w [goal_gate=true, retry_target=w]", False),
        ("w [goal_gate=true, fallback_retry_target=w]", False),
        ("graph [retry_target=w]\nw [goal_gate=true]", False),
        ("graph [fallback_retry_target=w]\nw [goal_gate=true]", False),
    ],
)
def test_a_goal_gate_without_a_retry_target_warns(body: str, warned: bool) -> None:
    warnings = warnings_in(f"{ENDS}w [prompt=p]\n{body}\nstart -> w -> exit")
    expected = ["goal_gate=true without a retry_target"] if warned else []
    assert [w.split(": ", 2)[2][:37] for w in warnings] == expected
    assert all(w.endswith("[W004 goal-gate-without-retry]") for w in warnings)


# -- W003 and the attractor spec's §2.13 human gate ------------------------------------------
SPEC_HUMAN_GATE = """\
digraph Review {
    rankdir=LR

    start [shape=Mdiamond, label="Start"]
    exit  [shape=Msquare, label="Exit"]

    review_gate [
        shape=hexagon,
        label="Review Changes",
        type="wait.human"
    ]

    start -> review_gate
    review_gate -> ship_it [label="[A] Approve"]
    review_gate -> fixes   [label="[F] Fix"]
    ship_it -> exit
    fixes -> review_gate
}
"""


def test_the_spec_human_gate_example_is_accepted_with_a_warning_per_edge_only_node() -> None:
    checked = check_pipeline(SPEC_HUMAN_GATE, "review.dot")
    ship_it, fixes = checked.graph.nodes["ship_it"], checked.graph.nodes["fixes"]
    assert (ship_it.kind, ship_it.shape, ship_it.label, ship_it.declared) == (
        Kind.CODERGEN,
        "box",
        "ship_it",
        False,
    )
    assert fixes.kind == Kind.CODERGEN
    assert [(c.key, c.target) for c in gate(checked.graph, "review_gate").choices] == [
        ("A", "ship_it"),
        ("F", "fixes"),
    ]
    assert checked.warning_lines() == [
        "review.dot:14:20: node ship_it: never declared, only mentioned in edges: it runs as a "
        "codergen node with default attributes; declare it (e.g. ship_it [shape=box, "
        'prompt="..."]) '
        "or fix the name [W003 edge-only-node]",
        "review.dot:15:20: node fixes: never declared, only mentioned in edges: it runs as a "
        "codergen node with default attributes; declare it (e.g. fixes [shape=box, "
        'prompt="..."]) '
        "or fix the name [W003 edge-only-node]",
    ]


def test_an_edge_only_node_takes_the_defaults_in_force_where_it_is_mentioned() -> None:
    graph = graph_of(f'{ENDS}node [shape=parallelogram, tool_command="make"]\nstart -> t -> exit')
    assert (graph.nodes["t"].kind, graph.nodes["t"].tool_command) == (Kind.TOOL, "make")


def test_a_graph_of_edges_only_runs_with_start_and_exit_found_by_id() -> None:
    checked = check_pipeline("digraph t { start -> work -> exit }", "t.dot")
    kinds = [n.kind for n in checked.graph.nodes.values()]
    assert kinds == [Kind.START, Kind.CODERGEN, Kind.EXIT]
    assert [w.split(": ")[1] for w in checked.warning_lines()] == [
        "node start",
        "node work",
        "node exit",
    ]
    assert "it runs as a start node" in checked.warning_lines()[0]


# -- retry targets reach nodes -------------------------------------------------------------
@pytest.mark.parametrize(
    "body",
    [
        "w [retry_target=fix]\nfix\nstart -> w -> exit\nfix -> w",
        "w [fallback_retry_target=fix]\nfix\nstart -> w -> exit\nfix -> w",
        "graph [retry_target=fix]\nw\nfix\nstart -> w -> exit\nfix -> w",
        "fallback_retry_target=fix\nw\nfix\nstart -> w -> exit\nfix -> w",
        # a chain of them: fix is reached through w, again through fix
        "w [retry_target=fix]\nfix [retry_target=again]\nagain\nstart -> w -> exit\nfix -> w\n"
        "again -> w",
    ],
)
def test_a_node_reached_only_through_a_retry_target_is_reachable(body: str) -> None:
    graph = graph_of(f"{ENDS}{body}")
    assert "fix" in graph.nodes


def test_a_retry_target_of_an_unreachable_node_reaches_nothing() -> None:
    problems = problems_in(f"{ENDS}lost [retry_target=fix]\nfix\nstart -> exit\nfix -> exit")
    only(problems, "node lost: not reachable")
    only(problems, "node fix: not reachable")


# -- large graphs: correct, and the edges are scanned a fixed number of times ----------------
class CountedEdges(tuple):  # type: ignore[type-arg]
    """The graph's edges, counting every full pass over them."""

    passes = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        CountedEdges.passes += 1
        return super().__iter__()


def chain(n: int, extra: str = "") -> str:
    lines = [ENDS, *(f"n{i} [prompt=p]" for i in range(n)), "start -> n0"]
    lines += [f"n{i} -> n{i + 1}" for i in range(n - 1)] + [f"n{n - 1} -> exit", extra]
    return "\n".join(lines)


def test_validate_lint_and_describe_pass_over_the_edges_a_fixed_number_of_times() -> None:
    """Before the index, every node's outgoing() was a pass: 2,000 passes here."""
    graph = raw_graph(chain(2000) + "\ng [shape=hexagon]\nn5 -> g\ng -> n6 [label=Go]")
    graph = replace(graph, edges=CountedEdges(graph.edges))
    CountedEdges.passes = 0
    assert validate(graph, check_files=False) == [] and lint(graph) == []
    describe(graph, "t.dot")
    assert CountedEdges.passes <= 6, CountedEdges.passes


def test_a_gate_with_many_choices_reports_each_clash_once() -> None:
    """The ambiguity check looks each choice up (it compared every pair)."""
    edges = "\n".join(f'g -> n{i} [label="L{i % 3}"]' for i in range(9))
    nodes = "\n".join(f"n{i}\nn{i} -> exit" for i in range(9))
    problems = problems_in(f"{ENDS}g [shape=hexagon]\nstart -> g\n{edges}\n{nodes}")
    clashes = [p for p in problems if "is also the label of" in p]
    assert len(clashes) == 6  # choices 3..8 each repeat one of the first three labels
    assert "label 'L0' is also the label of the edge to n0" in clashes[0]


# -- every error has its code --------------------------------------------------------------
@pytest.mark.parametrize(
    ("body", "code"),
    [
        ("start -> ", Code.SYNTAX),
        (f"{ENDS}w [shape=star]\nstart -> w -> exit", Code.BAD_VALUE),
        (f'{ENDS}w\nstart -> w\nw -> exit [condition="outcome=="]', Code.BAD_CONDITION),
        ("start [shape=Mdiamond]\nw\nstart -> w", Code.START_EXIT),
        (f"{ENDS}start -> exit\nlost", Code.UNREACHABLE),
        (f"{ENDS}g [shape=hexagon]\nstart -> g\nstart -> exit", Code.GATE),
        (f"{ENDS}t [shape=parallelogram]\nstart -> t -> exit", Code.NODE_ATTR),
        (f"{ENDS}w [agent=nowhere]\nstart -> w -> exit", Code.NO_AGENT_DIR),
        (f"{ENDS}w [retry_target=nowhere]\nstart -> w -> exit", Code.RETRY_TARGET),
    ],
)
def test_each_error_ends_with_its_code(tmp_path: Path, body: str, code: Code) -> None:
    with pytest.raises(GraphError) as err:
        check_pipeline(f"digraph t {{\n{body}\n}}", "t.dot", tmp_path)
    assert [line.rsplit(" [", 1)[1] for line in err.value.lines()] == [f"{code}]"]


def test_an_unreadable_file_has_its_code(tmp_path: Path) -> None:
    with pytest.raises(GraphError) as err:
        check_file(tmp_path / "missing.dot")
    assert err.value.lines() == [f"{tmp_path}/missing.dot: no such file [E001 unreadable-file]"]


def test_llm_nodes_in_branches_no_longer_warn() -> None:
    # Their own questions pause only their branch now: W005 is retired.
    warnings = warnings_in(
        f"""\
        {ENDS}fan [shape=component]
        join [shape=tripleoctagon]
        a [prompt=a]
        b [prompt=b]
        g [shape=hexagon]
        start -> fan
        fan -> a -> g
        g -> join [label=Go]
        fan -> b -> join
        join -> exit
        """
    )
    assert not [w for w in warnings if "W005" in w]


# -- §4.8 error_policy, §7.2 prompt_on_llm_nodes, §9 variable expansion ---------------------
def test_error_policy_continue_is_what_runs_and_the_others_are_w001() -> None:
    body = f"{ENDS}p [shape=component, error_policy={{}}]\na [prompt=x]\nb [prompt=y]\n"
    body += "f [shape=tripleoctagon]\nstart -> p\np -> a -> f\np -> b -> f\nf -> exit"
    assert warnings_in(body.format("continue")) == []
    for policy in ("fail_fast", "ignore"):
        [line] = warnings_in(body.format(policy))
        assert f"node p: error_policy '{policy}' is ignored by this runner" in line
        assert line.endswith("[W001 ignored-attribute]"), line


def test_an_llm_node_with_neither_prompt_nor_label_warns() -> None:
    [line] = warnings_in(
        f"{ENDS}w\nv [label=Summarize]\nu [prompt=go]\nstart -> w -> v -> u -> exit"
    )
    assert line == (
        "t.dot:4:1: node w: an LLM node with neither prompt nor label (attractor spec §7.2 "
        "prompt_on_llm_nodes): the model is asked the node id 'w' [W007 prompt-on-llm-node]"
    )


def test_prompt_templates_other_than_goal_are_named_one_warning_each() -> None:
    body = (
        f'{ENDS}w [prompt="Plan $goal with $context.plan, then read @prompts/review.md. '
        'Cost $5, mail a@b.com, $context.plan again"]\n'
        'v [label="Use $name"]\nu [prompt=ok, label="$ignored as the prompt is set"]\n'
        "start -> w -> v -> u -> exit"
    )
    found = [w.split(": ", 2)[1:] for w in warnings_in(body)]
    assert found == [
        [
            "node w",
            "prompt text '$context.plan' reaches the model as written: only $goal is "
            "expanded (attractor spec §9 variable expansion) [W008 prompt-template]",
        ],
        [
            "node w",
            "prompt text '@prompts/review.md' reaches the model as written: only $goal "
            "is expanded (attractor spec §9 variable expansion) [W008 prompt-template]",
        ],
        [
            "node v",
            "prompt text '$name' reaches the model as written: only $goal is "
            "expanded (attractor spec §9 variable expansion) [W008 prompt-template]",
        ],
    ]
