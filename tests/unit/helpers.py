"""Small builders shared by the unit tests: runs on disk, graphs, and pipeline runs driven
in-process."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from deltad.agent import Agent, load_agent
from deltad.engine import Outcome as RunOutcome
from deltad.engine import RunContext
from deltad.engine.interviewers import Interviewer
from deltad.engine.llm import ChatModel
from deltad.engine.signals import InterruptGuard
from deltad.pipeline import Graph, GraphError, build_graph, parse_dot, parse_pipeline
from deltad.pipeline.driver import PipelineEngine
from deltad.pipeline.problems import Problem
from deltad.protocol import (
    Journal,
    Workspace,
    new_metadata,
    new_run_id,
    save_metadata,
)
from deltad.testing import ScriptedModel

from ..conftest import write_agent


def running_run(
    tmp: Path, agent: Agent, model: ChatModel, task: str, *, pipeline: str | None = None
) -> RunContext:
    """A run RUNNING in `tmp`/ws, as `delta run` leaves it before its first step."""
    (tmp / "ws").mkdir(parents=True)
    ws = Workspace.at(tmp / "ws")
    run_id = new_run_id()
    paths = ws.run(run_id)
    meta = new_metadata(run_id, task, str(agent.home), pipeline=pipeline)
    save_metadata(paths.metadata, meta)
    ws.set_latest(run_id)
    journal = Journal(paths.journal)
    return RunContext(ws, paths, meta, journal, agent, model, InterruptGuard(), print)


def resumed(ctx: RunContext) -> RunContext:
    """A new process picking the run up from disk (from the snapshot the runner leaves when
    a process lets go of a run, protocol/snapshot.py)."""
    ctx.journal.snapshot()
    journal = Journal(ctx.paths.journal)
    return RunContext(
        ctx.ws,
        ctx.paths,
        ctx.meta,
        journal,
        ctx.agent,
        ctx.model,
        InterruptGuard(),
        print,
        ctx.hooks,
    )


def graph_of(body: str, *, header: str = "digraph t {") -> Graph:
    """A graph that must be valid: `body` goes inside the digraph."""
    return parse_pipeline(f"{header}\n{textwrap.dedent(body)}\n}}", "t.dot", check_files=False)


def raw_graph(body: str) -> Graph:
    """The typed graph without validation (to test pieces of an invalid one)."""
    graph, _ = build_graph(parse_dot(f"digraph t {{\n{textwrap.dedent(body)}\n}}"))
    return graph


def problems_of(text: str) -> list[str]:
    """Every problem line for a whole DOT text; fails if the graph is accepted."""
    try:
        parse_pipeline(textwrap.dedent(text), "t.dot", check_files=False)
    except GraphError as e:
        return e.lines()
    raise AssertionError("the graph was accepted")


def problems_in(body: str) -> list[str]:
    return problems_of(f"digraph t {{\n{textwrap.dedent(body)}\n}}")


def only(problems: list[str], needle: str) -> str:
    found = [p for p in problems if needle in p]
    assert len(found) == 1, f"{needle!r} in {problems}"
    return found[0]


# -- pipeline runs in-process (test_pipeline_run.py, the runner's fuzz) -------------------------
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "pipelines"


def pipeline_graph(text: str) -> Graph:
    return parse_pipeline(textwrap.dedent(text), "t.dot", check_files=False)


def example(name: str) -> Graph:
    return pipeline_graph((EXAMPLES / name).read_text())


ECHO = '[{name: echo, exec: "echo ${text}"}]'
DEPLOY = '[{name: deploy, shell: "echo deployed > deployed.txt", approval: required}]'


class Run:
    """A pipeline run on disk, driven in-process; `resume()` is a new process."""

    def __init__(
        self, tmp: Path, graph: Graph, model: ScriptedModel, tools: str = ECHO, extra: str = ""
    ) -> None:
        self.graph, self.model = graph, model
        self.agent = load_agent(write_agent(tmp, tools, extra))
        ctx = running_run(tmp, self.agent, model, graph.goal or "the goal", pipeline="t.dot")
        self.ws, self.paths, self.meta, self.journal = ctx.ws, ctx.paths, ctx.meta, ctx.journal
        self.loaded = []
        self.slept: list[float] = []

    def drive(self, interviewer: Interviewer) -> RunOutcome:
        ctx = RunContext(
            self.ws,
            self.paths,
            self.meta,
            self.journal,
            self.agent,
            self.model,
            InterruptGuard(),
            print,
        )
        engine = PipelineEngine(ctx, interviewer, self.graph, self._agents)
        engine.sleep = self.slept.append  # a retry's backoff is recorded, not waited out
        return engine.drive()

    def _agents(self, home: Path) -> Any:
        self.loaded.append(home)
        return self.other

    loaded: list[Path]
    other: tuple[Any, ScriptedModel]

    def resume(self, interviewer: Interviewer) -> RunOutcome:
        self.journal = Journal(self.paths.journal)  # read from disk, as a new process does
        return self.drive(interviewer)

    # -- what the journal says -------------------------------------------------------------
    def events(self, type_: str) -> list[dict[str, Any]]:
        return [e.payload for e in Journal(self.paths.journal).events if e.type == type_]

    def path(self) -> list[str]:
        return [p["node"] for p in self.events("NODE_START")]

    def outcome(self, node: str) -> dict[str, Any]:
        return [p for p in self.events("NODE_OUTCOME") if p["node"] == node][-1]

    def asked(self) -> list[dict[str, Any]]:
        return [p["request"] for p in self.events("HUMAN_INTERACTION") if p["phase"] == "asked"]

    def prompts(self) -> list[str]:
        """The user message each model call began with."""
        return [str(call[1]["content"]) for call in self.model.calls]


__all__ = [
    "DEPLOY",
    "ECHO",
    "EXAMPLES",
    "Problem",
    "Run",
    "example",
    "graph_of",
    "only",
    "pipeline_graph",
    "problems_in",
    "problems_of",
    "raw_graph",
]
