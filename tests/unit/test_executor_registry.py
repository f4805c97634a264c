"""The executor registry (names, entry points, dotted paths, options) and a `JobExecutor`
driven by the resumer: the timeout counts from Started, `poll_every` is honoured, exits free
slots, cancel and adopt go to the executor."""

from __future__ import annotations

import re
from collections.abc import Mapping
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any, ClassVar

import pytest
from pydantic import ValidationError
from structlog.testing import capture_logs

from deltad.clock import ManualClock
from deltad.core import tenancy
from deltad.core.config import DaemonConfig
from deltad.core.resumer import (
    KILL_GRACE_SECONDS,
    SUBMIT_RETRY,
    Resumer,
    spec_of,
    started_at,
)
from deltad.core.tenancy import Identity, Launch, Owner, Policy
from deltad.executors import make_executor, registry
from deltad.executors.fresh import CommandExecutor, FreshExecutor
from deltad.executors.seam import (
    BaseJobExecutor,
    Event,
    Exit,
    Handle,
    JobSpec,
    Refused,
    RequestKey,
    Started,
    SubmitError,
)
from deltad.executors.seam import Identity as JobIdentity

HERE = "tests.unit.test_executor_registry"
LINUX_ONLY = pytest.mark.linux_only


class FakeJobs(BaseJobExecutor):
    """A `JobExecutor` that starts nothing: the test says when a job starts and ends."""

    name = "fakejobs"
    poll_every: float | None = 0.05

    left_over: ClassVar[list[Handle]] = []  # what `adopt` finds (set before the resumer makes one)
    away: ClassVar[bool] = False  # `adopt` cannot ask the engine

    def __init__(self) -> None:
        self.submitted: list[JobSpec] = []
        self.events: list[Event] = []
        self.cancelled: list[tuple[Handle, bool]] = []
        self.refuse: str | bool = False  # "permanent": a refusal asking again cannot help
        self.broken = False  # every call raises (a third-party bug)
        self.due_at: float | None = None
        self.found = list(self.left_over)  # what `adopt` lists from now on
        self.unreachable = self.away

    def submit(self, spec: JobSpec) -> Handle:
        if self.broken:
            raise RuntimeError("bug in submit")
        if self.refuse:
            raise SubmitError("the queue is closed", permanent=self.refuse == "permanent")
        self.submitted.append(spec)
        return Handle(spec.key, self.name, f"job-{len(self.submitted)}")

    def poll(self, now: float) -> list[Event]:
        if self.broken:
            raise RuntimeError("bug in poll")
        events, self.events = self.events, []
        return events

    def cancel(self, handle: Handle, force: bool) -> None:
        if self.broken:
            raise RuntimeError("bug in cancel")
        self.cancelled.append((handle, force))

    def adopt(self) -> list[Handle]:
        if self.unreachable:
            raise SubmitError("the engine is away")
        return list(self.found)

    def due(self, now: float) -> float | None:
        return self.due_at

    def fds(self) -> list[int]:
        return []

    def close(self) -> None:
        pass


def check_fake(options: Mapping[str, Any]) -> None:
    if set(options) - {"colour"}:
        raise ValueError("executors.fakejobs: unknown option")


def make_fake(options: Mapping[str, Any]) -> FakeJobs:
    check_fake(options)
    return FakeJobs()


make_fake.check_options = check_fake  # type: ignore[attr-defined]


not_a_factory = 42


# -- names ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "cls"), [("fresh", FreshExecutor), ("command", CommandExecutor)])
def test_a_built_in_is_found_by_name(name: str, cls: type, tmp_path: Path) -> None:
    executor = make_executor(name, {}, tmp_path)
    assert type(executor) is cls and executor.name == name


def test_an_unknown_name_is_one_line_naming_the_known_ones() -> None:
    with pytest.raises(registry.UnknownExecutor) as e:
        registry.find("nope")
    assert "\n" not in str(e.value) and "'nope'" in str(e.value) and "fresh" in str(e.value)


