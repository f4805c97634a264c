"""Every workspace is untrusted input: under `.delta/` no symlink is followed, nothing is read
unbounded, bad data is one line, a refused secret is not kept, and file modes follow the rule.
Each test is a real `delta` process against the fake model."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from deltad.testing import FakeLLM

from ..conftest import Delta

SECRET = "Tr0ub4dor&3-horse"


def _pause(delta: Delta, fake: FakeLLM, **args: object) -> Path:
    fake.call("ask_human", {"prompt": "Name?", **args}, id="q")
    fake.reply("done")
    assert delta.start().code == 101
    return delta.delta_dir / "interaction"


def _mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


# -- symlinks under .delta/ ------------------------------------------------------------------
def test_symlinked_mailbox_cannot_steal_another_workspaces_answer(
    tmp_path: Path, fake: FakeLLM, agent: Path
) -> None:
    victim = Delta(tmp_path / "victim", fake, agent)
    victim.ws.mkdir()
    thief = Delta(tmp_path / "thief", fake, agent)
    thief.ws.mkdir()
    fake.call("ask_human", {"prompt": "Name?"}, id="q")
    fake.call("ask_human", {"prompt": "Name?"}, id="q2")
    fake.reply("done").reply("done")
    assert victim.start().code == 101
    assert thief.start().code == 101
    box = victim.delta_dir / "interaction"
    (box / "response.txt").write_text("the victim's answer")
    # The attacker points its mailbox at the victim's and copies the victim's run.
    mine = thief.delta_dir / "interaction"
    for f in mine.iterdir():
        f.unlink()
    mine.rmdir()
    mine.symlink_to(box)
    r = thief("run")
    assert r.code == 2 and "symlink" in r.err and "Traceback" not in r.err
    assert len(r.err.strip().splitlines()) == 1
    # Nothing of the victim's was read, moved or deleted.
    assert (box / "response.txt").read_text() == "the victim's answer"
    assert (box / "request.json").exists()
    assert victim("run").code == 0
    assert fake.tool_results()["q"] == "the victim's answer"


@pytest.mark.parametrize(
    "link",
    ["execution/engine.log", "execution/journal.jsonl", "execution/metadata.json", "execution"],
)
def test_a_symlink_in_the_run_is_refused_and_its_target_untouched(
    delta: Delta, fake: FakeLLM, tmp_path: Path, link: str
) -> None:
    box = _pause(delta, fake)
    (box / "response.txt").write_text("Ada")
    outside = tmp_path / "outside"
    outside.mkdir()
    target = outside / "victim-file"
    target.write_text("precious\n")
    path = delta.run_dir / link
    if link == "execution":
        real = delta.run_dir / "execution.real"
        path.rename(real)
        path.symlink_to(real)
    else:
        path.unlink()
        path.symlink_to(target)
    r = delta("run")
    assert r.code == 2, r.err
    assert "symlink" in r.err and "Traceback" not in r.err
    assert target.read_text() == "precious\n"
    assert (box / "response.txt").exists()  # the answer is not lost


def test_symlinked_secrets_dir_is_not_written_through(
    delta: Delta, fake: FakeLLM, tmp_path: Path
) -> None:
    box = _pause(delta, fake, sensitive=True)
    outside = tmp_path / "loot"
    outside.mkdir()
    (delta.run_dir / "secrets").symlink_to(outside)
    (box / "response.txt").write_text(SECRET)
    r = delta("run")
    assert r.code == 2 and "symlink" in r.err
    assert list(outside.iterdir()) == []
    assert SECRET not in r.out + r.err


# -- bounded, non-blocking reads -------------------------------------------------------------
def test_fifo_in_place_of_the_journal_does_not_block(delta: Delta, fake: FakeLLM) -> None:
    box = _pause(delta, fake)
    (box / "response.txt").write_text("Ada")
    journal = delta.run_dir / "execution" / "journal.jsonl"
    journal.unlink()
    os.mkfifo(journal)
    r = delta("run", timeout=30)  # the deadline is the test: a blocking open would hang here
    assert r.code == 2 and "not a regular file" in r.err
    s = delta("status", timeout=30)
    assert "Traceback" not in s.err


def test_huge_refusal_note_is_not_read(delta: Delta, fake: FakeLLM) -> None:
    box = _pause(delta, fake)
    note = box / "response.rejected-29991231T000000000000.error"
    with open(note, "wb") as f:
        f.truncate(300 * 1024 * 1024)  # sparse: costs nothing on disk
    os.utime(note)
    r = delta("status", timeout=30)
    assert r.code == 0 and "Traceback" not in r.err
    assert len(r.out) < 10_000  # not put on the screen either


# -- bad data: one line, nothing lost ---------------------------------------------------------
@pytest.mark.parametrize(
    "answer",
    ['{"request_id": "R", "answer": "\\ud800"}', "[" * 100_000 + "]" * 100_000],
    ids=["lone_surrogate", "deep_nesting"],
)
def test_undecodable_structured_answer_is_set_aside(
    delta: Delta, fake: FakeLLM, answer: str
) -> None:
    box = _pause(delta, fake)
    rid = delta.request()["request_id"]
    (box / "response.json").write_text(answer.replace('"R"', json.dumps(rid)))
    r = delta("run")
    assert r.code == 101, r.err
    assert "answer not taken" in r.err and "Traceback" not in r.err
    assert not (box / "response.json").exists()
    assert list(box.glob("response.rejected-*.json"))
    (box / "response.txt").write_text("Ada")
    assert delta("run").code == 0
    assert fake.tool_results()["q"] == "Ada"


@pytest.mark.parametrize(
    "line",
    [
        {"type": "ACTION_RESULT", "payload": {}},
        {"type": "HUMAN_INTERACTION", "payload": {"phase": "answered", "request_id": "x"}},
        {"type": "THOUGHT", "payload": {"tool_calls": "nope"}},
    ],
    ids=["empty_result", "answered_without_reply", "bad_tool_calls"],
)
def test_hand_edited_journal_line_is_one_clear_error(
    delta: Delta, fake: FakeLLM, line: dict[str, object]
) -> None:
    _pause(delta, fake)
    journal = delta.run_dir / "execution" / "journal.jsonl"
    events = delta.journal()
    edited = {"seq": len(events) + 1, "timestamp": "2026-01-01T00:00:00Z", **line}
    with open(journal, "a") as f:
        f.write(json.dumps(edited) + "\n")
    r = delta("run")
    assert r.code == 2, r.err
    assert f"line {len(events) + 1}" in r.err and "Traceback" not in r.err
    assert len(r.err.strip().splitlines()) == 1
    assert delta.status() == "WAITING_FOR_INPUT"  # nothing was changed
    s = delta("status")
    assert s.code == 0 and "Traceback" not in s.err


def test_year_one_dates_are_read_not_crashed_on(delta: Delta, fake: FakeLLM) -> None:
    _pause(delta, fake, timeout_seconds=600)
    req_file = delta.delta_dir / "interaction" / "request.json"
    req = json.loads(req_file.read_text())
    req["expires_at"] = "0001-01-01T00:00:00"  # naive and ancient: read as UTC, long expired
    req_file.write_text(json.dumps(req))
    meta_file = delta.run_dir / "execution" / "metadata.json"
    meta = json.loads(meta_file.read_text())
    meta["start_time"] = "0001-01-01T00:00:00"
    meta_file.write_text(json.dumps(meta))
    s = delta("status")
    assert s.code == 0 and "Traceback" not in s.err, s.err
    assert "0001-01-01" in s.out
    r = delta("run")
    assert "Traceback" not in r.err


# -- secrets ----------------------------------------------------------------------------------
def test_refused_sensitive_answer_is_discarded_and_never_quoted(
    delta: Delta, fake: FakeLLM
) -> None:
    box = _pause(delta, fake, input_type="choice", options=["Red", "Blue"], sensitive=True)
    (box / "response.txt").write_text(SECRET)
    r = delta("run")
    assert r.code == 101
    assert "discarded" in r.err and SECRET not in r.out + r.err
    s = delta("status")
    assert "discarded" in s.out and SECRET not in s.out + s.err
    for p in delta.delta_dir.rglob("*"):
        if p.is_file():
            assert SECRET.encode() not in p.read_bytes(), p
    (box / "response.txt").write_text("b")
    assert delta("run").code == 0


# -- file modes ---------------------------------------------------------------------------------
@pytest.mark.parametrize("umask", [0o000, 0o022])
def test_everything_under_delta_is_private_whatever_the_umask(
    delta: Delta, fake: FakeLLM, umask: int
) -> None:
    fake.call("ask_human", {"prompt": "Name?"}, id="q")
    fake.call("echo", {"text": "hi"}, id="e")
    fake.reply("done")
    old = os.umask(umask)
    try:
        assert delta.start().code == 101
        assert delta("respond", "Ada").code == 0
        assert delta("run").code == 0
    finally:
        os.umask(old)
    seen = 0
    for p in [delta.delta_dir, *delta.delta_dir.rglob("*")]:
        want = 0o700 if p.is_dir() else 0o600
        assert _mode(p) == want, (p, oct(_mode(p)))
        seen += 1
    assert seen > 15


def test_a_shared_delta_dir_makes_group_files(delta: Delta, fake: FakeLLM) -> None:
    os.mkdir(delta.delta_dir)
    os.chmod(delta.delta_dir, 0o2770)
    fake.call("ask_human", {"prompt": "Password?", "input_type": "password"}, id="q")
    fake.reply("done")
    old = os.umask(0o077)
    try:
        assert delta.start().code == 101
        assert delta("respond", input=SECRET + "\n").code == 0
        box = delta.delta_dir / "interaction"
        assert _mode(box / "response.txt") == 0o660  # the service group may read it
        assert delta("run").code == 0
    finally:
        os.umask(old)
    for p in delta.delta_dir.rglob("*"):
        want = 0o2770 if p.is_dir() else 0o660
        assert _mode(p) == want, (p, oct(_mode(p)))
