"""Orchestra-style agents (pipeline/orchestra.py) from tables: the system prompt composed
from the role, persona, personality and task files in that order, the model alias through
the provider's models table, and each refusal one line. In-process: prompt files come from a
dict (resolution) or a temporary directory (what is read beneath the config's directory)."""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

import pytest

from deltad.pipeline.load import check_pipeline
from deltad.pipeline.orchestra import (
    Given,
    OrchestraError,
    confined,
    parse_config,
    read_prompt,
    resolve,
)
from deltad.pipeline.problems import GraphError

CONFIG = Path("/cfg/orchestra.yaml")
FILES = {
    "r.yaml": "content: ROLE\n",
    "p.yaml": "content: |\n  PERSONA\n",
    "q.yaml": "content: QUIRKS\n",
    "t.yaml": "content: TASK\n",
    "list.yaml": "- not a mapping\n",
    "nocontent.yaml": "text: x\n",
    "bad.yaml": "content: [unclosed\n",
}
PROVIDERS = "providers: {default: main, main: {models: {smart: m-1}}, alt: {models: {fast: a-1}}}\n"


def _read(base: Path, relative: PurePosixPath) -> str:
    if str(relative) not in FILES:
        raise OrchestraError(f"{base / relative}: no such file")
    return FILES[str(relative)]


def _resolve(agent: str, providers: str = PROVIDERS) -> Given:
    return resolve(parse_config(f"{providers}agents: {{x: {agent}}}\n", CONFIG), "x", _read)


@pytest.mark.parametrize(
    ("agent", "prompt", "llm"),
    [
        # Orchestra's order, whatever the order written; a blank line between layers
        (
            "{task: t.yaml, personality: q.yaml, persona: p.yaml, role: r.yaml}",
            "ROLE\n\nPERSONA\n\nQUIRKS\n\nTASK",
            {"llm_provider": "main"},
        ),
        ("{task: t.yaml}", "TASK", {"llm_provider": "main"}),
        ("{role: r.yaml, model: smart}", "ROLE", {"llm_provider": "main", "llm_model": "m-1"}),
        (  # the entry's provider, not the default's
            "{role: r.yaml, provider: alt, model: fast}",
            "ROLE",
            {"llm_provider": "alt", "llm_model": "a-1"},
        ),
    ],
)
def test_an_agent_is_given_its_composed_prompt_and_model(
    agent: str, prompt: str, llm: dict[str, str]
) -> None:
    assert _resolve(agent) == Given(prompt, llm)


def test_without_a_provider_no_llm_provider_is_set() -> None:
    assert _resolve("{task: t.yaml}", providers="") == Given("TASK", {})


@pytest.mark.parametrize(
    ("agent", "why"),
    [
        ("{model: smart}", "agents.x composes an empty system prompt"),
        ("{task: nope.yaml}", "/cfg/nope.yaml: no such file"),
        ("{task: list.yaml}", "/cfg/list.yaml: must be a YAML mapping"),
        ("{task: nocontent.yaml}", "/cfg/nocontent.yaml: needs content: with the prompt text"),
        ("{task: bad.yaml}", "/cfg/bad.yaml:2:1: not valid YAML"),
        ("{task: t.yaml, model: genius}", "model alias 'genius' is not in providers.main.models"),
        ("{task: t.yaml, provider: alt, model: smart}", "not in providers.alt.models (fast)"),
        ("{task: ../t.yaml}", "'../t.yaml' must be a path inside /cfg"),
        ("{task: /etc/passwd}", "'/etc/passwd' must be a path inside /cfg"),
        ("{task: a/../../t.yaml}", "must be a path inside /cfg"),
        ("just-a-string", "agents.x must be a mapping"),
    ],
)
def test_a_refusal_is_one_line_naming_what(agent: str, why: str) -> None:
    with pytest.raises(OrchestraError) as e:
        _resolve(agent)
    assert why in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("text", "ignored"),
    [
        (PROVIDERS + "agents: {}\n", ()),
        ("backend: direct\ncxdb: {url: x}\n", ("backend", "cxdb")),
        ("agents: {a: {task: t.yaml, tools: [x]}}\n", ("agents.a.tools",)),
    ],
)
def test_keys_that_are_not_read_are_listed(text: str, ignored: tuple[str, ...]) -> None:
    assert parse_config(text, CONFIG).ignored == ignored


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("[1, 2]\n", "must be a YAML mapping"),
        ("agents: [a]\n", "agents: must be a mapping"),
        ("providers: 3\n", "providers: must be a mapping"),
        ("agents: {a: !!python/object:os.system x}\n", "not valid YAML"),  # safe_load only
    ],
)
def test_a_config_that_cannot_be_used_is_refused(text: str, why: str) -> None:
    with pytest.raises(OrchestraError, match=why):
        parse_config(text, CONFIG)