def test_an_entry_point_in_the_group_is_found(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    points = [EntryPoint("fakejobs", f"{HERE}:make_fake", registry.GROUP)]

    def entry_points(*, group: str, name: str | None = None) -> list[EntryPoint]:
        return [p for p in points if p.group == group and name in (None, p.name)]

    monkeypatch.setattr(registry, "entry_points", entry_points)
    assert registry.where("fakejobs") == f"{HERE}:make_fake"
    assert isinstance(make_executor("fakejobs", {}, tmp_path), FakeJobs)
    with pytest.raises(registry.UnknownExecutor, match="fakejobs"):  # listed among the known
        registry.find("other")


def test_a_dotted_path_is_a_factory(tmp_path: Path) -> None:
    executor = make_executor(f"{HERE}:make_fake", {"colour": "red"}, tmp_path)
    assert isinstance(executor, FakeJobs) and executor.name == "fakejobs"


def make_nothing(options: Mapping[str, Any]) -> object:
    return object()


def test_a_factory_that_makes_no_job_executor_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(registry.UnknownExecutor, match="made no job executor") as e:
        make_executor(f"{HERE}:make_nothing", {}, tmp_path)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("name", "says"),
    [
        (f"{HERE}:not_a_factory", "is not a factory"),
        (f"{HERE}:missing", "is not a factory"),
        ("deltad_no_such_module:make", "cannot be loaded"),
    ],
)
def test_a_dotted_path_to_nothing_is_one_line(name: str, says: str) -> None:
    with pytest.raises(registry.UnknownExecutor, match=says) as e:
        registry.find(name)
    assert "\n" not in str(e.value)


def test_a_missing_optional_dependency_fails_only_when_chosen(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(registry.BUILTINS, "cluster", "deltad_no_such_module:make")
    DaemonConfig.model_validate({"state_dir": str(tmp_path), "executor": "fresh"})
    with pytest.raises(ValidationError, match="executor: cluster cannot be loaded"):
        DaemonConfig.model_validate({"state_dir": str(tmp_path), "executor": "cluster"})


# -- options -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("executor", "options", "says"),
    [
        ("fresh", {"colour": "red"}, "executors.fresh: takes no options (got colour)"),
        pytest.param(
            "fork", {"x": 1}, "executors.fork: takes no options (got x)", marks=LINUX_ONLY
        ),
        ("kubernetes", {"image": "i"}, "executors.kubernetes.colour: unknown option"),
        ("kubernetes", {"image": "i", "pvc": "p"}, "executors.kubernetes.mount_path: required"),
        (
            "kubernetes",
            {"image": "i", "namespce": "x"},
            "executors.kubernetes.namespce: unknown option; did you mean 'namespace'?",
        ),
        ("slurm", {}, "executors.slurm.log_dir: required"),
        (
            "slurm",
            {"log_dir": "/l", "partiton": "p"},
            "executors.slurm.partiton: unknown option; did you mean 'partition'?",
        ),
        (f"{HERE}:make_fake", {"size": 1}, "executors.fakejobs: unknown option"),
        ("nope", {}, "unknown executor 'nope'"),
    ],
)
def test_bad_options_are_refused_by_the_config_without_starting_anything(
    tmp_path: Path, executor: str, options: dict[str, Any], says: str
) -> None:
    if executor == "kubernetes" and "mount_path" not in says:
        options = {"pvc": "p", "mount_path": "/w", "colour": "red", **options}
        if "namespce" in options:
            del options["colour"]
    raw = {"state_dir": str(tmp_path), "executor": executor, "executors": {executor: options}}
    with pytest.raises(ValidationError, match=re.escape(says)):
        DaemonConfig.model_validate(raw)


@LINUX_ONLY
def test_auto_checks_the_options_of_the_executor_it_resolves_to(tmp_path: Path) -> None:
    raw = {"state_dir": str(tmp_path), "executors": {"fork": {"x": 1}}}  # auto: fork here
    with pytest.raises(ValidationError, match=re.escape("executors.fork: takes no options")):
        DaemonConfig.model_validate(raw)


class FakeOptions(registry.ExecutorOptions):
    colour: str = "blue"


def make_modelled(options: FakeOptions) -> FakeJobs:
    made = FakeJobs()
    made.name = options.colour  # what the factory was given, for the test to see
    return made


make_modelled.options_model = FakeOptions  # type: ignore[attr-defined]


def make_badly_modelled(options: object) -> FakeJobs:
    return FakeJobs()


make_badly_modelled.options_model = dict  # type: ignore[attr-defined]


def test_a_factory_with_an_options_model_gets_the_models_instance(tmp_path: Path) -> None:
    made = make_executor(f"{HERE}:make_modelled", {"colour": "red"}, tmp_path)
    assert made.name == "red"
    assert make_executor(f"{HERE}:make_modelled", {}, tmp_path).name == "blue"  # defaults
    with pytest.raises(ValueError, match=r"\.color: unknown option; did you mean 'colour'\?$"):
        make_executor(f"{HERE}:make_modelled", {"color": "red"}, tmp_path)


