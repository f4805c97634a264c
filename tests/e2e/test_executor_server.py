"""The executors in-process against a real fork server: exit codes and cancels through it, the
fallback to fresh processes when it cannot start, the restart when the installed package
changes (each server imports the client and openai: seconds, hence not in tests/unit)."""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from deltad.core.tenancy import SAFE_PATH, owner_of
from deltad.executors import fork as forkmod
from deltad.executors.fork import ForkExecutor
from deltad.executors.seam import Event, Handle, Identity, JobSpec, Refused, RequestKey
from deltad.testing import FakeLLM
from deltad.testing.stub import paused_workspace
from tests.support.daemon import answer, next_exit, wait_for

from ..conftest import Delta, bin_path

DEADLINE = 30.0


def _job(tmp: Path, mode: str, name: str = "ws") -> JobSpec:
    ws = tmp / name
    paused_workspace(ws)
    answer(ws, "yes")  # so that `hang` ingests it, then hangs
    argv = [sys.executable, "-m", "deltad.testing.stub", "stub", str(ws)]
    argv += ["--record", str(tmp / "record.jsonl"), "--mode", mode]
    me = owner_of(os.getuid())
    env = {"PATH": SAFE_PATH, "HOME": me.home}
    return JobSpec(RequestKey(ws, "", "resume"), argv, Identity(me.uid, me.gid), env, 60.0)


@pytest.fixture(scope="module")
def forked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ForkExecutor]:
    ex = ForkExecutor(tmp_path_factory.mktemp("state"))
    yield ex
    ex.close()


def test_the_fork_server_reports_exit_codes(forked: ForkExecutor, tmp_path: Path) -> None:
    handle = forked.submit(_job(tmp_path, "fail"))
    assert forked.forked(handle) and handle.executor == "fork"
    assert forked.submit(_job(tmp_path, "fail")) == handle  # idempotent on the key
    end = next_exit(forked)
    assert (end.handle, end.rc, end.meaning) == (handle, 2, "usage_error")


def test_cancel_goes_through_the_server(forked: ForkExecutor, tmp_path: Path) -> None:
    handle = forked.submit(_job(tmp_path, "hang"))
    forked.cancel(handle, force=False)
    end = next_exit(forked)
    assert (end.rc, end.meaning) == (-signal.SIGTERM, "killed_by_SIGTERM")


def test_the_server_rehearses_a_resume_in_itself_before_it_is_ready(tmp_path: Path) -> None:
    """A question, its answer and the resume, run in the server as it starts (the model
    answered in-process): `fork_server_ready` says nothing went wrong with it."""
    with capture_logs() as logs:
        ex = ForkExecutor(tmp_path / "state")
        try:
            wait_for(lambda: ex.poll(time.monotonic()) or (ex.server and ex.server.ready), "ready")
        finally:
            ex.close()
    [ready] = [e for e in logs if e["event"] == "fork_server_ready"]
    assert "unrehearsed" not in ready


def test_a_child_whose_set_up_fails_is_refused_never_started(
    forked: ForkExecutor, tmp_path: Path
) -> None:
    """`submit` does not wait for the child to set itself up: a set-up that fails (here a
    program that cannot be exec'd) comes back from `poll` as Refused, with no Started and no
    Exit (the resumer submits it again), and the key is free for that; the server goes on."""
    bad = dataclasses.replace(_job(tmp_path, "fail", "bad"), argv=[str(tmp_path / "no-such")])
    handle = forked.submit(bad)
    assert forked.forked(handle)
    seen: list[Event] = []

    def refused() -> Refused | None:
        seen.extend(e for e in forked.poll(time.monotonic()) if e.handle == handle)
        return next((e for e in seen if isinstance(e, Refused)), None)

    refusal = wait_for(refused, "the child's failed set-up reported")
    assert "FileNotFoundError" in refusal.reason and "no-such" in refusal.reason
    assert seen == [refusal]
    good = forked.submit(_job(tmp_path, "fail", "good"))
    assert next_exit(forked).handle == good  # the refused child's exit is nobody's
    assert not forked.forked(handle)
    again = forked.submit(bad)  # the resumer's next try: a new child
    assert again != handle and isinstance(wait_for(refused_of(forked, again), "again"), Refused)


def refused_of(ex: ForkExecutor, handle: Handle) -> Callable[[], Refused | None]:
    def look() -> Refused | None:
        events = ex.poll(time.monotonic())
        return next((e for e in events if isinstance(e, Refused) and e.handle == handle), None)

    return look


def test_a_server_that_cannot_start_falls_back_to_fresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(forkmod, "SERVER_MODULE", "deltad.no_such_module")
    ex = ForkExecutor(tmp_path / "state")
    try:
        with capture_logs() as logs:
            handle = ex.submit(_job(tmp_path, "fail"))
        assert not ex.forked(handle) and handle.executor == "fresh"
        assert [e["event"] for e in logs if e["log_level"] == "warning"] == [
            "fork_server_unhealthy"
        ]
        assert next_exit(ex).rc == 2  # the fresh process's exit code
    finally:
        ex.close()


