"""The job-handle seam's contract as pytest tests any executor package runs.

Subclass `ExecutorContract` in a test module (its name must start with `Test` for pytest to
collect it) and say how to make the executor::

    from deltad.testing.executor_contract import ExecutorContract

    class TestMyExecutor(ExecutorContract):
        name = "mine"  # as registered in the `deltad.executors` entry-point group
        bad_options = [{"no_such_option": 1}]

        def make(self, state_dir):
            return MyExecutor(...)

Then `pytest tests/test_contract.py`. It checks what the daemon relies on (deltad/executors/
seam.py): the executor is a `JobExecutor`; `submit` is idempotent on the key; `Started` comes
before `Exit` and the exit code comes back; `cancel(force=False)` then `cancel(force=True)`
ends a job that ignores TERM (the daemon escalates, not the executor); `close` leaves jobs
running and a new executor `adopt`s them; `poll` is given monotonic time and returns promptly;
during an engine outage (where the subclass can make one: `outage()`) no call raises anything
but `SubmitError` and `poll` stays prompt; bad options are a one-line ValueError at config time.

Hooks with defaults: `workspace` (a directory the job's user owns), `identity` (whom jobs run
as: this process's user), `env`, `outage`, `keeps_ended` (the engine still lists a job that
ended while no executor ran), `deadline`, `poll_budget`.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import select
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest

from deltad.executors import registry
from deltad.executors.seam import (
    AdoptPending,
    Event,
    Exit,
    Handle,
    Identity,
    JobExecutor,
    JobSpec,
    Refused,
    RequestKey,
    Started,
    SubmitError,
)

_attempts = itertools.count(1)


class ExecutorContract:
    """The contract's tests; a subclass provides `make` (and `name`, `bad_options`)."""

    name: ClassVar[str] = ""  # the registry name; empty: the options checks are skipped
    bad_options: ClassVar[list[Mapping[str, Any]]] = []
    keeps_ended: ClassVar[bool] = False  # adopt() lists jobs that ended meanwhile
    deadline: ClassVar[float] = 120.0  # seconds to wait for any one thing (a condition)
    # Seconds one seam call may take during an engine outage: generous (a loaded CI machine),
    # yet far below what waiting on a hung engine takes (its timeouts, tens of seconds).
    poll_budget: ClassVar[float] = 5.0

    # -- hooks ------------------------------------------------------------------------------
    def make(self, state_dir: Path) -> JobExecutor:
        raise NotImplementedError("ExecutorContract.make: return your executor")

    def workspace(self, tmp_path: Path) -> Path:
        ws = tmp_path / f"ws{next(_attempts)}"
        ws.mkdir()
        return ws

    def identity(self) -> Identity:
        return Identity(os.getuid(), os.getgid())

    def env(self) -> dict[str, str]:
        return {"PATH": "/usr/bin:/bin"}

    def outage(self, executor: JobExecutor) -> contextlib.AbstractContextManager[None] | None:
        """The engine unreachable or hung while the context is open; None: cannot be made."""
        return None

    # -- helpers ----------------------------------------------------------------------------
    def spec(self, ws: Path, script: str, request: str = "q") -> JobSpec:
        key = RequestKey(ws, "run", request, next(_attempts))
        return JobSpec(key, ["/bin/sh", "-c", script], self.identity(), self.env(), 3600.0)

    def call(self, fn: Callable[..., Any], *args: Any, budget: bool = False) -> Any:
        """One seam call; with `budget`, one that must return within `poll_budget`."""
        began = time.monotonic()
        result = fn(*args)
        took = time.monotonic() - began
        assert not budget or took <= self.poll_budget, f"{fn.__name__} blocked {took:.1f} s"
        return result

    def wait(
        self,
        ex: JobExecutor,
        done: Callable[[list[Event]], bool],
        what: str,
        events: list[Event] | None = None,
    ) -> list[Event]:
        """Poll as the daemon does (select on fds, `poll_every`, `due`) until `done`."""
        seen = events if events is not None else []
        end = time.monotonic() + self.deadline
        while not done(seen):
            now = time.monotonic()
            assert now < end, f"timed out waiting for {what}; events: {seen}"
            wait = ex.poll_every if ex.poll_every is not None else 1.0
            if (due := ex.due(now)) is not None:
                wait = min(wait, max(0.0, due - now))
            fds = self.call(ex.fds)
            if fds:
                select.select(fds, [], [], wait)
            else:
                time.sleep(wait)
            new = self.call(ex.poll, time.monotonic())
            assert all(isinstance(e, Started | Exit | Refused) for e in new), new
            seen.extend(new)
        return seen

    @staticmethod
    def ended(handle: Handle) -> Callable[[list[Event]], bool]:
        return lambda evs: any(isinstance(e, Exit | Refused) and e.handle == handle for e in evs)

    @staticmethod
    def exit_of(handle: Handle, events: list[Event]) -> Exit:
        refused = [e for e in events if isinstance(e, Refused) and e.handle == handle]
        assert not refused, f"the engine refused the job: {refused[0].reason}"
        return next(e for e in events if isinstance(e, Exit) and e.handle == handle)

    @pytest.fixture
    def executor(self, tmp_path: Path) -> Iterator[JobExecutor]:
        state = tmp_path / "state"
        state.mkdir(mode=0o700, exist_ok=True)
        ex = self.make(state)
        try:
            yield ex
        finally:
            ex.close()

    # -- the contract ---------------------------------------------------------------------------
    def test_it_is_a_job_executor(self, executor: JobExecutor) -> None:
        assert isinstance(executor, JobExecutor)
        assert isinstance(executor.name, str) and executor.name
        assert executor.poll_every is None or executor.poll_every > 0

    def test_started_comes_before_exit_with_the_code(
        self, executor: JobExecutor, tmp_path: Path
    ) -> None:
        handle = self.call(executor.submit, self.spec(self.workspace(tmp_path), "exit 3"))
        events = self.wait(executor, self.ended(handle), "the job's exit")
        end = self.exit_of(handle, events)
        mine = [e for e in events if e.handle == handle]
        starts = [i for i, e in enumerate(mine) if isinstance(e, Started)]
        assert len(starts) <= 1 and (not starts or starts[0] < mine.index(end))
        assert end.rc in (3, None) and end.meaning in ("failed", "unexpected", "unknown")
        assert not any(isinstance(e, Started) and e.at > time.time() + 5 for e in mine), (
            "Started.at is wall clock"
        )

    def test_submit_is_idempotent_on_the_key(self, executor: JobExecutor, tmp_path: Path) -> None:
        ws = self.workspace(tmp_path)
        spec = self.spec(ws, "echo x >> ran; sleep 1")
        first = self.call(executor.submit, spec)
        again = self.call(executor.submit, spec)
        assert again == first
        events = self.wait(executor, self.ended(first), "the job's exit")
        assert self.exit_of(first, events).rc in (0, None)
        assert len([e for e in events if isinstance(e, Exit)]) == 1
        assert (ws / "ran").read_text() == "x\n"  # one job ran, once

    def test_cancel_then_force_ends_a_job_that_ignores_term(
        self, executor: JobExecutor, tmp_path: Path
    ) -> None:
        ws = self.workspace(tmp_path)
        handle = self.call(
            executor.submit, self.spec(ws, 'trap "" TERM; touch ready; exec sleep 600')
        )
        events = self.wait(executor, lambda _: (ws / "ready").exists(), "the job running")
        self.call(executor.cancel, handle, False)  # TERM, which it ignores
        self.call(executor.cancel, handle, True)  # the daemon's KILL after its grace
        events = self.wait(executor, self.ended(handle), "the killed job's exit", events)
        end = self.exit_of(handle, events)
        assert end.rc is None or end.rc < 0 or end.rc > 128, end

    def test_cancel_of_an_unknown_handle_is_no_error(
        self, executor: JobExecutor, tmp_path: Path
    ) -> None:
        key = RequestKey(tmp_path / "nowhere", "run", "q", 0)
        self.call(executor.cancel, Handle(key, executor.name, "no-such-job"), False)

    def test_close_leaves_jobs_running_and_a_new_executor_adopts_them(
        self, executor: JobExecutor, tmp_path: Path
    ) -> None:
        ws = self.workspace(tmp_path)
        handle = self.call(executor.submit, self.spec(ws, "touch ready; exec sleep 600"))
        self.wait(executor, lambda _: (ws / "ready").exists(), "the job running")
        self.call(executor.close)
        again = self.make(tmp_path / "state")
        try:
            adopted = self.adopt(again)
            [mine] = [h for h in adopted if h.key == handle.key]
            self.call(again.cancel, mine, True)
            events = self.wait(again, self.ended(mine), "the adopted job's exit")
            self.exit_of(mine, events)
        finally:
            again.close()

    def test_adopt_reports_a_job_that_ended_while_no_executor_ran(
        self, executor: JobExecutor, tmp_path: Path
    ) -> None:
        if not self.keeps_ended:
            pytest.skip("the engine keeps no record of ended jobs (keeps_ended = False)")
        ws = self.workspace(tmp_path)
        handle = self.call(executor.submit, self.spec(ws, "touch ready; sleep 1; exit 4"))
        self.wait(executor, lambda _: (ws / "ready").exists(), "the job running")
        self.call(executor.close)
        again = self.make(tmp_path / "state")
        try:
            deadline = time.monotonic() + self.deadline
            while True:
                adopted = self.adopt(again)
                mine = [h for h in adopted if h.key == handle.key]
                if mine:
                    break
                assert time.monotonic() < deadline, "the ended job was never listed"
            events = self.wait(again, self.ended(mine[0]), "the ended job's exit")
            assert self.exit_of(mine[0], events).rc in (4, None)
        finally:
            again.close()

    def adopt(self, ex: JobExecutor) -> list[Handle]:
        """adopt(), asked again while the worker's first answer is on its way."""
        end = time.monotonic() + self.deadline
        while True:
            try:
                handles: list[Handle] = self.call(ex.adopt)
                return handles
            except AdoptPending:
                assert time.monotonic() < end, "adopt() never had an answer"
                fds = ex.fds()
                if fds:
                    select.select(fds, [], [], 1.0)
                    self.call(ex.poll, time.monotonic())
                else:
                    time.sleep(0.05)

    def test_an_outage_never_raises_nor_blocks(self, executor: JobExecutor, tmp_path: Path) -> None:
        ws = self.workspace(tmp_path)
        handle = None
        outage = self.outage(executor)
        if outage is None:
            pytest.skip("no engine outage can be made for this executor (outage() is None)")
        with outage:
            with contextlib.suppress(SubmitError):
                handle = self.call(executor.submit, self.spec(ws, "exit 0"), budget=True)
            for _ in range(3):
                self.call(executor.poll, time.monotonic(), budget=True)
                fds = self.call(executor.fds, budget=True)
                select.select(fds, [], [], 0.2) if fds else time.sleep(0.2)
            with contextlib.suppress(SubmitError):
                self.call(executor.adopt, budget=True)
            if handle is not None:
                self.call(executor.cancel, handle, False, budget=True)
        if handle is not None:  # taken, or refused (the daemon submits again): never lost
            self.wait(executor, self.ended(handle), "the job's end or refusal after the outage")

    def test_bad_options_are_a_one_line_error(self) -> None:
        if not self.name or not self.bad_options:
            pytest.skip("no registry name or no bad options to try")
        for options in self.bad_options:
            with pytest.raises(ValueError) as e:
                registry.check_options(self.name, options)
            assert "\n" not in str(e.value) and str(e.value)
