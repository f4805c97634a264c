"""Warnings: what a graph says that this runner does not carry out. The graph still runs (each is
a `W` code; `--strict` refuses them): an attribute of the attractor spec this runner ignores
(W001), an attribute nobody defines (W002, likely a typo), a node only mentioned in edges
(W003, it runs with default attributes), a goal gate with nowhere to go back to (W004), an LLM
node with neither prompt nor label (W007, spec §7.2 `prompt_on_llm_nodes`), prompt text in a
template convention the spec does not have (W008: `$context.x`, `$name`, `@file`; only `$goal`
is expanded, spec §9). (W005 is retired: an LLM node's own question in a parallel branch pauses
only its branch.)

Pure and linear: one pass over nodes, edges and their attributes. An attribute set by a
`node [...]`/`edge [...]` default is reported once, at the default, not once per node; a
`timeout` default says nothing on the nodes it cannot apply to (start, exit, diamond, ...).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Iterator, Mapping
from functools import cache

from .manager import actions_of
from .model import Graph, Kind, Node
from .problems import Code, Pos, Problem

# What this runner reads (docs/pipelines.md).
GRAPH_ATTRS = frozenset(
    {"goal", "label", "default_max_retries", "default_max_retry", "retry_target"}
    | {"fallback_retry_target", "max_steps", "model_stylesheet", "default_fidelity"}
    | {"thread_id", "llm_model", "llm_provider", "reasoning_effort", "temperature"}
    | {"stack.child_dotfile"}
)
NODE_ATTRS = frozenset(
    {"label", "shape", "type", "prompt", "max_retries", "timeout", "human.default_choice"}
    | {"agent.mode", "agent", "tool_command", "goal_gate", "retry_target"}
    | {"fallback_retry_target", "respondents", "allow_partial", "join_policy"}
    | {"approvals_required"}
    | {"llm_model", "llm_provider", "reasoning_effort", "temperature", "class", "fidelity"}
    | {"thread_id", "max_parallel", "auto_status", "error_policy"}
    | {"manager.max_cycles", "manager.stop_condition", "manager.actions"}
)
EDGE_ATTRS = frozenset({"label", "condition", "weight", "fidelity", "thread_id", "loop_restart"})
# Graphviz drawing attributes: they change how a graph looks, never what it does.
DRAWING = frozenset(
    {"rankdir", "color", "fillcolor", "fontcolor", "fontname", "fontsize", "style", "penwidth"}
    | {"bgcolor", "labelloc", "labeljust", "splines", "nodesep", "ranksep", "margin", "pad"}
    | {"width", "height", "fixedsize", "tooltip", "xlabel", "peripheries", "arrowhead"}
    | {"arrowtail", "arrowsize", "dir", "constraint", "compound", "concentrate", "newrank"}
    | {"ordering", "size", "ratio", "group", "rank", "minlen", "headport", "tailport"}
)
_CHILD = "the child pipeline runs in this run, node by node"
_HOOKS = "tool approvals and hooks come from the agent directory"
# Attributes the attractor spec defines and this runner does not carry out: why, by section.
SPEC_IGNORED: Mapping[str, Mapping[str, str]] = {
    "graph": {
        "stack.child_workdir": f"§4.11: {_CHILD}, in the run's workspace",
        "tool_hooks.pre": f"§9.7: {_HOOKS}",
        "tool_hooks.post": f"§9.7: {_HOOKS}",
    },
    "node": {
        "manager.poll_interval": f"§4.11: {_CHILD}; the manager observes after each one",
        "stack.child_autostart": f"§4.11: {_CHILD}; the manager always starts it",
        "tool_hooks.pre": f"§9.7: {_HOOKS}",
        "tool_hooks.post": f"§9.7: {_HOOKS}",
    },
    "edge": {},
}
STEER = (
    "manager.actions steer is ignored by this runner (attractor spec §4.11 leaves what a "
    "steer writes to the implementation; this manager observes and judges only)"
)
_W001 = Code.IGNORED_ATTRIBUTE
# `timeout` is carried out on these kinds only.
TIMEOUT_KINDS = (Kind.WAIT_HUMAN, Kind.TOOL, Kind.CODERGEN)
NO_TIMEOUT = "timeout has no effect here: only a gate's, a tool's and an LLM node's are enforced"
# §4.8 (spec 1.0): branches here run one at a time and every result is collected: `continue`.
ERROR_POLICY_DONE = "continue"
NO_ERROR_POLICY = (
    "error_policy {value!r} is ignored by this runner (attractor spec 1.0 §4.8; its 2026-03 "
    "revision drops the attribute): branches run one at a time and every branch's result is "
    "collected, as error_policy=continue does"
)
NO_PROMPT = (
    "an LLM node with neither prompt nor label (attractor spec §7.2 prompt_on_llm_nodes): the "
    "model is asked the node id {id!r}"
)
# Template conventions of other runners: `$context.key`, `$name` (not `$goal`), `@path/file`.
_TEMPLATE = re.compile(r"\$(?!goal\b)[A-Za-z_][\w.]*|(?:(?<=\s)|^)@[\w.-]*[/.][\w./-]+")
NO_TEMPLATE = (
    "prompt text {found!r} reaches the model as written: only $goal is expanded (attractor "
    "spec §9 variable expansion)"
)


_KNOWN = {"graph": GRAPH_ATTRS, "node": NODE_ATTRS, "edge": EDGE_ATTRS}


@cache
def _typo_hint(key: str, what: str) -> str:
    """The closest attribute name this runner or the spec knows, when one is close."""
    close = difflib.get_close_matches(key, sorted(_KNOWN[what] | SPEC_IGNORED[what].keys()), n=1)
    return f": did you mean {close[0]}?" if close else " (a typo?)"


def attr_warning(what: str, key: str, kind: Kind | None = None) -> tuple[Code, str] | None:
    """The warning for attribute `key` on a graph, node (of `kind`) or edge; None when it is
    carried out or only draws."""
    if why := SPEC_IGNORED[what].get(key):
        return Code.IGNORED_ATTRIBUTE, f"{key} is ignored by this runner (attractor spec {why})"
    if key == "timeout" and kind is not None and kind not in TIMEOUT_KINDS:
        # one message for every kind: a `node [timeout=...]` default then warns once
        return Code.IGNORED_ATTRIBUTE, NO_TIMEOUT
    if key in _KNOWN[what] or key in DRAWING or (key == "command" and kind == Kind.TOOL):
        return None  # `command` on a tool node is an error already (E008)
    return (
        Code.UNKNOWN_ATTRIBUTE,
        f"unknown attribute {key!r}: it has no effect{_typo_hint(key, what)}",
    )


def _attr_problems(
    what: str, subject: str, attrs: Iterable[str], where: Mapping[str, Pos], kind: Kind | None
) -> Iterator[Problem]:
    for key in attrs:
        if found := attr_warning(what, key, kind):
            code, message = found
            yield Problem(message, where.get(key), subject, code=code)


def _edge_only(n: Node) -> Problem:
    return Problem(
        f"never declared, only mentioned in edges: it runs as a {n.kind} node with "
        f'default attributes; declare it (e.g. {n.id} [shape=box, prompt="..."]) or fix the '
        "name",
        n.pos,
        n.subject,
        code=Code.EDGE_ONLY_NODE,
    )


def _goal_gate_without_retry(graph: Graph, n: Node) -> Problem | None:
    """Spec §7.2 goal_gate_has_retry: without a target, an unmet goal gate fails the run."""
    targets = (n.retry_target, n.fallback_retry_target, graph.retry_target)
    if not n.goal_gate or any(targets) or graph.fallback_retry_target:
        return None
    return Problem(
        "goal_gate=true without a retry_target (node or graph): if the node has not succeeded "
        "when the run reaches the exit, the run fails",
        n.where("goal_gate"),
        n.subject,
        code=Code.GOAL_GATE_NO_RETRY,
    )


def _once_per_default(problems: Iterable[Problem]) -> list[Problem]:
    """One warning per place an attribute was written: a default block's attribute would
    otherwise warn once for every node it applies to."""
    first: dict[tuple[Code, str, Pos | None], Problem] = {}
    count: dict[tuple[Code, str, Pos | None], int] = {}
    for p in problems:
        key = (p.code, p.message, p.pos)
        first.setdefault(key, p)
        count[key] = count.get(key, 0) + 1
    return [
        p
        if count[k] == 1
        else Problem(p.message, p.pos, f"{p.subject} and {count[k] - 1} more", code=p.code)
        for k, p in first.items()
    ]


def _node_attrs(n: Node) -> list[str]:
    """The node's attributes that can warn: a `timeout` from a `node [...]` default is meant for
    the nodes that have one, so it says nothing on the others (start, exit, diamond, ...)."""
    return [
        k
        for k in n.attrs
        if not (k == "timeout" and k not in n.own_attrs and n.kind not in TIMEOUT_KINDS)
    ]


def _error_policy(n: Node) -> Problem | None:
    value = n.attrs.get("error_policy")
    if value is None or value.strip() == ERROR_POLICY_DONE:
        return None
    message = NO_ERROR_POLICY.format(value=value[:30])
    return Problem(message, n.where("error_policy"), n.subject, code=_W001)


def _prompt_problems(n: Node) -> Iterator[Problem]:
    if n.kind != Kind.CODERGEN:
        return
    said = ("prompt", "label", "agent")  # an agent's own task file is a prompt too
    if n.declared and not any(n.attrs.get(k, "").strip() for k in said):
        code = Code.PROMPT_ON_LLM_NODE
        yield Problem(NO_PROMPT.format(id=n.id), n.pos, n.subject, code=code)
    for key in ("prompt", "label"):
        for m in dict.fromkeys(f.rstrip(".") for f in _TEMPLATE.findall(n.attrs.get(key, ""))):
            message = NO_TEMPLATE.format(found=m[:60])
            yield Problem(message, n.where(key), n.subject, code=Code.PROMPT_TEMPLATE)
        if n.attrs.get("prompt", "").strip():
            return  # the label is the prompt only when there is none (§2.6)


def lint(graph: Graph) -> list[Problem]:
    """Every warning of the graph (none refuses it)."""
    found = list(_attr_problems("graph", "graph", graph.attrs, graph.attr_pos, None))
    for n in graph.nodes.values():
        if not n.declared:
            found.append(_edge_only(n))
        found += _attr_problems("node", n.subject, _node_attrs(n), n.attr_pos, n.kind)
        if policy := _error_policy(n):
            found.append(policy)
        found += _prompt_problems(n)
        if goal := _goal_gate_without_retry(graph, n):
            found.append(goal)
        if n.kind == Kind.MANAGER and "steer" in actions_of(n):
            found.append(Problem(STEER, n.where("manager.actions"), n.subject, code=_W001))
    for e in graph.edges:
        found += _attr_problems("edge", e.subject, e.attrs, e.attr_pos, None)
    return _once_per_default(found)
