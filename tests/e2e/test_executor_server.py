"""The executors in-process against a real fork server: exit codes and cancels through it, the
fallback to fresh processes when it cannot start, the restart when the installed package
changes (each server imports the client and openai: seconds, hence not in tests/unit)."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from deltad.daemon.executors import Job
from deltad.daemon.executors import fork as forkmod
from deltad.daemon.executors.fork import ForkExecutor
from deltad.daemon.tenancy import SAFE_PATH, Identity, Launch, Owner, Policy
from deltad.testing.daemon import answer, reap_one
from deltad.testing.stub import paused_workspace

DEADLINE = 30.0


def _launch() -> Launch:
    me = Owner.of_uid(os.getuid())
    return Launch(Identity.for_owner(me, Policy()), {"PATH": SAFE_PATH, "HOME": me.home})


def _job(tmp: Path, mode: str, name: str = "ws") -> Job:
    ws = tmp / name
    paused_workspace(ws)
    answer(ws, "yes")  # so that `hang` ingests it, then hangs
    argv = [sys.executable, "-m", "deltad.testing.stub", "stub", str(ws)]
    argv += ["--record", str(tmp / "record.jsonl"), "--mode", mode]
    return Job(ws, None, argv, _launch(), 60.0, tmp / "logs" / f"{name}.log")


@pytest.fixture(scope="module")
def forked() -> Iterator[ForkExecutor]:
    ex = ForkExecutor(4)
    yield ex
    ex.close()


def test_the_fork_server_reports_exit_codes(forked: ForkExecutor, tmp_path: Path) -> None:
    child = forked.submit(_job(tmp_path, "fail"))
    assert child is not None and forked.forked(child)
    assert forked.submit(_job(tmp_path, "fail")) is child  # idempotent per workspace
    fin = reap_one(forked)
    assert (fin.child, fin.rc, fin.failed) == (child, 2, True)


def test_cancel_goes_through_the_server(forked: ForkExecutor, tmp_path: Path) -> None:
    child = forked.submit(_job(tmp_path, "hang"))
    assert child is not None
    forked.cancel(child, grace=60.0)
    fin = reap_one(forked)
    assert (fin.rc, fin.meaning) == (-signal.SIGTERM, "killed_by_SIGTERM")


def test_a_server_that_cannot_start_falls_back_to_fresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(forkmod, "SERVER_MODULE", "deltad.no_such_module")
    ex = ForkExecutor(4)
    try:
        with capture_logs() as logs:
            child = ex.submit(_job(tmp_path, "fail"))
        assert child is not None and not ex.forked(child)
        assert [e["event"] for e in logs if e["log_level"] == "warning"] == [
            "fork_server_unhealthy"
        ]
        assert reap_one(ex).rc == 2  # the fresh process's exit code
    finally:
        ex.close()


def test_a_changed_package_restarts_the_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ex = ForkExecutor(4)
    try:
        assert ex.server is not None
        old = ex.server.proc
        hold = ex.submit(_job(tmp_path, "hang", "held"))
        assert hold is not None
        monkeypatch.setattr(forkmod, "package_signature", lambda: "changed")
        monkeypatch.setattr(forkmod, "SIGNATURE_EVERY", 0.0)
        child = ex.submit(_job(tmp_path, "fail"))
        assert child is not None and ex.forked(child)
        assert ex.server is not None and ex.server.proc.pid != old.pid
        assert old.poll() is None  # draining: it still reports the held child's exit
        assert reap_one(ex).rc == 2
        ex.cancel(hold, grace=60.0)
        assert reap_one(ex).rc == -signal.SIGTERM
        assert old.wait(timeout=DEADLINE) is not None  # then it is gone
    finally:
        ex.close()
