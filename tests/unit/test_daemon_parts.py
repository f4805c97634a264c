"""The daemon's decisions without a daemon: reconcile on temp dirs under a ManualClock, the
hint queue, the registry (the resume policy itself: test_decide.py)."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from deltad.clock import ManualClock
from deltad.core.reconcile import Action, State, inspect
from deltad.core.registry import Registry
from deltad.core.tenancy import Policy
from deltad.protocol import Workspace, load_metadata, save_metadata
from deltad.protocol.models import OwnerProcess
from deltad.protocol.states import RunStatus
from deltad.testing.stub import paused_workspace
from deltad.watch.hints import HintQueue, Why

POLICY = Policy()


def _answer(ws: Path, text: str) -> Path:
    p = ws / ".delta" / "interaction" / "response.txt"
    tmp = p.with_name(".tmp")
    tmp.write_text(text)
    os.replace(tmp, p)
    return p


def test_waiting_then_answered(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    paused_workspace(ws)
    clock = ManualClock(wall=__import__("time").time())
    v = inspect(ws, Why.CHECK, 1.0, POLICY, clock)
    assert (v.action, v.state) == (Action.NONE, State.WAITING)
    _answer(ws, "yes")
    v = inspect(ws, Why.ANSWER_CLOSED, 1.0, POLICY, clock)
    assert (v.action, v.state) == (Action.RESUME, State.ANSWERED)
    assert v.owner is not None and v.owner.uid == os.getuid()


def test_a_response_json_too_deep_to_parse_is_resumed_so_the_run_refuses_it(
    tmp_path: Path,
) -> None:
    """100,000 nested `[`: the daemon resumes it as any answer (the run sets it aside with an
    `.error` the owner reads), never fails on it as a workspace problem for ever."""
    ws = tmp_path / "ws"
    paused_workspace(ws)
    p = ws / ".delta" / "interaction" / "response.json"
    p.with_name(".tmp").write_text("[" * 100_000)
    os.replace(p.with_name(".tmp"), p)
    clock = ManualClock(wall=__import__("time").time())
    v = inspect(ws, Why.ANSWER_CLOSED, 1.0, POLICY, clock)
    assert (v.action, v.state, v.channel) == (Action.RESUME, State.ANSWERED, "other")


@pytest.mark.linux_only  # leases, /proc or the fork server (deltad/platform.py)
def test_an_answer_still_open_for_writing_is_looked_at_again_not_left_to_an_event(
    tmp_path: Path,
) -> None:
    """The kernel reports a writer's close before it stops counting the file as open for
    writing; the look that close brings may still see a writer (here: one that really is still
    open), and no later event will come. The verdict must bring its own second look."""
    ws = tmp_path / "ws"
    paused_workspace(ws)
    path = _answer(ws, "yes")
    clock = ManualClock(wall=__import__("time").time())
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)  # a writer that has not let go yet
    try:
        v = inspect(ws, Why.ANSWER_CLOSED, 1.0, POLICY, clock)
        assert (v.action, v.state) == (Action.NONE, State.WAITING)
        assert v.wake_at is not None and 0 < v.wake_at - clock.time() <= 0.1
        v = inspect(ws, Why.CHECK, 1.0, POLICY, clock)  # a sweep: patient, but not forever
        assert v.action is Action.NONE
        assert v.wake_at is not None and 0 < v.wake_at - clock.time() <= 1.0
    finally:
        os.close(fd)
    clock.advance(0.05)
    v = inspect(ws, Why.CHECK, 1.0, POLICY, clock)  # what the timer brings
    assert (v.action, v.state) == (Action.RESUME, State.ANSWERED)


def test_an_empty_answer_file_is_waited_on_never_resumed(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    paused_workspace(ws)
    _answer(ws, "")
    v = inspect(ws, Why.ANSWER_CLOSED, 1.0, POLICY)
    assert v.action is Action.NONE and v.problem and "empty" in v.problem


def test_a_deadline_is_acted_on_when_the_clock_reaches_it(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    paused_workspace(ws, expires_at=datetime(2030, 1, 1, tzinfo=UTC))
    deadline = 1893456000.0
    clock = ManualClock(wall=deadline - 10)
    v = inspect(ws, Why.CHECK, 1.0, POLICY, clock)
    assert v.action is Action.NONE and v.wake_at == deadline
    clock.advance(10)
    v = inspect(ws, Why.CHECK, 1.0, POLICY, clock)
    assert (v.action, v.state) == (Action.RESUME, State.EXPIRED)


def _post_copy(ws: Path, **changes: object) -> None:
    """request.json edited by hand; the journal's record of the question stays as asked."""
    req_path = ws / ".delta" / "interaction" / "request.json"
    req_path.write_text(json.dumps(json.loads(req_path.read_text()) | changes))


