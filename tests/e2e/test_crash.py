"""Crash safety with real processes: signals, kill -9, injected crashes, damaged journals, and
two drivers at once. Nothing waits on a clock: every wait is on a file or a process state."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from deltad.testing import FakeLLM

from ..conftest import TOOLS, Delta, wait_for, write_agent

# A tool that holds the workspace lock until the test says so: no sleeps, no races.
GATE_TOOLS = """
  - name: gate
    description: Wait until release.txt exists.
    shell: "echo started > started.txt; while [ ! -e release.txt ]; do sleep 0.05; done; echo ok"
"""


# -- helpers
def live_group_members(pgid: int) -> list[int]:
    """Pids of non-zombie processes in process group `pgid`. Scans /proc rather than
    `killpg(pgid, 0)`, which also succeeds for zombies nobody has reaped yet."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_bytes()
        except OSError:
            continue
        fields = raw[raw.rindex(b")") + 2 :].split()
        state, pgrp = fields[0], int(fields[2])
        if pgrp == pgid and state != b"Z":
            pids.append(int(entry.name))
    return pids


def tool_pid(delta: Delta, action_id: str) -> int:
    """The pid (= process group id) of a tool's shell, recorded while it runs."""
    info = delta.run_dir / "io" / "tool_executions" / action_id / "process.json"
    wait_for(info.exists, f"{info} to be written")
    return json.loads(info.read_text())["pid"]


def pump(stream: Any, buf: bytearray) -> None:
    """Copy a pipe into `buf` as bytes arrive (the prompt has no newline)."""
    while chunk := os.read(stream.fileno(), 4096):
        buf.extend(chunk)


def system_messages(delta: Delta) -> list[dict[str, Any]]:
    return [e["payload"] for e in delta.events("SYSTEM_MESSAGE")]


def tool_messages(request: dict[str, Any], action_id: str) -> list[str]:
    return [
        m["content"]
        for m in request["messages"]
        if m.get("role") == "tool" and m.get("tool_call_id") == action_id
    ]


def transitions(delta: Delta) -> list[tuple[str, str]]:
    """(from, to) of every status_transition in engine.log, in order."""
    out = []
    for line in (delta.run_dir / "execution" / "engine.log").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("event") == "status_transition":
            out.append((rec["from"], rec["to"]))
    return out


def mailbox_empty(delta: Delta) -> bool:
    box = delta.delta_dir / "interaction"
    return not (box / "request.json").exists() and not (box / "response.txt").exists()


def pause_on_question(delta: Delta, fake: FakeLLM, **question: Any) -> None:
    fake.call("ask_human", {"prompt": "Which database?", **question}, id="ask1")
    r = delta.start()
    assert r.code == 101, r.err
    assert delta.status() == "WAITING_FOR_INPUT"


# -- 1. SIGINT / SIGTERM during a long tool
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_during_tool_interrupts_then_resume_does_not_rerun(
    delta: Delta, fake: FakeLLM, sig: signal.Signals
) -> None:
    fake.call("slow", {"seconds": 60}, id="slow1").reply("all done")
    p = delta.popen("run", "--agent", str(delta.agent), "--task", "be slow")
    started = delta.ws / "started.txt"
    wait_for(started.exists, "the tool to start")
    pgid = tool_pid(delta, "slow1")
    assert live_group_members(pgid)

    p.send_signal(sig)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 130, err
    assert delta.status() == "INTERRUPTED"
    assert any("interrupted" in m["content"] for m in system_messages(delta))
    # The whole tool group was stopped: no shell, no `sleep 60`, and it never got to finish.
    assert live_group_members(pgid) == []
    assert not (delta.ws / "finished.txt").exists()
    assert "slow1" not in delta.results()

    started.unlink()  # a re-run of the command would recreate it
    r = delta("run")
    assert r.code == 0, r.err
    assert "all done" in r.out
    assert delta.status() == "COMPLETED"
    [result] = delta.results()["slow1"]
    assert result["status"] == "ERROR"
    assert "interrupted" in result["observation_content"]
    assert "not re-run" in result["observation_content"]
    assert not started.exists() and not (delta.ws / "finished.txt").exists()
    assert tool_messages(fake.requests[-1], "slow1") == [result["observation_content"]]
    assert fake.remaining == 0 and len(fake.requests) == 2