def test_a_changed_package_restarts_the_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ex = ForkExecutor(tmp_path / "state")
    try:
        assert ex.server is not None
        old = ex.server.proc
        hold = ex.submit(_job(tmp_path, "hang", "held"))
        changed = forkmod.SignatureWalk([])
        monkeypatch.setattr(changed, "step", lambda: "changed")
        monkeypatch.setattr(forkmod, "package_walk", lambda: changed)
        monkeypatch.setattr(forkmod, "SIGNATURE_EVERY", 0.0)
        # Looked at between resumes (the loop's poll), not as one starts: ~1 ms off its path.
        handle = ex.submit(_job(tmp_path, "fail"))
        assert ex.server is not None and ex.server.proc.pid == old.pid
        assert next_exit(ex).rc == 2  # the loop's polls meanwhile: one looks at the package
        handle = ex.submit(_job(tmp_path, "fail"))
        assert ex.forked(handle)
        assert ex.server is not None and ex.server.proc.pid != old.pid
        assert old.poll() is None  # draining: it still reports the held child's exit
        assert next_exit(ex).rc == 2
        ex.cancel(hold, force=False)
        assert next_exit(ex).rc == -signal.SIGTERM
        assert old.wait(timeout=DEADLINE) is not None  # then it is gone
    finally:
        ex.close()


def _spares(server: int) -> list[int]:
    """The server's children still in its session: forked, not yet a resume (which leaves it).
    Forks of the server, so the same program: not a command it runs as it warms up (the SDK
    runs `uname -p` once)."""
    out = []
    exe = os.readlink(f"/proc/{server}/exe")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            same_program = os.readlink(f"/proc/{entry}/exe") == exe
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        ppid, sid = int(fields[1]), int(fields[3])
        if ppid == server and sid != int(entry) and same_program:
            out.append(int(entry))
    return out


def test_a_resume_is_the_child_forked_before_it_was_asked_for(tmp_path: Path) -> None:
    ex = ForkExecutor(tmp_path / "state")
    try:
        assert ex.server is not None
        sp = ex.server
        server = sp.proc.pid
        # The spare rehearses once it has waited, and a backup is forked beside it meanwhile.
        wait_for(lambda: ex.poll(time.monotonic()) or sp.spare_rehearsed, "a rehearsed spare")
        spares = wait_for(lambda: s if len(s := _spares(server)) == 2 else None, "two spares")
        assert sp.spare_rehearsed in spares
        [backup] = [p for p in spares if p != sp.spare_rehearsed]
        handle = ex.submit(_job(tmp_path, "fail"))
        assert dict(handle.shown) == {"pid": sp.spare_rehearsed, "child": "rehearsed"}
        assert next_exit(ex).rc == 2
        # The next spare is forked once the server has answered; the backup stays one.
        fresh = wait_for(lambda: [p for p in _spares(server) if p != backup] or None, "a spare")
        assert sp.spare_rehearsed not in fresh
        # Spares that die are nobody's resume: no exit is reported, and a resume that finds
        # none is forked for itself.
        dead = (*fresh, backup)
        for pid in dead:
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not any(os.path.exists(f"/proc/{p}") for p in dead), "spares reaped")
        handle = ex.submit(_job(tmp_path, "fail", "after-kill"))
        end = next_exit(ex)
        assert (end.handle, end.rc) == (handle, 2)
        assert dict(handle.shown)["pid"] not in dead
        assert dict(handle.shown)["child"] == "forked"
        # Replaced by the server itself (after a pause), with no resume asked for meanwhile.
        again = wait_for(lambda: _spares(server) or None, "a spare after the kill")
        assert not set(again) & set(dead)
    finally:
        ex.close()


def test_a_spare_that_waited_rehearses_then_resumes_a_real_run(
    tmp_path: Path, fake: FakeLLM, agent: Path
) -> None:
    """A spare asked for nothing for a while rehearses a resume in itself, then says so; the
    next resume is that spare (`child: rehearsed`), and it is the resume a fresh `delta`
    would be: the answer reaches the model, the run ends."""
    delta = Delta(tmp_path / "ws", fake, agent)
    delta.ws.mkdir()
    fake.call("ask_human", {"prompt": "Name?"}, id="q")
    fake.reply("done")
    assert delta.start().code == 101
    (delta.delta_dir / "interaction" / "response.txt").write_text("Ada")
    me = owner_of(os.getuid())
    env = {"PATH": SAFE_PATH, "HOME": me.home, **delta.env}
    spec = JobSpec(
        RequestKey(delta.ws, "", "resume"),
        [bin_path("delta"), "run", "--work-dir", str(delta.ws)],
        Identity(me.uid, me.gid),
        env,
        60.0,
    )
    ex = ForkExecutor(tmp_path / "state")
    try:
        assert ex.server is not None
        server = ex.server
        wait_for(lambda: ex.poll(time.monotonic()) or server.spare_rehearsed, "a rehearsed spare")
        handle = ex.submit(spec)
        assert dict(handle.shown) == {"pid": server.spare_rehearsed, "child": "rehearsed"}
        end = next_exit(ex)
        assert (end.handle, end.rc) == (handle, 0)
    finally:
        ex.close()
    assert fake.tool_results()["q"] == "Ada"


def test_a_look_at_the_package_left_by_a_dead_server_does_not_keep_the_loop_busy(
    tmp_path: Path,
) -> None:
    """While a look at the package is under way the loop is brought back at once (`due`);
    once the server is gone (unhealthy, waiting to retry) there is nothing to compare with,
    and the loop must go back to waiting, not turn without pause until the retry."""
    ex = ForkExecutor(tmp_path / "state")
    try:
        assert ex.server is not None
        ex._walk = forkmod.package_walk()
        now = time.monotonic()
        assert ex.due(now) == now
        ex._unhealthy("a test")
        assert ex.server is None
        assert ex.due(now) != now
        ex.poll(now)
        assert ex._walk is None
    finally:
        ex.close()
