"""Validation: each refusal, with the node or edge and the line, and every problem at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from deltad.pipeline import GraphError, Kind, load_pipeline, parse_pipeline

from .helpers import graph_of, only, pipeline_graph, problems_in

ENDS = "start [shape=Mdiamond]\nexit [shape=Msquare]\n"


def test_model_types_every_attribute() -> None:
    graph = graph_of(
        """
        graph [goal="Ship it", default_max_retries=2, retry_target=work, label="Release"]
        start [shape=Mdiamond]
        exit [shape=Msquare]
        work [label="Work", prompt="Do: $goal", timeout="5m", max_retries=0, goal_gate=true]
        chat [agent.mode="interactive", agent="agents/other", prompt="Talk"]
        gate [shape=hexagon, label="OK?", timeout=900, human.default_choice="exit"]
        check [shape=diamond]
        run [shape=parallelogram, tool_command="make test", timeout="1h"]
        typed [type="wait.human", shape=box]
        start -> work -> chat -> gate
        gate -> check [label="[C] Check"]
        gate -> exit [label="[E] End"]
        gate -> typed
        typed -> run
        check -> run [condition="outcome=success", weight=5]
        check -> exit [condition="outcome!=success"]
        run -> exit
        """
    )
    assert (graph.goal, graph.label, graph.default_max_retries, graph.retry_target) == (
        "Ship it",
        "Release",
        2,
        "work",
    )
    n = graph.nodes
    assert [x.kind for x in n.values()] == [
        Kind.START,
        Kind.EXIT,
        Kind.CODERGEN,
        Kind.CODERGEN,
        Kind.WAIT_HUMAN,
        Kind.CONDITIONAL,
        Kind.TOOL,
        Kind.WAIT_HUMAN,  # `type` wins over shape
    ]
    work = n["work"]
    assert (work.prompt, work.timeout, work.max_retries, work.goal_gate) == (
        "Do: Ship it",
        300,
        0,
        True,
    )
    assert n["chat"].interactive and n["chat"].agent == Path("agents/other")
    assert n["chat"].max_retries == 2  # the graph's default
    assert n["start"].label == "start"  # the id when no label
    assert (n["gate"].timeout, n["gate"].default_choice) == (900, "exit")
    assert n["run"].tool_command == "make test"
    edge = graph.outgoing("check")[0]
    assert (edge.condition, edge.weight, edge.guard is not None) == ("outcome=success", 5, True)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30),
        ("5m", 300),
        ("1h", 3600),
        ("900", 900),
        ("250ms", 0.25),
        ("1d", 86400),
        ("1.5h", 5400),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    graph = graph_of(f'{ENDS} n [timeout="{text}"]\nstart -> n -> exit')
    assert graph.nodes["n"].timeout == seconds


def test_unshaped_nodes_named_start_and_exit_are_the_ends() -> None:
    graph = graph_of("start -> work -> exit\nstart\nexit\nwork")
    assert (graph.nodes["start"].kind, graph.nodes["exit"].kind) == (Kind.START, Kind.EXIT)


def test_unknown_shape() -> None:
    line = only(problems_in(f"{ENDS}w [shape=circle]\nstart -> w -> exit"), "unknown shape")
    assert line.startswith("t.dot:4:10: node w: unknown shape 'circle'")


def test_a_manager_loop_without_a_child_pipeline_is_refused() -> None:
    line = only(problems_in(f"{ENDS}m [shape=house]\nstart -> m -> exit"), "child_dotfile")
    assert "a manager loop needs the graph attribute stack.child_dotfile" in line


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("p [shape=component]\nstart -> p -> exit", "lead to no fan-in node"),
        (
            "p [shape=component, join_policy=any]\nj [shape=tripleoctagon]\n"
            "start -> p -> a -> j -> exit",
            "join_policy 'any': use wait_all or first_success",
        ),
        ("w [join_policy=wait_all]\nstart -> w -> exit", "join_policy applies to component"),
    ],
)
def test_parallel_nodes_need_a_fan_in_and_a_known_policy(body: str, expected: str) -> None:
    only(problems_in(f"{ENDS}{body}"), expected)


def test_a_parallel_node_with_a_fan_in_is_accepted() -> None:
    body = "p [shape=component]\nj [shape=tripleoctagon]\nstart -> p\np -> a -> j\np -> b -> j"
    graph = pipeline_graph(f"digraph t {{\n{ENDS}{body}\nj -> exit\n}}")
    assert (graph.nodes["p"].kind, graph.nodes["j"].kind) == (Kind.PARALLEL, Kind.FAN_IN)


def test_unknown_type() -> None:
    only(problems_in(f"{ENDS}w [type=magic]\nstart -> w -> exit"), "unknown type 'magic'")


def test_no_start_node() -> None:
    assert only(problems_in("exit [shape=Msquare]"), "no start node") == (
        "t.dot: no start node: add one with shape=Mdiamond [E005 start-exit]"
    )


def test_more_than_one_start_node() -> None:
    line = only(
        problems_in(f"{ENDS}again [shape=Mdiamond]\nstart -> exit\nagain -> exit"), "second start"
    )
    assert line.startswith("t.dot:4:1: node again: a second start node (start on line 2 is one)")


def test_no_exit_node_and_more_than_one() -> None:
    assert only(problems_in("start [shape=Mdiamond]"), "no exit node")
    problems = problems_in(f"{ENDS}end2 [shape=Msquare]\nstart -> exit\nstart -> end2")
    only(problems, "a second exit node")


def test_start_with_incoming_and_exit_with_outgoing_edges() -> None:
    problems = problems_in(f"{ENDS}w\nstart -> w -> start\nw -> exit -> w")
    assert only(problems, "start node cannot have incoming").startswith(
        "t.dot:5:10: edge w -> start"
    )
    assert only(problems, "exit node cannot have outgoing").startswith("t.dot:6:6: edge exit -> w")


def test_a_typo_in_an_edge_leaves_the_declared_node_unreachable() -> None:
    """A node only mentioned in edges is a node (as in Graphviz and the spec's own examples):
    `revew` runs as an LLM step with a W003 warning, and the declared `review` is unreachable."""
    problems = problems_in(f"{ENDS}review\nstart -> revew -> exit")
    assert problems == [
        "t.dot:4:1: node review: not reachable from the start node [E006 unreachable]"
    ]


def test_a_node_declared_after_its_edges_is_fine() -> None:
    graph = graph_of(
        "start -> w -> exit\nstart [shape=Mdiamond]\nexit [shape=Msquare]\nw [label=W]"
    )
    assert graph.nodes["w"].label == "W"


def test_a_node_unreachable_from_the_start() -> None:
    problems = problems_in(f"{ENDS}island\nfar\nstart -> exit\nisland -> far")
    assert only(problems, "node island").startswith("t.dot:4:1: node island: not reachable")
    only(problems, "node far: not reachable")


def test_a_gate_with_no_outgoing_edge() -> None:
    line = only(problems_in(f"{ENDS}g [shape=hexagon]\nstart -> g"), "no outgoing edge")
    assert line.startswith("t.dot:4:1: node g: a human gate with no outgoing edge")


def test_a_gate_with_duplicate_accelerator_keys() -> None:
    problems = problems_in(
        f"""{ENDS}g [shape=hexagon]\nstart -> g
        g -> exit [label="[A] Approve"]
        g -> start2 [label="a) Abort"]
        start2 [label=x]
        start2 -> exit"""
    )
    line = only(problems, "also the key of")
    assert "edge g -> start2: key A is also the key of the edge to exit (line 6)" in line


def test_a_gate_with_two_choices_of_one_label() -> None:
    problems = problems_in(
        f"""{ENDS}g [shape=hexagon]\na\nstart -> g
        g -> exit [label="[A] Go"]
        g -> a [label="[B] go"]
        a -> exit"""
    )
    only(problems, "label 'go' is also the label of the edge to exit")


def test_a_gate_edge_with_a_condition() -> None:
    problems = problems_in(
        f'{ENDS}g [shape=hexagon]\nstart -> g\ng -> exit [condition="outcome=success"]'
    )
    only(problems, "cannot have a condition")


@pytest.mark.parametrize(
    ("condition", "says"),
    [
        ("outcome==success", "write '=' for equals, not '=='"),
        ("status=ok", "unknown key 'status'"),
        ("outcome=success || outcome=fail", "'||' is not part of the language"),
        ("outcome=succes", "outcome 'succes' is never set"),
        ("context.x", "needs '=' or '!='"),
        ("outcome=success &&", "empty clause"),
        ("context.x=two words", "put quotes around"),
    ],
)
def test_a_condition_that_does_not_parse(condition: str, says: str) -> None:
    problems = problems_in(
        f'{ENDS}d [shape=diamond]\nstart -> d\nd -> exit [condition="{condition}"]'
    )
    line = only(problems, says)
    assert line.startswith(f"t.dot:6:22: edge d -> exit: condition {condition!r}: ")


def test_a_default_choice_that_matches_no_choice() -> None:
    problems = problems_in(
        f"""{ENDS}g [shape=hexagon, timeout=5m, human.default_choice="Maybe"]\nstart -> g
        g -> exit [label="[Y] Yes"]"""
    )
    line = only(problems, "matches no choice")
    assert line.startswith(
        "t.dot:4:52: node g: human.default_choice 'Maybe' matches no choice: give a key (Y)"
    )


@pytest.mark.parametrize("default", ["Y", "y", "Yes", "[Y] Yes", "exit"])
def test_a_default_choice_may_be_a_key_a_label_or_a_node_id(default: str) -> None:
    graph_of(
        f'{ENDS}g [shape=hexagon, human.default_choice="{default}"]\n'
        'start -> g\ng -> exit [label="[Y] Yes"]'
    )


@pytest.mark.parametrize(
    ("attr", "says"),
    [
        ('max_retries="-1"', "max_retries: '-1' must be from 0 to 1000"),
        ("max_retries=many", "max_retries: 'many' is not a whole number"),
        ('timeout="soon"', "timeout: 'soon' is not a duration (e.g. 30s, 5m, 1h, 900)"),
        ("timeout=0s", "timeout: '0s' must be longer than zero"),
        ("timeout=99999d", "longer than ten years"),
        ("goal_gate=maybe", "goal_gate: 'maybe' is not true or false"),
    ],
)
def test_bad_numbers_and_durations(attr: str, says: str) -> None:
    line = only(problems_in(f"{ENDS}w [{attr}]\nstart -> w -> exit"), says)
    assert line.startswith("t.dot:4:") and "node w:" in line


def test_bad_weight_and_graph_retries() -> None:
    problems = problems_in(f"graph [default_max_retries=lots]\n{ENDS}start -> exit [weight=heavy]")
    only(problems, "graph: default_max_retries: 'lots' is not a whole number")
    only(problems, "edge start -> exit: weight: 'heavy' is not a whole number")


def test_agent_mode_other_than_interactive() -> None:
    line = only(problems_in(f'{ENDS}w [agent.mode="chat"]\nstart -> w -> exit'), "agent.mode")
    assert "agent.mode 'chat' is not known: the only mode is interactive" in line


@pytest.mark.parametrize(
    ("node", "says"),
    [
        (
            'g [shape=hexagon, agent.mode="interactive"]',
            "agent.mode applies to box (LLM) nodes only",
        ),
        (
            'w [human.default_choice="A"]',
            "human.default_choice applies to hexagon (gate) nodes only",
        ),
        ('w [tool_command="ls"]', "tool_command applies to parallelogram (tool) nodes only"),
        ("t [shape=parallelogram]", "a tool node needs tool_command"),
        ('t [shape=parallelogram, command="ls"]', "the attribute is tool_command, not command"),
        ("w [retry_target=nowhere]", "retry_target 'nowhere' is not a node"),
    ],
)
def test_attributes_on_the_wrong_kind_of_node(node: str, says: str) -> None:
    ident = node.split()[0]
    problems = problems_in(f"{ENDS}{node}\nstart -> {ident}\n{ident} -> exit [label=x]")
    only(problems, says)


def test_agent_directories_are_relative_to_the_dot_file_and_must_exist(tmp_path: Path) -> None:
    (tmp_path / "agents" / "reviewer").mkdir(parents=True)
    dot = tmp_path / "p.dot"
    dot.write_text(
        "digraph p { start [shape=Mdiamond]; exit [shape=Msquare]\n"
        'a [agent="agents/reviewer"]; b [agent="agents/missing"]; start -> a -> b -> exit }'
    )
    with pytest.raises(GraphError) as err:
        load_pipeline(dot)
    [line] = err.value.lines()
    assert f"node b: agent directory {tmp_path}/agents/missing does not exist" in line
    dot.write_text(dot.read_text().replace("missing", "reviewer"))
    assert load_pipeline(dot).nodes["a"].agent == tmp_path / "agents" / "reviewer"


def test_every_problem_is_reported_not_only_the_first() -> None:
    problems = problems_in(
        """start [shape=Mdiamond]
        w [shape=circle, timeout=soon]
        g [shape=hexagon]
        start -> w -> typo"""
    )
    for needle in (
        "no exit node",
        "unknown shape",
        "timeout",
        "no outgoing edge",
        "node g: not reachable",
    ):
        only(problems, needle)
    assert (
        problems[0] == "t.dot: no exit node: add one with shape=Msquare [E005 start-exit]"
    )  # whole-graph first
    assert all("\n" not in p for p in problems)


def test_a_problem_quoting_a_multiline_value_stays_one_line() -> None:
    [line] = [p for p in problems_in(f'{ENDS}w [shape="two\nlines"]\nstart -> w -> exit')]
    assert "\n" not in line and "two\\nlines" in line


def test_graph_error_message_is_one_line() -> None:
    with pytest.raises(GraphError) as err:
        parse_pipeline("digraph g { a }", "g.dot")
    assert (
        str(err.value)
        == "g.dot: no start node: add one with shape=Mdiamond [E005 start-exit] (and 1 more)"
    )
