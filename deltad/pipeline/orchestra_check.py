"""A graph's `agent="name"` nodes resolved from the orchestra.yaml beside it (orchestra.py),
each refusal one problem at the node's `agent` attribute."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from .model import Graph, Kind, Node
from .orchestra import Config, Given, OrchestraError, config_beside, load_config, read_prompt
from .orchestra import resolve as resolve_agent
from .problems import Code, Problem


def with_orchestra(graph: Graph, base_dir: Path) -> tuple[Graph, list[Problem]]:
    """The graph with what its orchestra-resolved nodes are given, and the problems found.
    Without an orchestra.yaml beside the DOT file nothing changes (agent directories)."""
    path = config_beside(base_dir)
    if path is None:
        return graph, []
    users = [n for n in graph.nodes.values() if n.kind == Kind.CODERGEN and "agent" in n.attrs]
    try:
        config = load_config(path)
    except OrchestraError as e:
        return graph, [Problem(str(e), code=Code.ORCHESTRA_AGENT)]
    problems = [
        Problem(f"{path}: {key} is ignored", code=Code.IGNORED_CONFIG) for key in config.ignored
    ]
    claimed: dict[str, Given | None] = {}
    for n in users:
        name = n.attrs["agent"]
        if name not in config.agents and (base_dir / name).is_dir():
            continue  # the directory form
        given, problem = _resolve(config, n, name)
        claimed[n.id] = given
        problems += [problem] if problem else []
    return replace(graph, orchestra=claimed), problems


def _resolve(config: Config, n: Node, name: str) -> tuple[Given | None, Problem | None]:
    if name not in config.agents:
        known = ", ".join(sorted(map(str, config.agents))) or "none"
        why = f"agent {name!r} is neither in {config.path} ({known}) nor a directory"
        return None, Problem(why, n.where("agent"), n.subject, code=Code.ORCHESTRA_AGENT)
    try:
        return resolve_agent(config, name, read_prompt), None
    except OrchestraError as e:
        why = f"agent {name!r}: {e}"
        return None, Problem(why, n.where("agent"), n.subject, code=Code.ORCHESTRA_AGENT)
