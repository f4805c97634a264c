"""The local executors as job executors (executors/local.py, fresh.py), in-process with real
processes: submit idempotent on the request key, Started then Exit with the exit code's meaning,
`resumes.json` kept and adopted back against /proc, cancel with a grace (SIGTERM, then SIGKILL
once the grace is over on the executor's clock). The decisions beside them from tables."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from deltad.clock import ManualClock
from deltad.executors import local
from deltad.executors.fresh import FreshExecutor
from deltad.executors.local import Left, Switch, may_adopt, ref_of, switch_to
from deltad.executors.seam import Exit, Identity, JobSpec, RequestKey, Started
from deltad.protocol.process import proc_start_ticks
from tests.support.daemon import next_exit, wait_for

pytestmark = pytest.mark.spawns  # the local executor starts real processes: that is what it is

LINUX_ONLY = pytest.mark.linux_only  # /proc start ticks, pidfds (elsewhere: pid and polling)

ME = Identity(os.geteuid(), os.getegid())


def _spec(ws: Path, script: str, attempt: int = 0) -> JobSpec:
    ws.mkdir(exist_ok=True)
    key = RequestKey(ws, "run1", "resume", attempt)
    return JobSpec(key, ["/bin/sh", "-c", script], ME, {"PATH": "/usr/bin:/bin"}, 60.0)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(mono=time.monotonic(), wall=time.time())


@pytest.fixture
def fresh(tmp_path: Path, clock: ManualClock) -> Iterator[FreshExecutor]:
    ex = FreshExecutor(tmp_path / "state", clock)
    (tmp_path / "state").mkdir()
    yield ex
    for proc in ex.procs.values():
        local.signal_group(proc.pid, signal.SIGKILL)
    ex.close()


def _recorded(ex: FreshExecutor) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = json.loads((ex.state_dir / local.RESUMES).read_text())
    return rows


# -- decisions -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("identity", "daemon_uid", "switch"),
    [
        (Identity(0, 0), 0, None),  # root's own workspace: stays root
        (Identity(1000, 1000, (1000, 27)), 1000, None),  # a non-root daemon never switches
        (Identity(1001, 1002, (1002, 5)), 0, Switch(1001, 1002, (1002, 5))),
        (Identity(1001, 1001), 0, Switch(1001, 1001, ())),  # no extra groups: setgroups([])
    ],
)
def test_whom_a_process_becomes(identity: Identity, daemon_uid: int, switch: Switch | None) -> None:
    assert switch_to(identity, daemon_uid) == switch


KEY = RequestKey(Path("/w"), "r", "resume", 3)


@pytest.mark.parametrize(
    ("left", "known", "worth_a_look"),
    [
        (Left(KEY, "fresh", 4242, 7, 1.0), [], True),
        (Left(KEY, "fresh", 4242, 7, 1.0), [KEY.name], False),  # already ours
        (Left(KEY, "fresh", 0, 7, 1.0), [], False),  # killpg(0) would be the daemon's group
        (Left(KEY, "fresh", 1 << 22, 7, 1.0), [], False),  # no such pid on Linux
        (Left(KEY, "fresh", -1, 7, 1.0), [], False),
    ],
)
def test_which_recorded_jobs_are_worth_a_look(
    left: Left, known: list[str], worth_a_look: bool
) -> None:
    assert may_adopt(left, known) == worth_a_look


def test_a_ref_names_the_pid_and_its_start() -> None:
    assert ref_of(42, 1234) == "42:1234" and ref_of(42, None) == "42"


# -- submit and poll -----------------------------------------------------------------------------
def test_submit_is_idempotent_on_the_key(fresh: FreshExecutor, tmp_path: Path) -> None:
    spec = _spec(tmp_path / "ws", "exit 0")
    first = fresh.submit(spec)
    assert fresh.submit(spec) == first and len(fresh.procs) == 1
    assert dict(first.shown)["pid"] > 0 and first.executor == "fresh"
    assert fresh.submit(_spec(tmp_path / "ws", "exit 0", attempt=1)) != first  # another key


@pytest.mark.parametrize(
    ("script", "rc", "meaning"),
    [
        ("exit 0", 0, "completed"),
        ("exit 75", 75, "busy"),
        ("exit 101", 101, "waiting"),
        ("exit 2", 2, "usage_error"),
        ("kill -9 $$", -9, "killed_by_SIGKILL"),
    ],
)
def test_a_job_starts_then_exits_with_its_meaning(
    fresh: FreshExecutor, tmp_path: Path, clock: ManualClock, script: str, rc: int, meaning: str
) -> None:
    handle = fresh.submit(_spec(tmp_path / "ws", script))
    assert fresh.due(clock.monotonic()) == clock.monotonic()  # its Started is to be reported
    events = fresh.poll(clock.monotonic())
    assert events[0] == Started(handle, clock.time())  # a process runs from its spawn
    end = events[1] if len(events) > 1 else next_exit(fresh)
    assert isinstance(end, Exit) and end.handle == handle
    assert (end.rc, end.meaning) == (rc, meaning)
    assert fresh.procs == {} and _recorded(fresh) == []


def test_the_job_runs_in_the_workspace_with_its_environment_and_log(
    fresh: FreshExecutor, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    fresh.submit(_spec(ws, 'echo "$PATH" > seen; pwd >> seen; echo to-the-log; exit 0'))
    assert next_exit(fresh).rc == 0
    assert (ws / "seen").read_text().split() == ["/usr/bin:/bin", str(ws)]
    [logged] = (fresh.state_dir / local.LOGS).iterdir()
    assert logged.read_text().splitlines()[-1] == "to-the-log"


def test_a_job_that_cannot_start_is_a_one_line_refusal(
    fresh: FreshExecutor, tmp_path: Path
) -> None:
    from deltad.executors.seam import SubmitError

    spec = _spec(tmp_path / "ws", "exit 0")
    missing = JobSpec(spec.key, [str(tmp_path / "no-such-program")], ME, {}, 60.0)
    with pytest.raises(SubmitError) as e:
        fresh.submit(missing)
    assert "no-such-program" in str(e.value) and "\n" not in str(e.value)
    assert fresh.procs == {}


# -- cancel --------------------------------------------------------------------------------------
def test_cancel_sends_sigterm_and_a_forced_one_sigkill(
    fresh: FreshExecutor, tmp_path: Path, clock: ManualClock
) -> None:
    ws = tmp_path / "ws"
    handle = fresh.submit(_spec(ws, 'trap "" TERM; touch ready; exec sleep 60'))
    fresh.poll(clock.monotonic())  # Started
    wait_for(lambda: (ws / "ready").exists(), "SIGTERM ignored")
    fresh.cancel(handle, force=False)
    assert fresh.due(clock.monotonic()) is None  # no timer of its own: the resumer escalates
    clock.advance(60)  # however long: SIGTERM only, which it ignores
    assert fresh.poll(clock.monotonic()) == [] and handle.key.name in fresh.procs
    fresh.cancel(handle, force=True)
    end = next_exit(fresh)
    assert (end.handle, end.meaning) == (handle, "killed_by_SIGKILL")


def test_cancel_of_a_job_that_obeys_sigterm(fresh: FreshExecutor, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    handle = fresh.submit(_spec(ws, "touch ready; exec sleep 60"))
    wait_for(lambda: (ws / "ready").exists(), "the job running")
    fresh.cancel(handle, force=False)
    assert next_exit(fresh).meaning == "killed_by_SIGTERM"


# -- adopt ---------------------------------------------------------------------------------------
@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


@LINUX_ONLY
def test_a_restarted_executor_adopts_what_resumes_json_names_and_proc_confirms(
    tmp_path: Path, clock: ManualClock, sleeper: subprocess.Popen[bytes]
) -> None:
    ticks = proc_start_ticks(sleeper.pid)
    assert ticks is not None
    state = tmp_path / "state"
    state.mkdir()
    row = {"run_id": "r1", "pid": sleeper.pid, "start_ticks": ticks, "spawned_at": 5.0}
    rows = [
        {**row, "workspace": str(tmp_path / "ws"), "request": "resume", "attempt": 9},
        {**row, "workspace": str(tmp_path / "recycled"), "start_ticks": ticks + 1},
        {**row, "workspace": str(tmp_path / "impossible"), "pid": 2**22},
        {**row, "workspace": str(tmp_path / "older"), "executor": "fork"},  # no key parts: 0
    ]
    (state / local.RESUMES).write_text(json.dumps(rows))
    ex = FreshExecutor(state, clock)
    try:
        adopted = ex.adopt()
        assert [(h.key.workspace, h.key.attempt, h.executor) for h in adopted] == [
            (tmp_path / "ws", 9, "fresh"),
            (tmp_path / "older", 0, "fork"),
        ]
        assert adopted[0].ref == f"{sleeper.pid}:{ticks}"
        assert dict(adopted[0].shown) == {"pid": sleeper.pid}
        assert [r["workspace"] for r in _recorded(ex)] == [
            str(tmp_path / "ws"),
            str(tmp_path / "older"),
        ]
        assert ex.poll(clock.monotonic()) == [Started(h, 5.0) for h in adopted]  # as first started
        sleeper.kill()
        sleeper.wait()
        ends = wait_for(lambda: ex.poll(clock.monotonic()), "the adopted process gone")
        assert [(e.rc, e.meaning) for e in ends if isinstance(e, Exit)] == [(None, "unknown")] * 2
        assert _recorded(ex) == []
    finally:
        ex.close()


@LINUX_ONLY
def test_close_leaves_the_job_running_and_the_next_executor_adopts_it(
    fresh: FreshExecutor, tmp_path: Path, clock: ManualClock
) -> None:
    ws = tmp_path / "ws"
    handle = fresh.submit(_spec(ws, "touch ready; exec sleep 60"))
    pid = dict(handle.shown)["pid"]
    fresh.close()  # the daemon stops: the process runs on in its own session
    try:
        assert os.waitpid(pid, os.WNOHANG) == (0, 0)  # still running
        again = FreshExecutor(fresh.state_dir, clock)
        assert again.adopt() == [handle]
        again.cancel(handle, force=False)
        end = next_exit(again)
        assert (end.handle, end.rc) == (handle, None)  # not its child: the code is unknown
    finally:
        local.signal_group(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):  # subprocess may have reaped it
            os.waitpid(pid, 0)


def test_an_unreadable_resumes_file_is_nothing(tmp_path: Path) -> None:
    (tmp_path / local.RESUMES).write_text("[{]")
    assert local.load(tmp_path, "fresh") == []
    (tmp_path / local.RESUMES).write_text('[{"pid": "x"}]')
    assert local.load(tmp_path, "fresh") == []
    (tmp_path / local.RESUMES).write_text("[1]")
    assert local.load(tmp_path, "fresh") == []


def test_without_pidfds_the_executor_asks_to_be_polled(
    tmp_path: Path, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local, "pidfd", lambda pid: None)
    (tmp_path / "state").mkdir()
    ex = FreshExecutor(tmp_path / "state", clock)
    assert ex.poll_every is None
    ex.submit(_spec(tmp_path / "ws", "exit 3"))
    assert ex.poll_every == local.POLL_EVERY and ex.fds() == []
    assert next_exit(ex).rc == 3
    assert ex.poll_every is None


@LINUX_ONLY
def test_with_pidfds_the_exit_is_readable(fresh: FreshExecutor, tmp_path: Path) -> None:
    import select

    fresh.submit(_spec(tmp_path / "ws", "exit 0"))
    assert fresh.poll_every is None
    [fd] = fresh.fds()
    assert select.select([fd], [], [], 60.0)[0] == [fd]
    assert next_exit(fresh).rc == 0
