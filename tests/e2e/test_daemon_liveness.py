"""A `delta run` started by hand and killed with `kill -9` is INTERRUPTED at once, under every
event backend, with still one inotify watch per workspace: the client holds the mailbox's
`live` file open (protocol/live.py), and its close — the kernel's own at the kill — is an event
on the watch the workspace already has.

"At once" is shown without a timer: the periodic full reconcile and the liveness sweep are set
an hour apart, so only the event can have brought the look. The latency measured (kill →
INTERRUPTED in metadata.json) is printed and appended to `bench/results/liveness.txt` when
DELTAD_BENCH_OUT names that file."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from deltad.testing import FakeLLM
from tests.e2e.test_daemon_fanotify import inotify_watches
from tests.support import daemon as harness
from tests.support.daemon import Daemon, metadata_status, paused_workspace, wait_for

from ..conftest import llm_env, write_agent

DELTA = str(Path(sys.executable).parent / "delta")
NEVER = 3600  # no periodic full reconcile, no liveness sweep during the test
BACKENDS = ["auto", "inotify", "fanotify", "watchdog"]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setattr(harness, "ROOT_BACKEND", None if request.param == "auto" else request.param)
    yield request.param


def _hand_started(fake: FakeLLM, tmp: Path, ws: Path) -> subprocess.Popen[bytes]:
    """`delta run` by hand, busy in a long tool call (so RUNNING, with no question asked)."""
    tools = '[{name: wait, description: "wait", command: ["sleep", "120"]}]'
    fake.call("wait", {}, id="w1").reply("done")
    agent = write_agent(tmp, tools)
    return subprocess.Popen(
        [DELTA, "run", "--agent", str(agent), "--task", "t", "--work-dir", str(ws)],
        env=llm_env(fake),
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _tool_running(ws: Path) -> bool:
    try:
        return metadata_status(ws) == "RUNNING" and any(
            (ws / ".delta" / "runs").glob("*/io/tool_executions/*")
        )
    except (AssertionError, OSError, ValueError):
        return False


def test_a_killed_hand_started_run_is_interrupted_by_its_event(
    tmp_path: Path, fake: FakeLLM, backend: str
) -> None:
    root = tmp_path / "root"
    ws = root / "team" / "ws1"
    ws.mkdir(parents=True)
    idle = [root / "team" / f"idle{i}" for i in range(3)]
    for w in idle:
        paused_workspace(w)
    d = Daemon(
        tmp_path,
        [root],
        resume_command=["delta", "run", "--work-dir", "{workspace}"],
        rescan_interval_seconds=NEVER,
        liveness_sweep_seconds=NEVER,
    ).start(env=llm_env(fake))
    client = _hand_started(fake, tmp_path, ws)
    try:
        wait_for(lambda: _tool_running(ws), "the hand-started run to be busy in its tool")
        assert (ws / ".delta" / "interaction" / "live").is_file()
        sweeps = len(d.lines())  # what the daemon has said so far
        assert d.proc is not None
        if backend in ("auto", "inotify"):
            directories_above = 2  # the root and team/
            assert inotify_watches(d.proc.pid) <= 1 + len(idle) + directories_above
        killed_at = time.monotonic()
        os.kill(client.pid, signal.SIGKILL)  # the client only: its tool lives on
        client.wait()
        wait_for(lambda: metadata_status(ws) == "INTERRUPTED", "the run to be INTERRUPTED")
        latency = time.monotonic() - killed_at
        [t] = d.wait_event("status_transition", to="INTERRUPTED", workspace=str(ws))
        assert t["from"] == "RUNNING"
        # No full reconcile and no liveness sweep ran since: the event brought the look.
        later = d.lines()[sweeps:]
        assert not [e for e in later if e.get("event") == "reconcile_full"], later
        if backend in ("auto", "inotify"):
            assert inotify_watches(d.proc.pid) <= 1 + len(idle) + directories_above
        line = f"kill -9 -> INTERRUPTED under {backend}: {latency * 1000:.0f} ms"
        print(line)
        if out := os.environ.get("DELTAD_BENCH_OUT"):
            with open(out, "a") as f:
                f.write(line + "\n")
    finally:
        _kill_group(client.pid)
        d.stop()
        d.kill_children()


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)  # the tool left behind