@pytest.mark.parametrize(
    ("posted", "problem"),
    [
        ({"expires_at": "0001-01-01T00:00:00"}, "says expires_at 0001-01-01T00:00:00Z"),
        ({"expires_at": "2026-01-01T00:00:00Z"}, "says expires_at 2026-01-01T00:00:00Z"),
        ({"expires_at": "2026-01-01T00:00:00Z", "request_id": "forged"}, "never asked"),
    ],
)
def test_an_expiry_the_journal_does_not_record_is_reported_not_resumed(
    tmp_path: Path, posted: dict[str, str], problem: str
) -> None:
    ws = tmp_path / "ws"
    paused_workspace(ws, expires_at=datetime(2030, 1, 1, tzinfo=UTC))
    _post_copy(ws, **posted)
    clock = ManualClock(wall=1893456000.0 - 10)  # past request.json's deadline, not the journal's
    v = inspect(ws, Why.CHECK, 1.0, POLICY, clock)
    assert (v.action, v.state) == (Action.NONE, State.WAITING)
    assert v.problem and problem in v.problem
    # It waits for the journal's deadline (a question it never asked has none), then resumes.
    assert v.wake_at == (None if "never" in problem else 1893456000.0)
    clock.advance(10)
    v = inspect(ws, Why.CHECK, 1.0, POLICY, clock)
    never = (Action.NONE, State.WAITING)
    assert (v.action, v.state) == (never if "never" in problem else (Action.RESUME, State.EXPIRED))


def test_a_dead_owner_is_to_be_marked_and_an_impossible_pid_is_dead(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    paused_workspace(ws)
    w = Workspace.at(ws)
    path = w.run(w.latest_run_id() or "").metadata
    meta = load_metadata(path)
    meta.status = RunStatus.RUNNING
    meta.owner = OwnerProcess(pid=2**31, hostname=os.uname().nodename)
    save_metadata(path, meta)
    v = inspect(ws, Why.CHECK, 1.0, POLICY)
    assert v.action is Action.MARK_INTERRUPTED


def test_unsafe_directories_are_refused(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    paused_workspace(ws)
    os.chmod(ws / ".delta" / "interaction", 0o777)
    v = inspect(ws, Why.CHECK, 1.0, POLICY)
    assert v.state is State.PROBLEM and "writable by everyone" in (v.problem or "")


def test_hints_are_deduplicated_and_merged(tmp_path: Path) -> None:
    q = HintQueue()
    q.put(tmp_path, Why.ANSWER_CREATED)
    q.put(tmp_path, Why.ANSWER_CLOSED)
    q.put(tmp_path / "other")
    first = q.pop()
    assert first is not None and first.why == Why.ANSWER_CREATED | Why.ANSWER_CLOSED
    assert len(q) == 1
    q.close()


def test_the_registry_reports_a_problem_once(tmp_path: Path) -> None:
    from deltad.core.reconcile import Verdict

    r = Registry()
    r.add(tmp_path)
    bad = Verdict(Action.NONE, State.PROBLEM, "r", RunStatus.WAITING_FOR_INPUT, problem="x")
    assert r.observe(tmp_path, bad) is True
    assert r.observe(tmp_path, bad) is False
    assert list(r.problems()) == [{"workspace": str(tmp_path), "problem": "x"}]


def test_the_registry_s_state_index_follows_every_change(tmp_path: Path) -> None:
    """counts/in_state/problems come from an index kept as beliefs change (the status file must
    not walk every workspace each second): it must always equal a walk over them."""
    from deltad.core.reconcile import Verdict

    def walked(r: Registry) -> dict[str, int]:
        out = {s.value: 0 for s in State if s is not State.GONE}
        for view in r.workspaces.values():
            out[view.state] += 1
        return out

    r = Registry()
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for ws in (a, b, c):
        r.add(ws)
    waiting = Verdict(Action.NONE, State.WAITING, "r", RunStatus.WAITING_FOR_INPUT)
    bad = Verdict(Action.NONE, State.PROBLEM, "r", RunStatus.WAITING_FOR_INPUT, problem="x")
    running = Verdict(Action.NONE, State.RUNNING, "r", RunStatus.RUNNING)
    steps = [(a, waiting), (b, bad), (c, running), (b, waiting), (a, bad), (c, waiting)]
    for ws, v in steps:
        r.observe(ws, v)
        assert r.counts() == walked(r)
        for s in State:
            assert set(r.in_state(s)) == {w for w, i in r.workspaces.items() if i.state == s}
        assert [p["workspace"] for p in r.problems()] == [
            str(w) for w in r.workspaces if r.problem(w)
        ]
    r.interrupted(c)
    assert list(r.in_state(State.INTERRUPTED)) == [c] and r.counts() == walked(r)
    r.drop(a)
    assert a not in set(r.in_state(State.PROBLEM)) and not list(r.problems())
    assert r.counts() == walked(r) and sum(r.counts().values()) == 2
    assert r.running() == []
