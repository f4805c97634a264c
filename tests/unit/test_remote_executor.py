"""`RemoteExecutor` (deltad/executors/remote.py) with an engine of plain Python objects.

The engine's hooks can fail or hang (a threading.Event the test holds); the seam's methods must
return at once whatever the engine does, and the worker's news comes through `fds()`. Waits are
conditions with generous deadlines.
"""

from __future__ import annotations

import os
import select
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from deltad.executors import (
    AdoptPending,
    Event,
    Exit,
    Handle,
    Identity,
    JobSpec,
    Refused,
    RemoteExecutor,
    RequestKey,
    Started,
    SubmitError,
)
from deltad.executors.remote import (
    EngineAway,
    RemoteJob,
    Seen,
    daemon_secret,
    next_interval,
    tag,
    tag_ok,
)
from deltad.executors.seam import JobState

DEADLINE = 30.0


class Engine(RemoteExecutor):
    name = "fake"

    def __init__(
        self, jobs: dict[str, Seen] | None = None, away: str | None = None, hung: bool = False
    ) -> None:
        self.jobs: dict[str, Seen] = dict(jobs or {})
        self.away = away  # the list fails with this
        self.refuse: str | None = None  # a submit fails with this
        self.unanswered = 0  # this many submits get no answer at all (EngineAway)
        self.up = threading.Event()  # cleared: the engine hangs
        if not hung:
            self.up.set()
        self.lists = 0
        self.submitted: list[str] = []
        self.cancelled: list[tuple[str, bool]] = []
        self.paces: list[float] = []  # every pause the worker set, in order
        # Short paces: the tests wait for the worker's turns (a few doublings of these)
        super().__init__(interval=0.002, max_interval=0.016)

    @property  # type: ignore[override]
    def _pause(self) -> float:
        return self._pause_now

    @_pause.setter
    def _pause(self, value: float) -> None:
        # a pause may hold for one turn only: recorded, so that a test need not catch it
        self._pause_now = value
        self.paces.append(value)

    def engine_list(self) -> list[Seen]:
        self.up.wait()
        self.lists += 1
        if self.away:
            raise SubmitError(self.away)
        return list(self.jobs.values())

    def engine_submit(self, spec: JobSpec) -> str:
        if self.refuse:
            raise SubmitError(self.refuse)
        if self.unanswered:
            self.unanswered -= 1
            raise EngineAway("no answer in time")
        ref = f"j{len(self.submitted)}"
        self.submitted.append(spec.key.name)
        self.jobs[spec.key.name] = Seen(spec.key, ref, JobState.QUEUED)
        return ref

    def engine_cancel(self, job: RemoteJob, force: bool) -> None:
        self.cancelled.append((job.handle.key.name, force))

    def set(self, key: RequestKey, state: JobState, **kw: object) -> None:
        ref = self.jobs[key.name].ref
        self.jobs[key.name] = Seen(key, ref, state, **kw)  # type: ignore[arg-type]


@pytest.fixture
def engine() -> Iterator[Engine]:
    e = Engine()
    yield e
    e.up.set()
    e.close()


def spec(n: int = 0) -> JobSpec:
    return JobSpec(RequestKey(Path(f"/ws/{n}"), "run", "q", n), ["x"], Identity(1000, 1000))


def until(ex: Engine, done: Callable[[list[Event]], bool], what: str) -> list[Event]:
    events: list[Event] = []
    end = time.monotonic() + DEADLINE
    while not done(events):
        assert time.monotonic() < end, f"timed out waiting for {what}: {events}"
        select.select(ex.fds(), [], [], 0.1)
        events += ex.poll(time.monotonic())
    return events


def wait(cond: Callable[[], object], what: str) -> None:
    end = time.monotonic() + DEADLINE
    while not cond():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.005)


def has(kind: type, h: Handle) -> Callable[[list[Event]], bool]:
    return lambda evs: any(isinstance(e, kind) and e.handle == h for e in evs)


def test_a_hung_engine_never_holds_the_seam(engine: Engine) -> None:
    wait(lambda: engine.lists >= 1, "the first list")
    engine.up.clear()  # hung from the next call on
    handle = engine.submit(spec())  # returns at once: the worker is stuck, not the caller
    assert engine.poll(time.monotonic()) == []
    engine.cancel(handle, False)
    assert handle == Handle(spec().key, "fake", spec().key.name)
    engine.up.set()
    wait(lambda: engine.submitted == [spec().key.name], "the submit after the engine's return")