# -- 2. kill -9 during a tool
@pytest.mark.parametrize("sandboxed", [True, False])
def test_kill_9_during_tool_then_resume_cleans_up(
    delta: Delta, fake: FakeLLM, tmp_path: Path, sandboxed: bool
) -> None:
    """Sandboxed (engine/sandbox.py), the tool dies with `delta`; unsandboxed (no bwrap, the
    agent's choice), it is orphaned and the resume finds it and stops it."""
    env: dict[str, str] = {}
    if not sandboxed:  # a PATH without bwrap, and an agent that accepts that
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        for name in ("sh", "echo", "sleep"):
            (bin_dir / name).symlink_to(shutil.which(name) or name)
        env = {"PATH": str(bin_dir)}
        delta.agent = write_agent(tmp_path, TOOLS, "sandbox: {unavailable: unsandboxed}\n", "u")
    fake.call("slow", {"seconds": 60}, id="slow1").reply("all done")
    p = delta.popen("run", "--agent", str(delta.agent), "--task", "be slow", env=env)
    wait_for((delta.ws / "started.txt").exists, "the tool to start")
    pgid = tool_pid(delta, "slow1")
    dead_pid = delta.metadata()["owner"]["pid"]
    assert dead_pid == p.pid

    p.kill()
    p.communicate(timeout=30)
    assert p.returncode == -signal.SIGKILL
    # Nobody got to say anything: the disk still says RUNNING
    assert delta.status() == "RUNNING"
    if sandboxed:  # and nothing the tool started outlives `delta`
        wait_for(lambda: live_group_members(pgid) == [], "the sandbox to die with delta")
    else:  # and the tool is orphaned
        assert live_group_members(pgid), "the orphaned tool should still be running"
    r = delta("status", "--json")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["status"] == "RUNNING" and doc["owner_alive"] is False

    try:
        resume = delta.popen("run", env=env)
        out, err = resume.communicate(timeout=60)
        assert resume.returncode == 0, err
        assert "all done" in out
        assert delta.status() == "COMPLETED"
        assert delta.metadata()["owner"]["pid"] == resume.pid
        assert any(
            m["level"] == "WARN" and str(dead_pid) in m["content"] and "crash" in m["content"]
            for m in system_messages(delta)
        )
        trans = transitions(delta)
        i = trans.index(("RUNNING", "INTERRUPTED"))
        assert trans[i + 1] == ("INTERRUPTED", "RUNNING")
        assert trans[-1] == ("RUNNING", "COMPLETED")
        # The resume found the orphan by its recorded pid + start time and stopped it.
        assert live_group_members(pgid) == []
        assert not (delta.ws / "finished.txt").exists()
        [result] = delta.results()["slow1"]
        assert result["status"] == "ERROR"
        assert "interrupted" in result["observation_content"]
        stopped = "leftover process was stopped" in result["observation_content"]
        assert stopped is not sandboxed  # sandboxed: nothing was left to stop
        assert tool_messages(fake.requests[-1], "slow1") == [result["observation_content"]]
        assert fake.remaining == 0 and len(fake.requests) == 2
    finally:
        for pid in live_group_members(pgid):  # never leak a `sleep 60` past a failed test
            os.kill(pid, signal.SIGKILL)


# -- 3. a crash at every step of answer ingestion
@pytest.mark.parametrize(
    ("point", "sensitive"),
    [
        ("before_journal", False),
        ("after_journal", False),
        ("after_status", False),
        ("after_result", False),
        ("after_discard_answer", False),
        ("after_secret", True),
    ],
)
def test_crash_during_answer_ingestion_delivers_exactly_once(
    delta: Delta, fake: FakeLLM, point: str, sensitive: bool
) -> None:
    answer = "s3cr3t-Value" if sensitive else "production"
    pause_on_question(delta, fake, sensitive=sensitive)
    if sensitive:
        # The model uses the handle, proving the stored value survived the crash.
        fake.call("use_secret", {"value": "${secret:ask1}"}, id="use1")
    fake.reply("finished")
    delta.answer(answer + "\n")

    crashed = delta("run", env={"DELTA_FAULT": point})
    assert crashed.code == -signal.SIGKILL, (crashed.out, crashed.err)
    assert len(fake.requests) == 1  # every fault point comes before the next model call

    r = delta("run")
    assert r.code == 0, r.err
    assert "finished" in r.out
    assert delta.status() == "COMPLETED"
    [result] = delta.results()["ask1"]
    assert result["status"] == "SUCCESS"
    replies = [
        e["payload"]
        for e in delta.events("HUMAN_INTERACTION")
        if e["payload"].get("phase") == "answered" and e["payload"].get("action_id") == "ask1"
    ]
    assert len(replies) == 1  # the reply record, the commit point, was written once too
    seen = tool_messages(fake.requests[-1], "ask1")
    if sensitive:
        assert "${secret:ask1}" in result["observation_content"]
        assert seen == [result["observation_content"]]
        assert (delta.ws / "secret-seen.txt").read_text() == answer
        assert all(answer not in json.dumps(req) for req in fake.requests)
        assert answer not in (delta.run_dir / "execution" / "journal.jsonl").read_text()
        assert len(fake.requests) == 3
    else:
        assert result["observation_content"] == answer
        assert seen == [answer]
        assert len(fake.requests) == 2
    assert mailbox_empty(delta)
    assert fake.remaining == 0