def test_a_factory_without_a_model_gets_the_mapping_as_written(tmp_path: Path) -> None:
    parsed = registry.check_options(f"{HERE}:make_fake", {"colour": "red"})
    assert parsed == {"colour": "red"}


def test_an_options_model_that_is_no_pydantic_model_is_one_line() -> None:
    with pytest.raises(registry.UnknownExecutor, match="its options_model is no pydantic model"):
        registry.check_options(f"{HERE}:make_badly_modelled", {})


def test_options_of_an_executor_not_chosen_are_not_its_business(tmp_path: Path) -> None:
    raw = {"state_dir": str(tmp_path), "executor": "fresh", "executors": {"kubernetes": {}}}
    assert DaemonConfig.model_validate(raw).executors == {"kubernetes": {}}


# -- a JobExecutor through the resumer ------------------------------------------------------------
LAUNCH = Launch(Identity(tenancy.owner_of(0)), {"PATH": "/usr/bin", "DELTA_RESUMED_BY": "deltad"})


def _resumer(tmp_path: Path, **settings: Any) -> tuple[Resumer, FakeJobs, ManualClock]:
    config = DaemonConfig.model_validate(
        {"state_dir": str(tmp_path), "executor": f"{HERE}:make_fake", **settings}
    )
    clock = ManualClock()
    resumer = Resumer(config, clock)
    jobs = resumer.executor
    assert isinstance(jobs, FakeJobs)
    return resumer, jobs, clock


def _start(resumer: Resumer, ws: Path) -> Handle:
    assert resumer.submit(ws, "run1", LAUNCH, 0)
    resumer.start_ready()
    return resumer.children[ws].handle


def test_the_resume_timeout_counts_from_started_not_from_the_submit(tmp_path: Path) -> None:
    resumer, jobs, clock = _resumer(tmp_path, resume_timeout_seconds=60)
    handle = _start(resumer, tmp_path)
    [spec] = jobs.submitted
    assert spec.key.workspace == tmp_path and spec.timeout == 60.0 and spec.identity.uid == 0
    assert resumer.next_deadline() is None  # queued: no timeout yet
    clock.advance(500)  # queued for longer than the timeout: still none
    assert resumer.reap() == [] and resumer.next_deadline() is None
    resumer.enforce_timeouts(clock.monotonic())
    assert jobs.cancelled == []
    began = clock.time()
    clock.advance(2)  # seen two seconds after it began running
    jobs.events.append(Started(handle, began))
    assert resumer.reap() == []
    assert resumer.next_deadline() == clock.monotonic() - 2 + 60.0
    clock.advance(58)
    resumer.enforce_timeouts(clock.monotonic())
    assert jobs.cancelled == [(handle, False)]  # TERM
    jobs.events.append(Exit(handle, -15))
    [fin] = resumer.reap()
    assert fin.resume.timed_out and fin.failed and fin.meaning == "killed_by_SIGTERM"


def test_the_resumer_sends_kill_after_its_grace_when_term_is_ignored(tmp_path: Path) -> None:
    resumer, jobs, clock = _resumer(tmp_path, resume_timeout_seconds=60)
    handle = _start(resumer, tmp_path)
    jobs.events.append(Started(handle, clock.time()))
    resumer.reap()
    clock.advance(60)
    resumer.enforce_timeouts(clock.monotonic())
    assert jobs.cancelled == [(handle, False)]
    assert resumer.next_deadline() == clock.monotonic() + KILL_GRACE_SECONDS  # the KILL's time
    clock.advance(KILL_GRACE_SECONDS - 1)
    resumer.enforce_timeouts(clock.monotonic())
    assert jobs.cancelled == [(handle, False)]  # within the grace
    clock.advance(1)
    resumer.enforce_timeouts(clock.monotonic())
    resumer.enforce_timeouts(clock.monotonic())
    assert jobs.cancelled == [(handle, False), (handle, True)]  # KILL, once
    assert resumer.next_deadline() is None
    jobs.events.append(Exit(handle, -9))
    [fin] = resumer.reap()
    assert fin.meaning == "killed_by_SIGKILL" and fin.resume.timed_out


