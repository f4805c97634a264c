"""A pipeline as a run's configuration: checked before a run starts, copied into the run, and
read back from that copy on every resume (editing the original changes no run in flight)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from deltad.agent import Agent
from deltad.engine.llm import provider_endpoint
from deltad.errors import LLMError, UsageError, UsageErrors
from deltad.protocol import RunMetadata, RunPaths
from deltad.protocol.errors import ProtocolError
from deltad.protocol.fsio import atomic_write, read_regular_text

from .llmnode import asks_model, given_settings
from .load import MAX_DOT_BYTES, check_pipeline, parse_pipeline, read_dot
from .model import Graph
from .problems import GraphError

COPY_NAME = "pipeline.dot"


def refused(e: GraphError) -> UsageError:
    """Every problem of the graph, one `delta: error:` line each (exit 2)."""
    return UsageErrors(list(e.lines()))


def load_new(path: Path, err: TextIO | None = None) -> tuple[Graph, str]:
    """The graph in `path` and its text, or UsageError listing every problem. Its warnings go
    to `err` here, once, as the run starts (a resume reads the copy and says nothing)."""
    try:
        text = read_dot(path)
        checked = check_pipeline(text, str(path), path.resolve().parent)
    except GraphError as e:
        raise refused(e) from None
    for line in checked.warning_lines():
        print(f"delta: warning: {line}", file=err)
    return checked.graph, text


def goal_of(graph: Graph, task: str | None) -> str:
    """What `$goal` means in this run: --task when given, else the graph's goal."""
    return task or graph.goal or f"run the pipeline {graph.name or ''}".strip()


def node_agents(graph: Graph) -> list[Path]:
    return sorted(
        {
            n.agent
            for n in graph.nodes.values()
            if n.agent is not None and n.id not in graph.orchestra
        }
    )


def check_providers(graph: Graph, run_agent: Agent, agents: Mapping[Path, Agent]) -> None:
    """Every model-calling node's `llm_provider` (its own, or from the stylesheet) must be one
    of its agent's `providers`, its key variable set: else one line, before the run starts."""
    for n in (n for n in graph.nodes.values() if asks_model(n)):
        name = given_settings(graph, n).get("llm_provider")
        if name is None:
            continue
        agent = agents.get(n.agent, run_agent) if n.agent is not None else run_agent
        provider = agent.config.providers.get(name)
        if provider is None:
            known = ", ".join(sorted(agent.config.providers)) or "none"
            raise UsageError(
                f"node {n.id}: llm_provider {name!r} is not one of the providers in "
                f"{agent.config_file} ({known}); add it under providers: with its base_url"
            )
        try:
            provider_endpoint(name, provider)
        except LLMError as e:
            raise UsageError(f"node {n.id}: {e}") from None


def save_copy(paths: RunPaths, text: str) -> None:
    atomic_write(paths.configuration / COPY_NAME, text.encode("utf-8"))


def load_for_run(paths: RunPaths, meta: RunMetadata) -> Graph:
    """The graph a run was started with (its copy); `agent` paths stay relative to the
    original file's directory."""
    assert meta.pipeline is not None
    copy = paths.configuration / COPY_NAME
    try:
        text = read_regular_text(copy, MAX_DOT_BYTES)  # under .delta/: no symlink followed
    except (OSError, ProtocolError) as e:
        raise UsageError(f"cannot read the run's pipeline {copy}: {e}") from None
    try:  # a manager's child is read from its own copy, made when it starts (driver.py)
        return parse_pipeline(text, str(copy), Path(meta.pipeline).parent, child=False)
    except GraphError as e:
        raise refused(e) from None