def test_started_then_exit_come_through_the_pipe(engine: Engine) -> None:
    handle = engine.submit(spec())
    wait(lambda: engine.submitted, "the submit")
    engine.set(spec().key, JobState.RUNNING, start=100.0)
    assert until(engine, has(Started, handle), "Started") == [Started(handle, 100.0)]
    engine.set(spec().key, JobState.ENDED, start=100.0, rc=3, detail="FAILED")
    assert until(engine, has(Exit, handle), "Exit") == [Exit(handle, 3, False, "FAILED")]
    assert engine.tracked() == {}


def test_submit_is_idempotent_on_the_key_and_finds_a_job_the_engine_has(engine: Engine) -> None:
    first = engine.submit(spec())
    assert engine.submit(spec()) == first
    wait(lambda: engine.submitted, "the submit")
    engine.close()
    again = Engine(engine.jobs)  # a restarted daemon, the job still on the engine
    try:
        assert again.submit(spec()) == first
        wait(lambda: again.tracked()[first.key.name].ref == "j0", "found by the list")
        assert again.submitted == []  # never submitted twice
    finally:
        again.close()


def test_an_engine_away_keeps_submits_waiting_and_is_said_once(engine: Engine) -> None:
    engine.away = "controller unreachable"
    with capture_logs() as logs:
        handle = engine.submit(spec())
        lists = engine.lists
        wait(lambda: engine.lists >= lists + 3, "a few tries")
        assert engine.poll(time.monotonic()) == [] and engine.submitted == []
        engine.away = None
        wait(lambda: engine.submitted == [handle.key.name], "the submit once it answers")
    said = [(e["event"], e.get("op")) for e in logs if e["log_level"] in ("warning", "info")]
    assert said == [("executor_engine_failed", "query"), ("executor_engine_back", "query")]


def test_the_pace_is_back_to_its_base_as_soon_as_the_engine_answers_again(
    engine: Engine,
) -> None:
    handle = engine.submit(spec())
    wait(lambda: engine.submitted, "the submit")  # a job to follow: the worker keeps asking
    engine.away = "controller unreachable"
    wait(lambda: engine.pause == engine.max_interval, "the pause grown by the failures")
    before = len(engine.paces)  # the pause stays the longest while the engine is away
    engine.away = None
    # Nothing about the job changed, but the engine's return is news: its ends that happened
    # meanwhile are looked for at the usual pace, not after the longest pause.
    wait(lambda: engine.interval in engine.paces[before:], "the pause back to its base")
    assert engine.tracked()[handle.key.name].ref == "j0"


def test_a_submit_the_engine_did_not_answer_waits_and_is_sent_again_never_refused(
    engine: Engine,
) -> None:
    engine.unanswered = 2
    with capture_logs() as logs:
        handle = engine.submit(spec())
        wait(lambda: engine.submitted == [handle.key.name], "the submit once it answers")
        engine.poke()  # (an engine's news: a turn now, from any thread)
        assert not any(isinstance(e, Refused) for e in engine.poll(time.monotonic()))
    said = [(e["event"], e.get("op")) for e in logs if e["log_level"] in ("warning", "info")]
    assert said == [("executor_engine_failed", "submit"), ("executor_engine_back", "submit")]
    assert engine.tracked()[handle.key.name].ref == "j0"


def test_a_refused_submit_comes_back_as_refused(engine: Engine) -> None:
    engine.refuse = "sbatch: invalid partition"
    handle = engine.submit(spec())
    [refused] = until(engine, has(Refused, handle), "the refusal")
    assert refused.reason == "fake: sbatch: invalid partition"
    assert engine.tracked() == {}  # the resumer submits it again after its pacing


def test_cancel_reaches_the_engine_with_its_force(engine: Engine) -> None:
    handle = engine.submit(spec())
    wait(lambda: engine.submitted, "the submit")
    engine.cancel(handle, False)
    engine.cancel(handle, True)
    wait(lambda: (spec().key.name, True) in engine.cancelled, "the forced cancel")
    engine.cancel(Handle(spec(9).key, "fake", "x"), True)  # unknown: no error, nothing sent
    assert all(name == spec().key.name for name, _ in engine.cancelled)