def test_the_key_names_the_request_answered(tmp_path: Path) -> None:
    resumer, jobs, _ = _resumer(tmp_path)
    assert resumer.submit(tmp_path / "a", "run1", LAUNCH, 0, request="q-7")
    assert resumer.submit(tmp_path / "b", "run2", LAUNCH, 0)
    resumer.start_ready()
    assert [(s.key.run_id, s.key.request) for s in jobs.submitted] == [
        ("run1", "q-7"),
        ("run2", "resume"),  # nothing named: the default
    ]


def test_a_job_gets_no_daemon_side_log_path(tmp_path: Path) -> None:
    # The daemon's resume log is in its own state dir; the owner's job on another node cannot
    # write it (every Slurm job FAILED with it): the engine keeps the job's output instead.
    resumer, jobs, _ = _resumer(tmp_path)
    _start(resumer, tmp_path)
    [spec] = jobs.submitted
    assert spec.log is None and spec.env["DELTA_RESUMED_BY"] == "deltad"


def test_an_exit_is_a_finished_resume_and_frees_the_slot(tmp_path: Path) -> None:
    resumer, jobs, _ = _resumer(tmp_path, max_parallel_resumes=4)
    handle = _start(resumer, tmp_path)
    assert resumer.slots() == 3
    assert not resumer.submit(tmp_path, "run1", LAUNCH, 0)  # one resume per workspace
    jobs.events.append(Exit(Handle(handle.key, "fakejobs", "another"), 0))  # not ours: ignored
    jobs.events.append(Exit(handle, 3, detail="FAILED"))
    [fin] = resumer.reap()
    assert fin.resume.handle == handle and fin.rc == 3 and fin.detail == "FAILED"
    assert resumer.children == {} and resumer.slots() == 4


@pytest.mark.parametrize(
    ("rc", "timed_out", "failed", "meaning"),
    [
        (0, False, False, "completed"),
        (75, False, False, "busy"),  # another process drives the run: not a failure
        (101, False, False, "waiting"),
        (2, False, True, "usage_error"),
        (-9, False, True, "killed_by_SIGKILL"),
        (None, False, False, "unknown"),  # what the run left on disk decides
        (0, True, True, "completed"),  # timed out, whatever the code
    ],
)
def test_an_exit_has_a_meaning_and_a_verdict(
    tmp_path: Path, rc: int | None, timed_out: bool, failed: bool, meaning: str
) -> None:
    resumer, jobs, _ = _resumer(tmp_path)
    handle = _start(resumer, tmp_path)
    jobs.events.append(Exit(handle, rc, timed_out=timed_out))
    [fin] = resumer.reap()
    assert (fin.failed, fin.meaning) == (failed, meaning)


def test_a_second_resume_of_a_workspace_is_a_new_key(tmp_path: Path) -> None:
    resumer, jobs, _ = _resumer(tmp_path)
    first = _start(resumer, tmp_path)
    jobs.events.append(Exit(first, 0))
    resumer.reap()
    _start(resumer, tmp_path)
    assert len({s.key for s in jobs.submitted}) == 2


def test_adopt_asks_the_executor_and_the_adopted_job_is_not_started_again(tmp_path: Path) -> None:
    config = DaemonConfig.model_validate(
        {"state_dir": str(tmp_path), "executor": f"{HERE}:make_fake"}
    )
    resumer = Resumer(config, ManualClock())
    left = Handle(RequestKey(tmp_path / "b", "r", "resume", 1), "fakejobs", "j")
    FakeJobs.left_over = [left]
    try:
        [adopted] = resumer.children.values()
    finally:
        FakeJobs.left_over = []
    assert adopted.adopted and adopted.workspace == tmp_path / "b" and adopted.run_id == "r"
    assert not resumer.submit(tmp_path / "b", "r", LAUNCH, 0)


def test_a_resume_queued_before_adoption_is_the_adopted_job_never_a_second_one(
    tmp_path: Path,
) -> None:
    """The startup reconcile queues every answered workspace before the engine has said which
    jobs exist; the adopted job is that resume. Held back by the owner's slot cap, the queued
    entry used to start once the adopted job ended: a second job of one answer."""
    (tmp_path / "a").mkdir()
    FakeJobs.away = True
    try:
        resumer, jobs, clock = _resumer(tmp_path, max_parallel_resumes_per_owner=1)
    finally:
        FakeJobs.away = False
    assert resumer.submit(tmp_path / "a", "r", LAUNCH, 0)  # os.lstat(a).st_uid: root, 0
    resumer.start_ready()
    assert jobs.submitted == [] and not resumer.jobs_known  # waits for the engine
    left = Handle(RequestKey(tmp_path / "a", "r", "resume", 1), "fakejobs", "j")
    jobs.unreachable, jobs.found = False, [left]
    clock.advance(1)
    resumer.reap()  # adoption, tried again
    assert resumer.children[tmp_path / "a"].adopted and not resumer.pending
    resumer.start_ready()
    jobs.events.append(Exit(left, 0))
    [fin] = resumer.reap()
    resumer.start_ready()
    assert fin.resume.handle == left and jobs.submitted == []
    assert not resumer.busy_with(tmp_path / "a")


