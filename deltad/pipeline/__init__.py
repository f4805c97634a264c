"""Pipelines (issue 11), the graph layer: attractor DOT graphs parsed, typed and validated; edge
conditions; edge selection; human-gate choices. Pure: nothing here runs a node.

    graph = load_pipeline(Path("review.dot"))          # GraphError lists every problem
    g = gate(graph, "review_gate")                     # choices, keys, default
    outcome = g.on_answer("A") or refuse_as_misfit()   # never a fallback to the first choice
    sel = select_edge(graph, "review_gate", outcome, context)
"""

from .conditions import Condition, ConditionError, parse_condition
from .dot import DotSyntaxError, parse_dot
from .gates import Choice, Gate, derive_choices, gate
from .interactive import ending
from .lint import lint
from .load import Checked, check_file, check_pipeline, load_pipeline, parse_pipeline
from .model import Edge, Graph, Kind, Node, build_graph
from .outcome import Outcome, Status
from .problems import Code, GraphError, Pos, Problem
from .routing import Selection, Step, normalize_label, select_edge
from .validate import validate

__all__ = [
    "Checked",
    "Choice",
    "Code",
    "Condition",
    "ConditionError",
    "DotSyntaxError",
    "Edge",
    "Gate",
    "Graph",
    "GraphError",
    "Kind",
    "Node",
    "Outcome",
    "Pos",
    "Problem",
    "Selection",
    "Status",
    "Step",
    "build_graph",
    "check_file",
    "check_pipeline",
    "derive_choices",
    "ending",
    "gate",
    "lint",
    "load_pipeline",
    "normalize_label",
    "parse_condition",
    "parse_dot",
    "parse_pipeline",
    "select_edge",
    "validate",
]
