"""`delta pipeline check` as a real process: the examples pass with a listing; bad graphs
exit 2 with every problem on its own line, naming the line; no input shows a traceback."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ..conftest import EXAMPLES, Result, bin_path

PIPELINES = EXAMPLES / "pipelines"


def check(*args: str, cwd: Path | None = None) -> Result:
    p = subprocess.run(
        [bin_path("delta"), "pipeline", "check", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )
    assert "Traceback" not in p.stderr + p.stdout
    return Result(p.returncode, p.stdout, p.stderr)


def test_review_gate_example_lists_nodes_edges_and_gates() -> None:
    r = check(str(PIPELINES / "review-gate.dot"))
    assert (r.code, r.err) == (0, "")
    lines = [line.split() for line in r.out.splitlines()]
    assert [w for w in lines[lines.index(["Nodes", "(6):"]) + 4] if w != "the"] == [
        "review_gate",
        "hexagon",
        "wait.human",
        '"Review',
        'plan"',
    ]
    assert '  review_gate -> apply  label="[A] Approve"' in r.out.splitlines()
    gates = r.out.split("Gates (1):\n", 1)[1].splitlines()
    assert gates == [
        '  review_gate: "Review the plan"',
        "    [A] Approve -> apply",
        "    [R] Revise -> revise",
    ]


def test_two_gates_example_shows_both_gates_and_the_default() -> None:
    r = check(str(PIPELINES / "two-gates.dot"))
    assert r.code == 0
    assert (
        '  plan_gate: "Approve the plan?"\n    [A] Approve -> build\n    [R] Revise -> plan'
        in r.out
    )
    assert (
        "    [S] Ship -> ship\n    [H] Hold -> hold\n    default: [H] Hold (taken after 1h)"
        in r.out
    )


def test_interactive_example_marks_the_interactive_node() -> None:
    r = check(str(PIPELINES / "interactive.dot"))
    assert r.code == 0
    assert any(
        line.split()[:4] == ["brainstorm", "box", "codergen", "(interactive)"]
        for line in r.out.splitlines()
    )
    assert '  brainstorm -> exit  label="Rejected"  condition="outcome=fail"' in r.out


BAD = {
    "syntax": ("digraph g {\n  start -> \n}\n", ["g.dot:3:1: expected a node id, found '}'"]),
    "undirected": ("graph g {\n  a -- b\n}\n", ["g.dot:1:1: a pipeline is a digraph"]),
    "no start or exit": (
        "digraph g {\n  work [label=Work]\n}\n",
        ["g.dot: no start node", "g.dot: no exit node"],
    ),
    "unknown shape": (
        "digraph g {\n  start [shape=Mdiamond]\n  exit [shape=Msquare]\n  w [shape=star, label=W]\n"
        "  start -> w -> exit\n}\n",
        ["g.dot:4:12: node w: unknown shape 'star'"],
    ),
    "unreachable and gate without edges": (
        "digraph g {\n  start [shape=Mdiamond]\n  exit [shape=Msquare]\n  start -> exit\n"
        "  gate [shape=hexagon]\n}\n",
        [
            "g.dot:5:3: node gate: not reachable from the start node",
            "g.dot:5:3: node gate: a human gate with no outgoing edge",
        ],
    ),
}


@pytest.mark.parametrize("name", list(BAD))
def test_a_bad_graph_exits_2_with_every_problem_on_its_line(tmp_path: Path, name: str) -> None:
    text, expected = BAD[name]
    (tmp_path / "g.dot").write_text(text)
    r = check("g.dot", cwd=tmp_path)
    assert (r.code, r.out) == (2, "")
    lines = r.err.splitlines()
    assert len(lines) == len(expected)
    for line, start in zip(lines, expected, strict=True):
        assert line.startswith(f"delta: error: {start}"), lines


def test_a_broken_copy_of_the_example_names_each_problem(tmp_path: Path) -> None:
    text = (PIPELINES / "review-gate.dot").read_text()
    text = text.replace('[label="[R] Revise"]', '[label="[a] Again"]')
    text = text.replace("apply -> exit", "apply -> exti")
    (tmp_path / "g.dot").write_text(text)
    r = check(str(tmp_path / "g.dot"))
    assert r.code == 2
    lines = r.err.splitlines()
    assert len(lines) == 3, lines
    assert "g.dot:7:5: node exit: not reachable from the start node" in lines[0]
    assert "edge review_gate -> revise: key A is also the key of the edge to apply" in lines[1]
    assert all(line.startswith(f"delta: error: {tmp_path}/g.dot:") for line in lines[:2])
    # the typo is a node of its own (as the spec's examples use it): a warning after the errors
    assert lines[2].startswith(f"delta: warning: {tmp_path}/g.dot:17:14: node exti: never declared")


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda p: None, "no such file"),
        (lambda p: p.mkdir(), "not a regular file"),
        (lambda p: p.write_bytes(b"digraph \xff {}"), "not valid UTF-8"),
        (lambda p: p.write_bytes(b"x" * (1024 * 1024 + 1)), "the limit is"),
    ],
)
def test_an_unreadable_file_is_one_line(tmp_path: Path, make, says: str) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "p.dot"
    make(path)
    r = check(str(path))
    assert r.code == 2
    [line] = r.err.splitlines()
    assert line.startswith(f"delta: error: {path}: ") and says in line


def test_a_fifo_does_not_block(tmp_path: Path) -> None:
    import os

    path = tmp_path / "p.dot"
    os.mkfifo(path)
    r = check(str(path))
    assert r.code == 2 and "not a regular file" in r.err


def test_pipeline_help_lists_check() -> None:
    p = subprocess.run([bin_path("delta"), "pipeline", "--help"], capture_output=True, text=True)
    assert p.returncode == 0 and "check" in p.stdout


# -- warnings ----------------------------------------------------------------------------------
WARNED = """\
digraph g {
  graph [tool_hooks.pre="audit.sh"]
  start [shape=Mdiamond]
  exit [shape=Msquare]
  w [shape=diamond, tool_hooks.post=x, timeout=5m]
  start -> w -> exit
}
"""


def test_warnings_go_to_stderr_with_codes_and_exit_0(tmp_path: Path) -> None:
    (tmp_path / "g.dot").write_text(WARNED)
    r = check("g.dot", cwd=tmp_path)
    assert r.code == 0 and r.out.startswith("Pipeline g (g.dot)")
    assert r.err.splitlines() == [
        "delta: warning: g.dot:2:25: graph: tool_hooks.pre is ignored by this runner (attractor "
        "spec §9.7: tool approvals and hooks come from the agent directory) "
        "[W001 ignored-attribute]",
        "delta: warning: g.dot:5:37: node w: tool_hooks.post is ignored by this runner "
        "(attractor spec §9.7: tool approvals and hooks come from the agent directory) "
        "[W001 ignored-attribute]",
        "delta: warning: g.dot:5:48: node w: timeout has no effect here: only a gate's, a "
        "tool's and an LLM node's are enforced [W001 ignored-attribute]",
    ]


def test_strict_turns_warnings_into_errors_and_exits_2(tmp_path: Path) -> None:
    (tmp_path / "g.dot").write_text(WARNED)
    r = check("--strict", "g.dot", cwd=tmp_path)
    assert (r.code, r.out) == (2, "")
    lines = r.err.splitlines()
    assert len(lines) == 3 and all(line.startswith("delta: error: g.dot:") for line in lines)
    assert [line.rsplit(" [", 1)[1] for line in lines] == ["W001 ignored-attribute]"] * 3


def test_errors_come_first_then_the_warnings(tmp_path: Path) -> None:
    (tmp_path / "g.dot").write_text(WARNED.replace("start -> w -> exit", "start -> w"))
    r = check("g.dot", cwd=tmp_path)
    assert (r.code, r.out) == (2, "")
    kinds = [line.split(": ", 2)[1] for line in r.err.splitlines()]
    assert kinds == ["error", "warning", "warning", "warning"]
    assert "node exit: not reachable from the start node [E006 unreachable]" in r.err


def test_the_spec_human_gate_example_passes_check(tmp_path: Path) -> None:
    """Attractor spec §2.13: ship_it and fixes are declared only by the edges that use them."""
    (tmp_path / "review.dot").write_text(
        'digraph Review {\n  rankdir=LR\n  start [shape=Mdiamond, label="Start"]\n'
        '  exit [shape=Msquare, label="Exit"]\n'
        '  review_gate [shape=hexagon, label="Review Changes", type="wait.human"]\n'
        "  start -> review_gate\n"
        '  review_gate -> ship_it [label="[A] Approve"]\n'
        '  review_gate -> fixes [label="[F] Fix"]\n'
        "  ship_it -> exit\n  fixes -> review_gate\n}\n"
    )
    r = check("review.dot", cwd=tmp_path)
    assert r.code == 0, r.err
    assert "    [A] Approve -> ship_it\n    [F] Fix -> fixes" in r.out
    assert [line.split(": ")[3] for line in r.err.splitlines()] == ["node ship_it", "node fixes"]
    assert all(line.endswith("[W003 edge-only-node]") for line in r.err.splitlines())
    assert check("--strict", "review.dot", cwd=tmp_path).code == 2


def test_a_node_reached_only_through_a_retry_target_passes_check(tmp_path: Path) -> None:
    (tmp_path / "g.dot").write_text(
        "digraph g {\n  start [shape=Mdiamond]\n  exit [shape=Msquare]\n"
        '  work [prompt="w", retry_target=fix]\n  fix [prompt="f"]\n'
        "  start -> work -> exit\n  fix -> work\n}\n"
    )
    r = check("g.dot", cwd=tmp_path)
    assert (r.code, r.err) == (0, ""), r.err


def test_a_20000_node_graph_is_checked(tmp_path: Path) -> None:
    """A chain and a fan of 20,000 nodes: every node listed, nothing refused (no time limit
    here; bench/pipeline_check_bench.py times it)."""
    n = 20000
    nodes = [f"n{i} [prompt=p]" for i in range(n)]
    chain = ["start -> n0", *(f"n{i} -> n{i + 1}" for i in range(n - 1)), f"n{n - 1} -> exit"]
    fan = [*(f"start -> n{i}" for i in range(n)), *(f"n{i} -> exit" for i in range(n))]
    for name, edges in (("chain", chain), ("fan", fan)):
        text = "\n".join(["digraph g {", "start [shape=Mdiamond]", "exit [shape=Msquare]"])
        (tmp_path / f"{name}.dot").write_text("\n".join([text, *nodes, *edges, "}"]))
        r = check(f"{name}.dot", cwd=tmp_path)
        assert (r.code, r.err) == (0, "")
        assert f"Nodes ({n + 2}):" in r.out and f"Edges ({len(edges)}):" in r.out