def test_a_permanently_refused_submit_starts_nothing_and_is_not_retried(tmp_path: Path) -> None:
    resumer, jobs, _ = _resumer(tmp_path)
    jobs.refuse = "permanent"
    assert resumer.submit(tmp_path, "run1", LAUNCH, 0)
    resumer.start_ready()
    assert resumer.children == {} and resumer.slots() > 0
    assert not resumer.busy_with(tmp_path) and not resumer.pending


def test_a_refused_submit_is_tried_again_with_pacing_and_said_once(tmp_path: Path) -> None:
    """The engine away: the resume stays queued (busy: no second one), is submitted again after
    SUBMIT_RETRY's delays, and the failure is logged once, not at every try."""
    resumer, jobs, clock = _resumer(tmp_path)
    jobs.refuse = True
    with capture_logs() as logs:
        assert resumer.submit(tmp_path, "run1", LAUNCH, 0)
        resumer.start_ready()
        assert resumer.children == {} and resumer.busy_with(tmp_path)
        first = SUBMIT_RETRY.delay(1)
        assert resumer.next_poll(clock.monotonic()) == clock.monotonic() + first
        assert not resumer.can_start()
        clock.advance(first)
        assert resumer.can_start()
        resumer.start_ready()  # refused again
        assert resumer.next_poll(clock.monotonic()) == clock.monotonic() + SUBMIT_RETRY.delay(2)
        jobs.refuse = False
        clock.advance(SUBMIT_RETRY.delay(2))
        resumer.start_ready()
    assert tmp_path in resumer.children and len(jobs.submitted) == 1
    said = [e["event"] for e in logs if e["log_level"] in ("error", "info", "warning")]
    assert said.count("resume_spawn_failed") == 1
    [spawned] = [e for e in logs if e["event"] == "resume_spawned"]
    assert spawned["failed_before"] == 2


def test_a_submit_the_engine_refused_later_is_tried_again(tmp_path: Path) -> None:
    """An executor submitting from its worker says `Refused`: the resume goes back to the
    queue and is submitted again (a new key attempt) after the pacing delay."""
    resumer, jobs, clock = _resumer(tmp_path)
    handle = _start(resumer, tmp_path)
    jobs.events.append(Refused(handle, "slurm: squeue did not answer"))
    assert resumer.reap() == []
    assert tmp_path not in resumer.children and resumer.busy_with(tmp_path)
    clock.advance(SUBMIT_RETRY.delay(1))
    resumer.start_ready()
    again = resumer.children[tmp_path].handle
    assert again != handle and again.key.workspace == tmp_path and len(jobs.submitted) == 2


def test_an_executor_that_raises_never_stops_the_daemon(tmp_path: Path) -> None:
    resumer, jobs, clock = _resumer(tmp_path, resume_timeout_seconds=1)
    handle = _start(resumer, tmp_path)
    jobs.events.append(Started(handle, clock.time()))
    resumer.reap()
    jobs.broken = True
    with capture_logs() as logs:
        assert resumer.reap() == [] and resumer.reap() == []
        clock.advance(1)
        resumer.enforce_timeouts(clock.monotonic())  # cancel raises: logged
        assert resumer.submit(tmp_path / "other", "r", LAUNCH, 0)
        resumer.start_ready()  # submit raises: that resume fails, said
    failed = [(e["event"], e.get("call")) for e in logs if e["log_level"] == "error"]
    assert failed.count(("executor_call_failed", "poll")) == 1  # once per distinct failure
    assert ("executor_call_failed", "cancel") in failed
    assert ("resume_spawn_failed", None) in failed
    assert tmp_path in resumer.children  # still watched


def test_the_loop_polls_as_often_as_the_executor_asks(tmp_path: Path) -> None:
    resumer, _, _ = _resumer(tmp_path)
    assert resumer.next_poll(100.0) is None  # nothing running: nothing to poll
    _start(resumer, tmp_path / "ws")
    assert resumer.next_poll(100.0) == 100.05