def test_adopt_waits_for_the_first_answer_and_reports_ended_jobs() -> None:
    running, ended = spec(1).key, spec(2).key
    ex = Engine(
        {
            running.name: Seen(running, "j1", JobState.RUNNING, 50.0),
            ended.name: Seen(ended, "j2", JobState.ENDED, 40.0, rc=0, detail="COMPLETED"),
        },
        hung=True,
    )
    try:
        with pytest.raises(AdoptPending):
            ex.adopt()
        ex.up.set()
        end = time.monotonic() + DEADLINE
        while True:
            try:
                adopted = ex.adopt()
                break
            except AdoptPending:
                assert time.monotonic() < end
                select.select(ex.fds(), [], [], 0.1)
        assert {h.key for h in adopted} == {running, ended}
        assert {dict(h.shown)["job"] for h in adopted} == {"j1", "j2"}
        events = ex.poll(time.monotonic())
        by_key = {(type(e).__name__, e.handle.key) for e in events}
        assert by_key == {("Started", running), ("Started", ended), ("Exit", ended)}
    finally:
        ex.close()


def test_adopt_says_why_when_the_engine_cannot_be_asked() -> None:
    ex = Engine(away="no route")
    try:
        wait(lambda: ex._list_error, "the first list to fail")
        with pytest.raises(SubmitError, match="fake: cannot list this daemon's jobs: no route"):
            ex.adopt()
    finally:
        ex.close()


def test_one_query_per_turn_whatever_the_number_of_jobs(engine: Engine) -> None:
    handles = [engine.submit(spec(i)) for i in range(50)]
    wait(lambda: len(engine.submitted) == 50, "every submit")
    lists, turns = engine.lists, engine.turns
    wait(lambda: engine.turns >= turns + 5, "five more turns")
    # One list per turn, not one per job (the two counters are read a moment apart).
    assert engine.lists - lists <= engine.turns - turns + 1
    assert len(handles) == 50


@pytest.mark.parametrize(
    ("current", "changed", "after"),
    [
        (0.5, True, 0.5),
        (0.5, False, 1.0),
        (8.0, False, 10.0),
        (10.0, False, 10.0),
        (10.0, True, 0.5),
    ],
)
def test_the_interval_doubles_while_nothing_changes(
    current: float, changed: bool, after: float
) -> None:
    assert next_interval(current, changed, 0.5, 10.0) == after


def test_the_daemons_key_is_made_once_owner_only_and_tags_verify(tmp_path: Path) -> None:
    key = daemon_secret(tmp_path)
    assert daemon_secret(tmp_path) == key and len(key) == 32
    st = (tmp_path / "executor.key").stat()
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()
    signed = tag(key, "a", "b")
    assert tag_ok(key, signed, "a", "b")
    assert not tag_ok(key, signed, "a", "c") and not tag_ok(b"x" * 32, signed, "a", "b")
    (tmp_path / "executor.key").chmod(0o644)
    with pytest.raises(ValueError, match="mode 0600"):
        daemon_secret(tmp_path)


def test_a_key_file_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").write_bytes(b"k" * 32)
    (tmp_path / "executor.key").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ValueError, match="executor key"):
        daemon_secret(tmp_path)


def test_an_idle_worker_sleeps_until_there_is_work() -> None:
    """Nothing tracked, nothing to submit: the worker waits to be told, it does not spin."""

    class Counting(Engine):
        sleeps = 0

        def _sleep(self) -> float | None:
            self.sleeps += 1
            return super()._sleep()

    engine = Counting()
    try:
        wait(lambda: engine.turns >= 1, "the first turn")
        wait(lambda: engine._sleep() is None, "idle")
        sleeps = engine.sleeps
        # Four of its longest pauses: a worker that spun, or only paced itself while idle,
        # would count more than two (the absence of a thing is seen by waiting a while)
        time.sleep(4 * engine.max_interval)
        assert engine.sleeps - sleeps <= 2
        handle = engine.submit(spec())
        wait(lambda: engine.submitted == [handle.key.name], "the submit wakes it")
    finally:
        engine.close()