# -- 4. a torn last journal line
def test_torn_journal_tail_is_set_aside_and_the_run_continues(delta: Delta, fake: FakeLLM) -> None:
    pause_on_question(delta, fake)
    fake.reply("finished")
    journal = delta.run_dir / "execution" / "journal.jsonl"
    torn = b'{"seq": 99, "timestamp": "2024-01-01T00:00:00Z", "type": "THOU'
    with journal.open("ab") as f:  # a crash mid-append: half a line, no newline
        f.write(torn)

    delta.answer("production")
    r = delta("run")
    assert r.code == 0, r.err
    assert delta.status() == "COMPLETED"
    assert any(m["level"] == "WARN" and "torn" in m["content"] for m in system_messages(delta))
    [kept] = journal.parent.glob("journal.jsonl.torn-*")
    assert kept.read_bytes() == torn
    raw = journal.read_bytes()
    assert raw.endswith(b"\n")
    events = [json.loads(line) for line in raw.decode().splitlines()]  # every line parses
    seqs = [e["seq"] for e in events]
    assert all(a < b for a, b in itertools.pairwise(seqs))
    assert [r["observation_content"] for r in delta.results()["ask1"]] == ["production"]
    assert fake.tool_results()["ask1"] == "production"


# -- 5. a journal reformatted by an editor
def test_pretty_printed_journal_is_refused_and_left_alone(delta: Delta, fake: FakeLLM) -> None:
    pause_on_question(delta, fake)
    journal = delta.run_dir / "execution" / "journal.jsonl"
    journal.write_text(json.dumps(delta.journal(), indent=2))
    before = journal.read_bytes()
    delta.answer("production")

    r = delta("run")
    assert r.code == 2, (r.out, r.err)
    assert "Traceback" not in r.err
    lines = r.err.strip().splitlines()
    assert len(lines) == 1, r.err
    assert "pretty-printed" in lines[0] or "reformatted" in lines[0]
    assert journal.read_bytes() == before
    assert delta.status() == "WAITING_FOR_INPUT"
    assert (delta.delta_dir / "interaction" / "response.txt").read_text() == "production"
    assert len(fake.requests) == 1


# -- 6. two drivers for one waiting run
def test_two_concurrent_resumes_one_wins(tmp_path: Path, fake: FakeLLM) -> None:
    delta = Delta(tmp_path / "ws", fake, write_agent(tmp_path, GATE_TOOLS))
    delta.ws.mkdir()
    pause_on_question(delta, fake)
    fake.call("gate", {}, id="gate1").reply("finished")
    delta.answer("production")

    procs = [delta.popen("run"), delta.popen("run")]
    try:
        # The winner cannot finish before release.txt exists, so the loser must exit first.
        loser = wait_for(
            lambda: next((p for p in procs if p.poll() is not None), None), "one run to exit"
        )
        _, err = loser.communicate()
        assert loser.returncode == 75, err
        assert "busy" in err and "Traceback" not in err
        (winner,) = [p for p in procs if p is not loser]
        wait_for((delta.ws / "started.txt").exists, "the winner to reach the gate")
        (delta.ws / "release.txt").touch()
        out, err = winner.communicate(timeout=60)
        assert winner.returncode == 0, err
        assert "finished" in out
    finally:
        (delta.ws / "release.txt").touch()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert delta.status() == "COMPLETED"
    results = delta.results()
    assert [r["observation_content"] for r in results["ask1"]] == ["production"]
    assert len(results["gate1"]) == 1
    assert len(tool_messages(fake.requests[-1], "ask1")) == 1
    assert fake.remaining == 0 and len(fake.requests) == 3
    assert mailbox_empty(delta)


# -- 7. a live owner keeps its run
def test_run_with_a_live_owner_is_busy(tmp_path: Path, fake: FakeLLM) -> None:
    delta = Delta(tmp_path / "ws", fake, write_agent(tmp_path, GATE_TOOLS))
    delta.ws.mkdir()
    fake.call("gate", {}, id="gate1").reply("finished")
    owner = delta.popen("run", "--agent", str(delta.agent), "--task", "hold the lock")
    try:
        wait_for((delta.ws / "started.txt").exists, "the owner to reach the gate")
        assert delta.status() == "RUNNING"
        doc = json.loads(delta("status", "--json").out)
        assert doc["owner_alive"] is True
        journal_before = (delta.run_dir / "execution" / "journal.jsonl").read_bytes()

        for args in (("run",), ("run", "--agent", str(delta.agent), "--task", "another")):
            r = delta(*args)
            assert r.code == 75, (args, r.out, r.err)
            assert "busy" in r.err and "Traceback" not in r.err
        # The losers changed nothing: same run, same journal, still RUNNING.
        assert delta.status() == "RUNNING"
        assert (delta.run_dir / "execution" / "journal.jsonl").read_bytes() == journal_before
        assert len(list((delta.delta_dir / "runs").glob("2*"))) == 1

        (delta.ws / "release.txt").touch()
        _, err = owner.communicate(timeout=60)
        assert owner.returncode == 0, err
    finally:
        (delta.ws / "release.txt").touch()
        if owner.poll() is None:
            owner.kill()
            owner.wait()
    assert delta.status() == "COMPLETED"
    assert fake.remaining == 0