def test_the_loop_polls_when_the_executor_says_something_is_due(tmp_path: Path) -> None:
    resumer, jobs, _ = _resumer(tmp_path)
    jobs.poll_every = None
    _start(resumer, tmp_path / "ws")
    assert resumer.next_poll(100.0) is None
    jobs.due_at = 107.0  # monotonic, like the `now` it was given
    assert resumer.next_poll(100.0) == 107.0


# -- the resumer's decisions, from tables ------------------------------------------------------
ALICE = Owner(1001, 1002, "alice", "/home/alice", (1002, 27))
DAEMON = Owner(1000, 1000, "deltad", "/var/lib/deltad", (1000,))


@pytest.mark.parametrize(
    ("owner", "policy", "identity"),
    [
        # root runs a resume as its owner: uid, gid and every group
        (ALICE, Policy(daemon_uid=0), JobIdentity(1001, 1002, (1002, 27), "alice")),
        # a non-root daemon runs a trusted owner's resume as itself
        (ALICE, Policy(daemon_uid=1000), JobIdentity(1000, 1000, (), "deltad")),
        # its own workspace: as itself
        (DAEMON, Policy(daemon_uid=1000), JobIdentity(1000, 1000, (), "deltad")),
    ],
)
def test_a_job_runs_as_tenancy_decided(
    owner: Owner, policy: Policy, identity: JobIdentity, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tenancy, "owner_of", lambda uid: DAEMON)
    launch = Launch(Identity.for_owner(owner, policy), {"HOME": "/h"})
    spec = spec_of(Path("/w"), None, ["delta"], launch, 60.0, 3)
    assert spec.identity == identity
    assert spec.key == RequestKey(Path("/w"), "", "resume", 3) and spec.log is None


@pytest.mark.parametrize(
    ("now_mono", "now_wall", "at_wall", "started"),
    [
        (100.0, 1000.0, 990.0, 90.0),  # began ten seconds ago
        (100.0, 1000.0, 1000.0, 100.0),
        (100.0, 1000.0, 1005.0, 100.0),  # an engine's clock ahead of ours: not in the future
    ],
)
def test_a_start_on_the_wall_clock_is_placed_on_the_monotonic_one(
    now_mono: float, now_wall: float, at_wall: float, started: float
) -> None:
    assert started_at(now_mono, now_wall, at_wall) == started


def test_an_engine_that_cannot_be_asked_leaves_the_jobs_unknown_until_it_answers(
    tmp_path: Path,
) -> None:
    """adopt() failing is no crash: `jobs_known` is False (runs on other hosts are left as
    they are), the loop keeps polling, and adoption is tried again every `poll_every`."""
    FakeJobs.away = True
    try:
        with capture_logs() as logs:
            resumer, jobs, clock = _resumer(tmp_path)
            assert resumer.children == {} and not resumer.jobs_known
            # nothing running, yet there is something to ask again: at poll_every
            assert resumer.next_poll(clock.monotonic()) == clock.monotonic() + 0.05
            clock.advance(0.05)
            assert resumer.reap() == [] and not resumer.jobs_known  # still away
    finally:
        FakeJobs.away = False
    [failed] = [e for e in logs if e["event"] == "resume_adopt_failed"]  # said once
    assert failed["error"] == "the engine is away"
    jobs.unreachable = False
    jobs.found = [Handle(RequestKey(tmp_path / "b", "r", "resume", 1), "fakejobs", "j")]
    assert resumer.reap() == [] and resumer.children == {}  # not before poll_every
    clock.advance(0.05)
    assert resumer.reap() == [] and resumer.jobs_known
    assert resumer.children[tmp_path / "b"].adopted
    assert resumer.next_poll(clock.monotonic()) == clock.monotonic() + 0.05  # watching it


def test_of_two_jobs_left_for_one_workspace_the_newest_is_adopted(tmp_path: Path) -> None:
    """An old ended job (its delete failed) and the resume running now: the running one stands
    for the workspace, so its run is judged by it, not by the old one's end."""
    old = Handle(RequestKey(tmp_path, "r", "resume", 5), "fakejobs", "old")
    new = Handle(RequestKey(tmp_path, "r", "resume", 9), "fakejobs", "new")
    FakeJobs.left_over = [old, new]
    try:
        resumer, _, _ = _resumer(tmp_path)
    finally:
        FakeJobs.left_over = []
    [adopted] = resumer.children.values()
    assert adopted.handle == new
