"""The context budget (deltad/engine/budget.py): what a long run sends the model is decided from
the journal, recorded in it, and the same after a resume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from deltad.agent import LLMSettings, load_agent
from deltad.engine import RunContext
from deltad.engine.budget import DEFAULT_WINDOW, budget_of, estimate, window_of
from deltad.engine.signals import InterruptGuard
from deltad.engine.think import messages
from deltad.protocol import (
    CorruptFile,
    EventType,
    Journal,
    read_journal,
)
from deltad.protocol.journal import horizon
from deltad.testing import ScriptedModel
from tests.unit.helpers import resumed, running_run

TOOLS: list[dict[str, Any]] = []


def _ctx(tmp_path: Path, llm: str = "") -> RunContext:
    home = tmp_path / "agent"
    home.mkdir()
    (home / "config.yaml").write_text(f"name: a\nllm:\n  model: fake-model\n{llm}tools: []\n")
    (home / "system_prompt.md").write_text("You are a test agent.\n")
    return running_run(tmp_path, load_agent(home), ScriptedModel(), "count the files")


def _turn(ctx: RunContext, i: int, output: str = "x" * 400) -> None:
    call = {
        "id": f"c{i}",
        "type": "function",
        "function": {"name": "list_files" if i % 2 else "count", "arguments": "{}"},
    }
    ctx.journal.append(EventType.THOUGHT, {"content": f"step {i}", "tool_calls": [call]})
    ctx.journal.append(
        EventType.ACTION_RESULT,
        {"action_id": f"c{i}", "status": "SUCCESS", "observation_content": f"{i}:{output}"},
    )


def _cuts(ctx: RunContext) -> list[dict[str, Any]]:
    return [
        e.payload["context_cut"]
        for e in ctx.journal.events
        if e.type == EventType.SYSTEM_MESSAGE and "context_cut" in e.payload
    ]


def _valid(msgs: list[dict[str, Any]]) -> None:
    """Every tool message answers a call of the assistant message before it."""
    open_calls: set[str] = set()
    for m in msgs:
        if m["role"] == "assistant":
            open_calls = {c["id"] for c in m.get("tool_calls", [])}
        elif m["role"] == "tool":
            assert m["tool_call_id"] in open_calls, m


def test_a_run_that_fits_sends_everything_and_records_no_cut(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    for i in range(5):
        _turn(ctx, i)
    msgs = messages(ctx, TOOLS)
    assert len(msgs) == 2 + 5 * 2 and not _cuts(ctx)


def test_older_turns_are_left_out_on_record_and_the_newest_kept(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path, "  context_budget: 2000\n")
    for i in range(40):
        _turn(ctx, i)
    msgs = messages(ctx, TOOLS)
    [cut] = _cuts(ctx)
    assert sum(estimate(m) for m in msgs) <= 2000
    assert cut["budget_tokens"] == 2000 and cut["kept_tokens"] <= 2000 * 0.75
    _valid(msgs)
    assert msgs[0]["role"] == "system" and msgs[1]["content"] == "count the files"
    assert msgs[2]["content"].startswith("[deltad] the ") and "list_files x" in msgs[2]["content"]
    assert msgs[-1]["content"].startswith("39:")  # the newest result is there
    kept = [m for m in msgs if m["role"] == "tool"]
    first_kept = int(kept[0]["content"].split(":")[0])
    assert cut["turns"] == first_kept  # turns 0..first_kept-1 were left out, and said so
    recorded = ctx.journal.events[-1]
    assert (
        recorded.type == EventType.SYSTEM_MESSAGE
        and "context budget" in recorded.payload["content"]
    )


def test_the_same_conversation_after_a_resume_and_no_new_cut_until_needed(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path, "  context_budget: 2000\n")
    for i in range(40):
        _turn(ctx, i)
    first = messages(ctx, TOOLS)
    assert messages(ctx, TOOLS) == first and len(_cuts(ctx)) == 1  # the cut is reused
    again = resumed(ctx)
    assert messages(again, TOOLS) == first and len(_cuts(again)) == 1
    _turn(again, 40)
    after_one = messages(again, TOOLS)
    assert len(_cuts(again)) == 1 and after_one[:-2] == first  # a refill margin: no new cut
    for i in range(41, 60):
        _turn(again, i)
    later = messages(again, TOOLS)
    cuts = _cuts(again)
    assert len(cuts) == 2 and cuts[1]["through_seq"] > cuts[0]["through_seq"]
    assert cuts[1]["turns"] > cuts[0]["turns"]
    _valid(later)


def test_one_turn_larger_than_the_budget_is_still_sent(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path, "  context_budget: 100\n")
    _turn(ctx, 0, "y" * 4000)
    msgs = messages(ctx, TOOLS)
    assert msgs[-1]["content"].startswith("0:") and not _cuts(ctx)


def test_the_budget_comes_from_the_window() -> None:
    assert window_of(LLMSettings(model="gpt-4o-mini")) == 128_000
    assert window_of(LLMSettings(model="openai/gpt-4.1-nano")) == 1_047_576
    assert window_of(LLMSettings(model="llama3:8b")) == DEFAULT_WINDOW
    assert window_of(LLMSettings(model="llama3:8b", context_window=8192)) == 8192
    s = LLMSettings(model="llama3:8b", context_window=8192, max_tokens=1000)
    assert budget_of(s, []) == 8192 - 1000 - estimate([])
    assert budget_of(LLMSettings(model="x", context_budget=500), [{"big": "y" * 999}]) == 500


def test_a_resumed_journal_keeps_in_memory_only_what_a_call_can_still_send(
    tmp_path: Path,
) -> None:
    ctx = _ctx(tmp_path, "  context_budget: 2000\n")
    for i in range(40):
        _turn(ctx, i)
    sent = messages(ctx, TOOLS)
    [cut] = _cuts(ctx)
    total = len(ctx.journal.events)
    again = Journal(ctx.paths.journal)
    assert again.history.count == total  # the read model saw every event
    assert again.next_seq == total + 1
    assert min(e.seq for e in again.events) == cut["through_seq"] + 1
    assert len(again.events) < total / 2
    assert read_journal(ctx.paths.journal).events == ctx.journal.events  # the full read is whole
    from_disk = RunContext(
        ctx.ws, ctx.paths, ctx.meta, again, ctx.agent, ctx.model, InterruptGuard(), print
    )
    assert messages(from_disk, TOOLS) == sent


def test_the_horizon_is_the_latest_cut_record_and_nothing_else(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path, "  context_budget: 2000\n")
    for i in range(40):
        _turn(ctx, i)
    messages(ctx, TOOLS)
    [cut] = _cuts(ctx)
    ctx.journal.append(
        EventType.ACTION_REQUEST,
        {"action_id": "x", "tool_name": "t", "tool_args": {"context_cut": {"through_seq": 10**6}}},
    )
    ctx.journal.append(
        EventType.ACTION_RESULT,
        {"action_id": "x", "status": "SUCCESS", "observation_content": '"context_cut":{}'},
    )
    data = ctx.paths.journal.read_bytes()
    through, at = horizon(data)
    assert through == cut["through_seq"] and b'"context_cut"' in data[at:].split(b"\n", 1)[0]
    assert horizon(b"") == (0, 0)


def test_a_line_edited_before_the_cut_is_still_one_clear_error(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path, "  context_budget: 2000\n")
    for i in range(40):
        _turn(ctx, i)
    messages(ctx, TOOLS)
    lines = ctx.paths.journal.read_text().splitlines()
    damaged = [line.replace('"action_id":"c1"', '"action":"c1"') for line in lines]
    assert damaged != lines
    ctx.paths.journal.write_text("\n".join(damaged) + "\n")
    with pytest.raises(CorruptFile, match=r"line \d+ \(ACTION_RESULT\): action_id: Field required"):
        Journal(ctx.paths.journal)


def test_a_context_cut_never_drops_where_a_pipeline_stands(tmp_path: Path) -> None:
    """A resumed journal keeps only what follows its latest cut, except a pipeline's steps:
    the runner replays them to know which nodes are done (pipeline/state.py)."""
    from deltad.engine.budget import Cut
    from deltad.pipeline.state import replay
    from deltad.protocol import EventType
    from deltad.protocol.journal import Journal, read_journal

    path = tmp_path / "journal.jsonl"
    j = Journal(path)
    j.append(EventType.NODE_START, {"node": "plan", "kind": "codergen", "prompt": "Plan it"})
    j.append(EventType.THOUGHT, {"content": "the plan"})
    j.append(EventType.NODE_OUTCOME, {"node": "plan", "status": "success"})
    j.append(EventType.EDGE_TAKEN, {"source": "plan", "target": "build", "step": "weight"})
    j.append(EventType.NODE_START, {"node": "build", "kind": "codergen", "prompt": "Build it"})
    for i in range(5):
        j.append(EventType.THOUGHT, {"content": f"step {i}"})
    through = j.next_seq - 2
    j.append(EventType.SYSTEM_MESSAGE, Cut(through, 4, {}, "4 turns left out").payload(100, 50))
    j.append(EventType.THOUGHT, {"content": "last step"})

    again = Journal(path)
    kept = [e.type for e in again.events]
    assert kept.count(EventType.NODE_START) == 2 and EventType.EDGE_TAKEN in kept
    assert [e.payload["content"] for e in again.events if e.type == EventType.THOUGHT] == [
        "step 4",
        "last step",
    ]
    assert replay(again.events, "start") == replay(read_journal(path).events, "start")
