"""A look reads a workspace's files one after another; another process may write between two
of those reads. Here a person breaks a state file and then answers exactly between the look's
read of the state files and its read of the answer (the interleaving behind a flaky failure of
tests/e2e/test_daemon_bad_input.py under load): the look has seen the old, valid state and the
new answer, a view the disk never held. Broken state files are never resumed, so no resume
may come of it (reconcile.inspect: a resume needs two looks that agree)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from deltad.clock import ManualClock
from deltad.core.reconcile import Action, State, inspect
from deltad.core.tenancy import Policy
from deltad.protocol import Mailbox, Workspace
from deltad.testing.stub import paused_workspace
from deltad.watch.hints import Why

POLICY = Policy()


def _mailbox(ws: Path) -> Path:
    return ws / ".delta" / "interaction"


def _metadata(ws: Path) -> Path:
    return Workspace(ws).run(Workspace(ws).latest_run_id() or "").metadata


def _break_request(ws: Path) -> None:
    (_mailbox(ws) / "request.json").write_text('{"prompt": 42}')


def _break_metadata(ws: Path) -> None:
    _metadata(ws).write_text("{not json")


def _break_latest(ws: Path) -> None:
    (ws / ".delta" / "runs" / "LATEST").write_text("../../etc")


def _answer(ws: Path) -> None:
    tmp = _mailbox(ws) / ".tmp"
    tmp.write_text("an answer")
    os.replace(tmp, _mailbox(ws) / "response.txt")


def _between_state_and_answer(
    monkeypatch: pytest.MonkeyPatch, writes: Callable[[], None]
) -> list[int]:
    """Run `writes` once, at the moment a look goes from the state files to the answer: the
    other process's turn, placed where the scheduler can place it."""
    reads = [0]
    read_answer = Mailbox.read_answer

    def torn(self: Mailbox, *args: object, **kwargs: object) -> object:
        reads[0] += 1
        if reads[0] == 1:
            writes()
        return read_answer(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Mailbox, "read_answer", torn)
    return reads


@pytest.mark.linux_only  # done by its read lease (deltad/platform.py); elsewhere: settle_seconds
@pytest.mark.parametrize(
    ("broken", "said"),
    [(_break_request, "request.json"), (_break_metadata, "metadata.json"), (_break_latest, "")],
    ids=["request", "metadata", "latest"],
)
def test_a_state_file_broken_between_the_reads_of_one_look_is_never_resumed(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    broken: Callable[[Path], None],
    said: str,
) -> None:
    ws = tmp_path / "ws"
    paused_workspace(ws)

    def person() -> None:
        broken(ws)
        _answer(ws)

    reads = _between_state_and_answer(monkeypatch, person)
    clock = ManualClock(wall=__import__("time").time())
    v = inspect(ws, Why.CHECK, 1.0, POLICY, clock)
    assert reads[0] == 1  # the person's writes did land between the look's reads
    assert v.action is Action.NONE
    assert v.state is State.PROBLEM and v.problem is not None and said in v.problem


@pytest.mark.linux_only  # done by its read lease (deltad/platform.py); elsewhere: settle_seconds
def test_an_answer_with_nothing_broken_is_resumed_after_the_confirming_look(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = tmp_path / "ws"
    paused_workspace(ws)
    reads = _between_state_and_answer(monkeypatch, lambda: _answer(ws))
    v = inspect(ws, Why.CHECK, 1.0, POLICY, ManualClock(wall=__import__("time").time()))
    assert (v.action, v.state) == (Action.RESUME, State.ANSWERED)
    assert reads[0] == 2  # one look saw the answer, a second one confirmed it


@pytest.mark.linux_only  # done by its read lease (deltad/platform.py); elsewhere: settle_seconds
def test_files_rewritten_under_every_look_put_the_resume_off_and_look_again_soon(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = tmp_path / "ws"
    paused_workspace(ws)
    read_answer = Mailbox.read_answer
    sizes = iter(range(1, 100))

    def rewritten(self: Mailbox, *args: object, **kwargs: object) -> object:
        (_mailbox(ws) / "response.txt").write_text("x" * next(sizes))  # a new answer each time
        return read_answer(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Mailbox, "read_answer", rewritten)
    clock = ManualClock(wall=__import__("time").time())
    v = inspect(ws, Why.CHECK, 1.0, POLICY, clock)
    assert v.action is Action.NONE and v.state is State.WAITING
    assert v.wake_at is not None and 0 < v.wake_at - clock.time() <= 0.1


def _latest(ws: Path) -> Path:
    return ws / ".delta" / "runs" / "LATEST"


@pytest.mark.linux_only  # read leases (deltad/platform.py)
@pytest.mark.parametrize(
    "path",
    [_latest, _metadata, lambda ws: _mailbox(ws) / "request.json"],
    ids=["latest", "metadata", "request"],
)
def test_a_state_file_half_written_in_place_is_judged_once_its_writer_is_done(
    tmp_path: Path, path: Callable[[Path], Path]
) -> None:
    """`echo ... > request.json`: truncated, then written, then closed. A look in between (the
    background read after READY, a sweep) reads an empty file: not a problem to report (a
    second, different one would follow), but a look again once the writer is done: it has
    closed the file and left it unchanged for `settle` seconds."""
    ws = tmp_path / "ws"
    paused_workspace(ws)
    target = path(ws)
    clock = ManualClock(wall=__import__("time").time())
    with open(target, "w") as writer:  # truncated; nothing written yet
        v = inspect(ws, Why.CHECK, 1.0, POLICY, clock)
        assert v.action is Action.NONE and v.problem is None
        assert v.wake_at is not None and 0 < v.wake_at - clock.time() <= 1.0
        writer.write("{not json")
    written = target.stat().st_mtime
    clock.advance(written - clock.time() + 0.5)  # closed, but changed half a second ago
    v = inspect(ws, Why.CHECK, 1.0, POLICY, clock)
    assert v.action is Action.NONE and v.problem is None
    assert v.wake_at is not None and abs(v.wake_at - (written + 1.0)) < 0.01
    clock.advance(0.51)
    v = inspect(ws, Why.CHECK, 1.0, POLICY, clock)
    assert v.state is State.PROBLEM and v.problem is not None and target.name in v.problem


def test_a_broken_state_file_written_long_ago_is_said_at_once(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    paused_workspace(ws)
    _break_request(ws)
    clock = ManualClock(wall=__import__("time").time() + 5)
    v = inspect(ws, Why.CHECK, 1.0, POLICY, clock)
    assert v.state is State.PROBLEM and v.problem is not None and "request.json" in v.problem
