"""The executors in-process: how a command is planned, which executor `auto` means, exit codes
and cancels through a real fork server, the fallback to fresh processes, the restart when the
installed package changes, and adopting what an earlier daemon left running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from deltad.daemon.executors import Executor, Finished, Job, Orphan, exit_meaning, orphans, resolve
from deltad.daemon.executors import fork as forkmod
from deltad.daemon.executors.base import start_ticks
from deltad.daemon.executors.fork import ForkExecutor, plan
from deltad.daemon.executors.fresh import FreshExecutor
from deltad.daemon.tenancy import SAFE_PATH, Identity, Launch, Owner, Policy
from deltad.testing.daemon import answer
from deltad.testing.stub import paused_workspace

HERE = Path(sys.executable).parent
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


def _reap_one(ex: Executor) -> Finished:
    end = time.monotonic() + DEADLINE
    while time.monotonic() < end:
        if done := ex.reap():
            [fin] = done
            return fin
        time.sleep(0.01)
    raise AssertionError("no child exited")


def test_plans() -> None:
    delta = str(HERE / "delta")
    assert plan([delta, "run", "--work-dir", "/w"]) == {
        "kind": "delta",
        "argv": [delta, "run", "--work-dir", "/w"],
    }
    assert plan([sys.executable, "-m", "mod", "a"]) == {
        "kind": "module",
        "module": "mod",
        "argv": ["a"],
    }
    for other in (["systemd-run", "--wait", delta], ["/usr/bin/env", "-m", "x"]):
        assert plan(other)["kind"] == "exec"


def test_auto_forks_what_can_run_warm_and_runs_wrappers_as_commands() -> None:
    delta = [str(HERE / "delta"), "run", "--work-dir", "/w"]
    assert resolve("auto", delta) == "fork"
    assert resolve("auto", ["systemd-run", "--wait", *delta]) == "command"
    assert resolve("fresh", delta) == "fresh"
    assert resolve("fork", ["/bin/true"]) == "fork"  # exec'd from the fork: works, not warm


def test_an_unknown_exit_code_is_not_a_failure() -> None:
    assert exit_meaning(None) == "unknown"
    assert exit_meaning(-9) == "killed_by_SIGKILL"


@pytest.fixture(scope="module")
def forked() -> Iterator[ForkExecutor]:
    ex = ForkExecutor(4)
    yield ex
    ex.close()


def test_the_fork_server_reports_exit_codes(forked: ForkExecutor, tmp_path: Path) -> None:
    child = forked.submit(_job(tmp_path, "fail"))
    assert child is not None and forked.forked(child)
    assert forked.submit(_job(tmp_path, "fail")) is child  # idempotent per workspace
    fin = _reap_one(forked)
    assert (fin.child, fin.rc, fin.failed) == (child, 2, True)


def test_cancel_goes_through_the_server(forked: ForkExecutor, tmp_path: Path) -> None:
    child = forked.submit(_job(tmp_path, "hang"))
    assert child is not None
    forked.cancel(child, grace=60.0)
    fin = _reap_one(forked)
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
        assert _reap_one(ex).rc == 2  # the fresh process's exit code
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
        assert _reap_one(ex).rc == 2
        ex.cancel(hold, grace=60.0)
        assert _reap_one(ex).rc == -signal.SIGTERM
        assert old.wait(timeout=DEADLINE) is not None  # then it is gone
    finally:
        ex.close()


def test_orphans_round_trip_and_adoption(tmp_path: Path) -> None:
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        ticks = start_ticks(proc.pid)
        assert ticks is not None
        ws = tmp_path / "ws"
        left = [
            Orphan(ws, "r1", proc.pid, ticks, 1.0, time.time() + 60),
            Orphan(tmp_path / "recycled", None, proc.pid, ticks + 1, 1.0, 0.0),
            Orphan(tmp_path / "impossible", None, 2**22, 0, 1.0, 0.0),
        ]
        ex = FreshExecutor(4)
        [child] = ex.adopt(left)
        assert (child.workspace, child.pid, child.adopted) == (ws, proc.pid, True)
        orphans.save(tmp_path, ex.children.values())
        assert [(o.workspace, o.pid, o.start_ticks) for o in orphans.load(tmp_path)] == [
            (ws, proc.pid, ticks)
        ]
        assert ex.reap() == []
        proc.kill()
        proc.wait()
        fin = _reap_one(ex)
        assert (fin.rc, fin.failed, fin.meaning) == (None, False, "unknown")
    finally:
        proc.kill()
        proc.wait()


def test_an_unreadable_orphans_file_is_nothing(tmp_path: Path) -> None:
    (tmp_path / orphans.NAME).write_text("[{]")
    assert orphans.load(tmp_path) == []
    (tmp_path / orphans.NAME).write_text('[{"pid": "x"}]')
    assert orphans.load(tmp_path) == []


def test_an_unknown_executor_is_a_one_line_config_error(tmp_path: Path) -> None:
    from deltad.daemon.config import ConfigError, load_config

    path = tmp_path / "deltad.yaml"
    path.write_text(f"roots: [{tmp_path}]\nexecutor: threads\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert "executor:" in str(e.value) and "\n" not in str(e.value)
