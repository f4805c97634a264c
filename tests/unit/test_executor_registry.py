"""The executor registry (names, entry points, dotted paths, options) and a `JobExecutor`
driven by the resumer: the timeout counts from Started, `poll_every` is honoured."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from deltad.daemon.clock import ManualClock
from deltad.daemon.config import DaemonConfig
from deltad.daemon.executors import make_executor, registry
from deltad.daemon.executors.adapter import SeamExecutor
from deltad.daemon.executors.base import Job
from deltad.daemon.executors.fresh import CommandExecutor, FreshExecutor
from deltad.daemon.executors.seam import (
    Event,
    Exit,
    Handle,
    JobSpec,
    RequestKey,
    Started,
    SubmitError,
)
from deltad.daemon.resumer import Resumer
from deltad.daemon.tenancy import Identity, Launch, Owner

HERE = "tests.unit.test_executor_registry"
LINUX_ONLY = pytest.mark.linux_only


class FakeJobs:
    """A `JobExecutor` that starts nothing: the test says when a job starts and ends."""

    name = "fakejobs"
    poll_every: float | None = 0.05

    def __init__(self) -> None:
        self.submitted: list[JobSpec] = []
        self.events: list[Event] = []
        self.cancelled: list[tuple[Handle, float]] = []
        self.left: list[Handle] = []
        self.refuse = False

    def submit(self, spec: JobSpec) -> Handle:
        if self.refuse:
            raise SubmitError("the queue is closed")
        self.submitted.append(spec)
        return Handle(spec.key, self.name, f"job-{len(self.submitted)}")

    def poll(self, now: float) -> list[Event]:
        events, self.events = self.events, []
        return events

    def cancel(self, handle: Handle, grace: float) -> None:
        self.cancelled.append((handle, grace))

    def adopt(self) -> list[Handle]:
        if self.refuse:
            raise SubmitError("the engine is away")
        return self.left

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
def test_a_built_in_is_found_by_name(name: str, cls: type) -> None:
    executor = make_executor(name, {}, 3)
    assert type(executor) is cls and executor.max_parallel == 3


def test_an_unknown_name_is_one_line_naming_the_known_ones() -> None:
    with pytest.raises(registry.UnknownExecutor) as e:
        registry.find("nope")
    assert "\n" not in str(e.value) and "'nope'" in str(e.value) and "fresh" in str(e.value)


def test_an_entry_point_in_the_group_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    points = [EntryPoint("fakejobs", f"{HERE}:make_fake", registry.GROUP)]

    def entry_points(*, group: str, name: str | None = None) -> list[EntryPoint]:
        return [p for p in points if p.group == group and name in (None, p.name)]

    monkeypatch.setattr(registry, "entry_points", entry_points)
    assert registry.where("fakejobs") == f"{HERE}:make_fake"
    assert isinstance(make_executor("fakejobs", {}, 1), SeamExecutor)
    with pytest.raises(registry.UnknownExecutor, match="fakejobs"):  # listed among the known
        registry.find("other")


def test_a_dotted_path_is_a_factory() -> None:
    executor = make_executor(f"{HERE}:make_fake", {"colour": "red"}, 2)
    assert isinstance(executor, SeamExecutor) and executor.name == "fakejobs"


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
        ("kubernetes", {"image": "i"}, "executors.kubernetes: unknown option"),
        ("kubernetes", {"image": "i", "pvc": "p"}, "executors.kubernetes.mount_path is required"),
        (f"{HERE}:make_fake", {"size": 1}, "executors.fakejobs: unknown option"),
        ("nope", {}, "unknown executor 'nope'"),
    ],
)
def test_bad_options_are_refused_by_the_config_without_starting_anything(
    tmp_path: Path, executor: str, options: dict[str, Any], says: str
) -> None:
    if executor == "kubernetes" and "mount_path" not in says:
        options = {**options, "pvc": "p", "mount_path": "/w", "colour": "red"}
    raw = {"state_dir": str(tmp_path), "executor": executor, "executors": {executor: options}}
    with pytest.raises(ValidationError, match=re.escape(says)):
        DaemonConfig.model_validate(raw)


def test_options_of_an_executor_not_chosen_are_not_its_business(tmp_path: Path) -> None:
    raw = {"state_dir": str(tmp_path), "executor": "fresh", "executors": {"kubernetes": {}}}
    assert DaemonConfig.model_validate(raw).executors == {"kubernetes": {}}


# -- a JobExecutor through the resumer ------------------------------------------------------------
def _job(ws: Path, timeout: float = 60.0) -> Job:
    launch = Launch(Identity(Owner.of_uid(0)), {"PATH": "/usr/bin"})
    return Job(ws, "run1", ["delta", "run"], launch, timeout, None)


def _seam() -> tuple[SeamExecutor, FakeJobs]:
    executor = make_executor(f"{HERE}:make_fake", {}, 4)
    assert isinstance(executor, SeamExecutor) and isinstance(executor.inner, FakeJobs)
    executor.clock = ManualClock()
    return executor, executor.inner


def test_the_resume_timeout_counts_from_started_not_from_the_submit(tmp_path: Path) -> None:
    executor, jobs = _seam()
    child = executor.submit(_job(tmp_path, timeout=60.0))
    assert child is not None and child.deadline == math.inf  # queued: no timeout yet
    [spec] = jobs.submitted
    assert spec.key.workspace == tmp_path and spec.timeout == 60.0 and spec.identity.uid == 0
    clock = executor.clock
    assert isinstance(clock, ManualClock)
    clock.advance(500)  # queued for longer than the timeout: still no deadline
    assert executor.reap() == [] and child.deadline == math.inf
    began = clock.time()
    clock.advance(2)  # seen two seconds after it began running
    jobs.events.append(Started(child.handle, began))  # type: ignore[attr-defined]
    assert executor.reap() == []
    assert child.deadline == clock.monotonic() - 2 + 60.0


def test_a_job_gets_no_daemon_side_log_path(tmp_path: Path) -> None:
    # The daemon's resume log is in its own state dir; the owner's job on another node cannot
    # write it (every Slurm job FAILED with it): the engine keeps the job's output instead.
    executor, jobs = _seam()
    launch = Launch(Identity(Owner.of_uid(0)), {"PATH": "/usr/bin", "DELTA_RESUMED_BY": "deltad"})
    job = Job(tmp_path, "run1", ["delta", "run"], launch, 60.0, tmp_path / "state" / "x.log")
    assert executor.submit(job) is not None
    [spec] = jobs.submitted
    assert spec.log is None and spec.env["DELTA_RESUMED_BY"] == "deltad"


def test_an_exit_is_a_finished_resume_and_frees_the_slot(tmp_path: Path) -> None:
    executor, jobs = _seam()
    child = executor.submit(_job(tmp_path))
    assert child is not None and executor.slots() == 3
    assert executor.submit(_job(tmp_path)) is child and len(jobs.submitted) == 1  # idempotent
    handle = child.handle  # type: ignore[attr-defined]
    jobs.events.append(Exit(Handle(handle.key, "fakejobs", "another"), 0))  # not ours: ignored
    jobs.events.append(Exit(handle, 3, detail="FAILED"))
    [fin] = executor.reap()
    assert fin.child is child and fin.rc == 3 and executor.children == {}


def test_a_second_resume_of_a_workspace_is_a_new_key(tmp_path: Path) -> None:
    executor, jobs = _seam()
    first = executor.submit(_job(tmp_path))
    assert first is not None
    jobs.events.append(Exit(first.handle, 0))  # type: ignore[attr-defined]
    executor.reap()
    executor.submit(_job(tmp_path))
    assert len({s.key for s in jobs.submitted}) == 2


def test_cancel_and_adopt_go_to_the_engine(tmp_path: Path) -> None:
    executor, jobs = _seam()
    child = executor.submit(_job(tmp_path / "a"))
    assert child is not None
    executor.cancel(child, 7.0)
    assert jobs.cancelled == [(child.handle, 7.0)]  # type: ignore[attr-defined]
    left = Handle(jobs.submitted[0].key.__class__(tmp_path / "b", "r", "resume", 1), "f", "j")
    jobs.left = [left]
    [adopted] = executor.adopt([])
    assert adopted.adopted and adopted.workspace == tmp_path / "b"


def test_a_refused_submit_starts_nothing(tmp_path: Path) -> None:
    executor, jobs = _seam()
    jobs.refuse = True
    assert executor.submit(_job(tmp_path)) is None and executor.children == {}


def test_the_loop_polls_as_often_as_the_executor_asks(tmp_path: Path) -> None:
    config = DaemonConfig.model_validate(
        {"state_dir": str(tmp_path), "executor": f"{HERE}:make_fake"}
    )
    resumer = Resumer(config)
    assert resumer.next_poll(100.0) is None  # nothing running: nothing to poll
    resumer.executor.submit(_job(tmp_path / "ws"))
    assert resumer.next_poll(100.0) == 100.05


def test_an_engine_that_cannot_be_asked_leaves_the_jobs_unknown_until_it_answers(
    tmp_path: Path,
) -> None:
    """adopt() failing is no crash: `jobs_known` is False (runs on other hosts are left as
    they are), the loop keeps polling, and adoption is tried again every `poll_every`."""
    executor, jobs = _seam()
    clock = executor.clock
    assert isinstance(clock, ManualClock)
    jobs.refuse = True
    assert executor.adopt([]) == [] and not executor.jobs_known
    assert executor.needs_polling()  # nothing running, yet there is something to ask again
    jobs.refuse = False
    left = Handle(RequestKey(tmp_path / "b", "r", "resume", 1), "fakejobs", "j")
    jobs.left = [left]
    assert executor.reap() == [] and executor.children == {}  # not before poll_every
    clock.advance(0.05)
    assert executor.reap() == [] and executor.jobs_known
    assert executor.children[tmp_path / "b"].adopted


def test_of_two_jobs_left_for_one_workspace_the_newest_is_adopted(tmp_path: Path) -> None:
    """An old ended job (its delete failed) and the resume running now: the running one stands
    for the workspace, so its run is judged by it, not by the old one's end."""
    executor, jobs = _seam()
    old = Handle(RequestKey(tmp_path, "r", "resume", 5), "fakejobs", "old")
    new = Handle(RequestKey(tmp_path, "r", "resume", 9), "fakejobs", "new")
    jobs.left = [old, new]
    [adopted] = executor.adopt([])
    assert adopted.handle == new  # type: ignore[attr-defined]
