"""`delta run` started by deltad that finds nothing to do (another process already took or
finished the run) exits 75, busy, and the daemon logs no failure; a person gets exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from deltad.testing import FakeLLM
from tests.support.daemon import Daemon, wait_for

from ..conftest import Delta, bin_path, llm_env

BY_DAEMON = {"DELTA_RESUMED_BY": "deltad"}


@pytest.fixture
def completed(delta: Delta, fake: FakeLLM) -> Delta:
    fake.reply("All done.")
    r = delta.start("finish at once")
    assert r.code == 0, r.err
    assert delta.status() == "COMPLETED"
    return delta


def test_a_person_still_gets_the_usage_error(completed: Delta) -> None:
    r = completed("run")
    assert r.code == 2 and "start a new run" in r.err
    r = completed("run", "--run-id", completed.run_dir.name)
    assert r.code == 2 and "nothing to resume" in r.err


@pytest.mark.parametrize("by_id", [False, True], ids=["latest", "run-id"])
def test_a_daemon_resume_of_a_finished_run_is_busy(completed: Delta, by_id: bool) -> None:
    args = ["--run-id", completed.run_dir.name] if by_id else []
    r = completed("run", *args, env=BY_DAEMON)
    assert r.code == 75, r.err
    assert "already took or finished it" in r.err
    assert "Traceback" not in r.err
    assert completed.status() == "COMPLETED"  # nothing touched


def test_the_daemon_logs_no_failure_when_another_process_finished_the_run(
    tmp_path: Path, delta: Delta, fake: FakeLLM
) -> None:
    """The resume command lets a person's `delta run` win the race (it resumes and completes
    the run), then runs the daemon's own `delta run`, which finds COMPLETED."""
    fake.call("ask_human", {"prompt": "Go?"}, id="ask1").reply("Done.")
    assert delta.start("ask first").code == 101
    winner = f'{bin_path("delta")} run --work-dir "$1" >/dev/null 2>&1 </dev/null'
    command = ["/bin/sh", "-c", f'{winner}; exec {bin_path("delta")} run --work-dir "$1"']
    d = Daemon(tmp_path, [delta.ws], resume_command=[*command, "sh", "{workspace}"])
    d.start(env=llm_env(fake))
    try:
        delta.answer("yes")
        [exited] = d.wait_event("resume_exited", workspace=str(delta.ws))
        assert exited["exit_code"] == 75
        d.wait_event("resume_busy", workspace=str(delta.ws))
        wait_for(lambda: delta.status() == "COMPLETED", "the winner's resume completed")
    finally:
        d.stop()
        d.kill_children()
    assert not d.events("resume_backoff")
    assert not [e for e in d.lines() if e.get("level") in ("warning", "error")]