# -- 8. -i interrupted while waiting on the terminal
def test_interactive_interrupted_at_the_prompt_asks_again_async(
    delta: Delta, fake: FakeLLM
) -> None:
    fake.call("ask_human", {"prompt": "Which database?"}, id="ask1").reply("finished")
    p = subprocess.Popen(
        delta.argv("run", "-i", "--agent", str(delta.agent), "--task", "ask me"),
        cwd=delta.ws,
        env=delta.env,
        stdin=subprocess.PIPE,  # kept open and never written: the read blocks
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    # Drain the output in threads: communicate() would close stdin, and EOF is an answer of
    # its own (-i then falls back to the mailbox).
    out, err = bytearray(), bytearray()
    pumps = [
        threading.Thread(target=pump, args=(stream, buf))
        for stream, buf in ((p.stdout, out), (p.stderr, err))
    ]
    for t in pumps:
        t.start()
    try:
        wait_for(lambda: b"Which database?" in out and out.endswith(b"> "), "the prompt")
        p.send_signal(signal.SIGINT)
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        for t in pumps:
            t.join(10)
        p.stdin.close()  # type: ignore[union-attr]
    assert p.returncode == 130, err.decode()
    assert delta.status() == "INTERRUPTED"
    assert "ask1" not in delta.results()
    assert not (delta.delta_dir / "interaction" / "request.json").exists()

    r = delta("run")
    assert r.code == 101, r.err
    assert delta.status() == "WAITING_FOR_INPUT"
    req = delta.request()
    assert req["action_id"] == "ask1" and req["prompt"] == "Which database?"
    assert "Which database?" in r.out

    delta.answer("production")
    r = delta("run")
    assert r.code == 0, r.err
    assert delta.status() == "COMPLETED"
    assert [r["observation_content"] for r in delta.results()["ask1"]] == ["production"]
    assert tool_messages(fake.requests[-1], "ask1") == ["production"]
    assert fake.remaining == 0 and len(fake.requests) == 2
    assert mailbox_empty(delta)


def test_respond_refuses_a_question_the_journal_already_answered(
    delta: Delta, fake: FakeLLM
) -> None:
    # A crash right after the reply was journaled leaves request.json behind for a moment;
    # a second answer then must not be accepted (the resume would silently drop it).
    pause_on_question(delta, fake)
    fake.reply("done")
    delta.answer("first")
    assert delta("run", env={"DELTA_FAULT": "after_journal"}).code == -signal.SIGKILL
    assert (delta.delta_dir / "interaction" / "request.json").exists()
    (delta.delta_dir / "interaction" / "response.txt").unlink(missing_ok=True)
    r = delta("respond", "second")
    assert r.code == 2 and "already answered" in r.err
    assert delta("run").code == 0
    assert fake.tool_results()["ask1"] == "first"


# -- 9. an event type this version does not know
@pytest.mark.parametrize("where", ["last", "before the question"])
def test_an_unknown_event_type_stops_the_resume_naming_the_line(
    delta: Delta, fake: FakeLLM, where: str
) -> None:
    pause_on_question(delta, fake)
    fake.reply("finished")
    journal = delta.run_dir / "execution" / "journal.jsonl"
    lines = journal.read_bytes().splitlines(keepends=True)
    at = len(lines) if where == "last" else 1  # after RUN_START: inside a snapshot's prefix
    unknown = b'{"seq":2,"timestamp":"2026-01-01T00:00:00Z","type":"HUMAN_NOTE","payload":{}}\n'
    journal.write_bytes(b"".join([*lines[:at], unknown, *lines[at:]]))
    before = journal.read_bytes()
    delta.answer("production")

    r = delta("run")
    assert r.code == 2, (r.out, r.err)
    assert "Traceback" not in r.err
    [line] = r.err.strip().splitlines()
    assert f"journal.jsonl:{at + 1}: unknown event type 'HUMAN_NOTE'" in line
    # Untouched: not asked again, the answer neither taken nor set aside, the model not called.
    assert journal.read_bytes() == before
    assert delta.status() == "WAITING_FOR_INPUT"
    assert (delta.delta_dir / "interaction" / "response.txt").read_text() == "production"
    assert not list((delta.delta_dir / "interaction").glob("response.stale-*"))
    assert len(fake.requests) == 1
