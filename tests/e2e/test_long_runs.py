"""A long run with real `delta` processes: the context budget leaves old turns out on record,
and the process that resumes sends the model what the one that paused did."""

from __future__ import annotations

import json
from pathlib import Path

from deltad.testing import FakeLLM, tool_call

from ..conftest import TOOLS, Delta, write_agent


def test_a_long_run_stays_in_budget_on_record_across_a_pause(tmp_path: Path, fake: FakeLLM) -> None:
    agent = write_agent(tmp_path, TOOLS, name="budgeted")
    config = agent / "config.yaml"
    config.write_text(
        config.read_text().replace(
            "model: fake-model\n", "model: fake-model\n  context_budget: 1000\n"
        )
    )
    ws = tmp_path / "ws"
    ws.mkdir()
    delta = Delta(ws, fake, agent)
    for i in range(12):
        fake.reply(None, tool_call("echo", {"text": f"output-{i:02d} " + "w" * 300}, id=f"e{i}"))
    fake.call("ask_human", {"prompt": "Go on?"}, id="ask").reply("finished")

    r = delta.start("a long task")
    assert r.code == 101, r.err
    before = [e for e in delta.events("SYSTEM_MESSAGE") if "context_cut" in e["payload"]]
    assert before, "no context cut was recorded"
    cut = before[-1]  # a run cuts again as it grows: the latest cut is the one in force
    asked = fake.requests[-1]["messages"]
    note = asked[2]["content"]
    assert note.startswith("[deltad] the ") and "echo x" in note
    sent = " ".join(str(m.get("content")) for m in asked)
    assert "output-00" not in sent and "output-11" in sent  # the oldest left out, the newest kept
    _matches_the_journal(delta, asked)
    kept_from = cut["payload"]["context_cut"]["through_seq"]
    thoughts = [e for e in delta.events("THOUGHT") if e["seq"] <= kept_from]
    assert cut["payload"]["context_cut"]["turns"] == len(thoughts) > 0

    # The paused process left a snapshot of its read of the journal; the next one starts there.
    journal = delta.run_dir / "execution" / "journal.jsonl"
    snapshot = json.loads((journal.parent / "snapshot.json").read_text())
    assert snapshot["journal_bytes"] == journal.stat().st_size
    assert 0 < snapshot["tail_offset"] < snapshot["journal_bytes"]  # the cut is in it

    delta.answer("yes")
    r = delta("run")
    assert r.code == 0, r.err
    [read] = [e for e in _engine_log(delta) if e.get("event") == "journal_read"]
    assert read["from_snapshot_bytes"] == snapshot["journal_bytes"]
    assert read["in_memory"] < read["next_seq"] / 2
    _matches_the_journal(delta, fake.requests[-1]["messages"])
    assert fake.requests[-1]["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "ask",
        "content": "yes",
    }


def _engine_log(delta: Delta) -> list[dict[str, object]]:
    lines = (delta.run_dir / "execution" / "engine.log").read_text().splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")]


def _matches_the_journal(delta: Delta, sent: list[dict[str, object]]) -> None:
    """What the last call sent is what the journal says: the latest recorded cut's note, then
    every turn after it (a resumed process decides from the journal alone, and records any new cut
    before the call)."""
    cut = [e for e in delta.events("SYSTEM_MESSAGE") if "context_cut" in e["payload"]][-1]
    through = cut["payload"]["context_cut"]["through_seq"]
    assert sent[2]["content"] == "[deltad] " + cut["payload"]["context_cut"]["note"]
    thoughts = delta.events("THOUGHT")[:-1]  # the last one is this call's own reply
    after = [e["payload"]["tool_calls"] for e in thoughts if e["seq"] > through]
    assert [m.get("tool_calls") for m in sent if m["role"] == "assistant"] == after