def test_confined_keeps_a_relative_path_as_written() -> None:
    assert confined(Path("/cfg"), "prompts/roles/r.yaml") == PurePosixPath("prompts/roles/r.yaml")


def test_a_prompt_is_read_without_following_a_symlink_on_the_way(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "r.yaml").write_text("content: SECRET\n")
    base = tmp_path / "cfg"
    (base / "prompts").mkdir(parents=True)
    (base / "prompts" / "r.yaml").write_text("content: ROLE\n")
    os.symlink(outside, base / "linked")
    os.symlink(outside / "r.yaml", base / "prompts" / "link.yaml")
    assert read_prompt(base, PurePosixPath("prompts/r.yaml")) == "content: ROLE\n"
    for relative in ("linked/r.yaml", "prompts/link.yaml"):
        with pytest.raises(OrchestraError, match="symlink"):
            read_prompt(base, PurePosixPath(relative))
    (base / "big.yaml").write_text("x" * (300 * 1024))
    with pytest.raises(OrchestraError, match="the limit is 262144"):
        read_prompt(base, PurePosixPath("big.yaml"))


DOT = (
    'digraph g { start [shape=Mdiamond]; exit [shape=Msquare]; a [agent="%s"]; start -> a -> exit }'
)


def test_the_directory_form_keeps_working_beside_an_orchestra_yaml(tmp_path: Path) -> None:
    (tmp_path / "orchestra.yaml").write_text("agents: {}\n")
    (tmp_path / "agents" / "dir").mkdir(parents=True)
    checked = check_pipeline(DOT % "agents/dir", "g.dot", tmp_path)
    assert checked.graph.orchestra == {} and checked.warnings == []
    assert checked.graph.nodes["a"].agent == tmp_path / "agents" / "dir"


def test_without_an_orchestra_yaml_a_name_is_an_agent_directory(tmp_path: Path) -> None:
    with pytest.raises(GraphError, match="E009 missing-agent"):
        check_pipeline(DOT % "analyst", "g.dot", tmp_path)


def test_a_name_in_the_table_is_resolved_when_the_graph_is_checked(tmp_path: Path) -> None:
    (tmp_path / "t.yaml").write_text("content: TASK\n")
    (tmp_path / "orchestra.yaml").write_text("agents: {analyst: {task: t.yaml}}\n")
    graph = check_pipeline(DOT % "analyst", "g.dot", tmp_path).graph
    assert graph.orchestra == {"a": Given("TASK", {})}


@pytest.mark.parametrize(
    ("config", "why"),
    [
        ("agents: [unclosed\n", "orchestra.yaml:2:1: not valid YAML [E012 orchestra-agent]"),
        ("- a list\n", "orchestra.yaml: must be a YAML mapping [E012 orchestra-agent]"),
        (None, "is a symlink; write a regular file instead [E012 orchestra-agent]"),
    ],
)
def test_an_orchestra_yaml_that_does_not_read_is_one_line(
    tmp_path: Path, config: str | None, why: str
) -> None:
    if config is None:
        (tmp_path / "elsewhere.yaml").write_text("agents: {}\n")
        os.symlink(tmp_path / "elsewhere.yaml", tmp_path / "orchestra.yaml")
    else:
        (tmp_path / "orchestra.yaml").write_text(config)
    with pytest.raises(GraphError) as e:
        check_pipeline(DOT % "analyst", "g.dot", tmp_path)
    [line] = [x for x in e.value.lines() if "E012" in x]
    assert line.startswith("g.dot: ") and line.endswith(why)