class ParkingEngine(Engine):
    """An engine whose submits are parked until released (Slurm's --hold)."""

    parks = True

    def __init__(self, jobs: dict[str, Seen] | None = None) -> None:
        self.released: list[str] = []
        self.release_fails = 0  # this many releases fail (the controller away)
        super().__init__(jobs)

    def engine_submit(self, spec: JobSpec) -> str:
        ref = super().engine_submit(spec)
        self.jobs[spec.key.name] = Seen(spec.key, ref, JobState.QUEUED, parked=True)
        return ref

    def engine_release(self, job: RemoteJob, fence: Callable[[], bool] | None) -> None:
        if fence is not None and not fence():  # as the command's own process asks it
            raise SubmitError("fenced at exec")
        if self.release_fails:
            self.release_fails -= 1
            raise SubmitError("controller unreachable")
        assert job.ref is not None
        self.released.append(job.ref)
        seen = self.jobs[job.handle.key.name]
        self.jobs[job.handle.key.name] = Seen(seen.key, seen.ref, JobState.QUEUED)

    def engine_cancel(self, job: RemoteJob, force: bool) -> None:
        super().engine_cancel(job, force)
        self.jobs[job.handle.key.name] = Seen(job.handle.key, job.ref or "", JobState.ENDED)


def parked(n: int, ref: str) -> Seen:
    return Seen(spec(n).key, ref, JobState.QUEUED, parked=True)


def test_a_parked_submit_is_let_go_after_the_fence_and_again_after_a_failed_release() -> None:
    ex = ParkingEngine()
    ex.release_fails = 1
    try:
        handle = ex.submit(spec())
        wait(lambda: ex.released == ["j0"], "the release, tried again at the next query")
        assert ex.submitted == [handle.key.name]  # one job: the failed release is no resubmit
    finally:
        ex.close()


def test_a_fenced_daemon_leaves_its_job_parked_and_the_resume_refused() -> None:
    ex = ParkingEngine()
    may_act = threading.Event()  # the lease: lost at once
    try:
        handle = ex.submit(JobSpec(spec().key, ["x"], Identity(1000, 1000), fence=may_act.is_set))
        events = until(ex, has(Refused, handle), "the refusal")
        [refused] = [e for e in events if isinstance(e, Refused)]
        assert "fenced" in refused.reason and "left parked" in refused.reason
        assert ex.submitted == [handle.key.name] and ex.released == []
    finally:
        ex.close()


def test_the_active_cancels_a_parked_job_nobody_tracks_and_lets_an_adopted_one_go() -> None:
    # Left on the engine: one parked by a daemon killed between its two steps (the successor
    # adopts it and lets it go), and, once adoption is done, one parked by a frozen former
    # active's late submit (nobody tracks it: cancelled, said once, never released).
    ex = ParkingEngine({spec(0).key.name: parked(0, "old")})
    try:
        handles: list[Handle] = []
        end = time.monotonic() + DEADLINE
        while not handles:
            try:
                handles = ex.adopt()
            except AdoptPending:
                assert time.monotonic() < end
                time.sleep(0.005)
        wait(lambda: ex.released == ["old"], "the adopted parked job let go")
        with capture_logs() as logs:
            ex.jobs[spec(1).key.name] = parked(1, "late")
            wait(lambda: ex.cancelled == [(spec(1).key.name, False)], "the orphan cancelled")
            lists = ex.lists
            wait(lambda: ex.lists >= lists + 2, "more queries")
        assert ex.released == ["old"] and len(ex.cancelled) == 1
        assert [e["job"] for e in logs if e["event"] == "executor_orphan_cancelled"] == ["late"]
    finally:
        ex.close()


def test_only_the_active_cancels_orphans() -> None:
    running = Seen(spec(2).key, "r", JobState.RUNNING, start=1.0)  # tracked: queries go on
    ex = ParkingEngine({spec(2).key.name: running})
    try:
        ex.fence = lambda: False  # a stale active: acts on nothing
        wait(lambda: ex.lists >= 1, "the first list")
        assert len(ex.adopt()) == 1
        ex.jobs[spec(1).key.name] = parked(1, "late")
        lists = ex.lists
        ex.poke()
        wait(lambda: ex.lists >= lists + 2, "more queries")
        assert ex.cancelled == []
    finally:
        ex.close()
