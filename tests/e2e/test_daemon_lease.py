"""The read lease the daemon takes to ask whether an answer is still being written."""

from __future__ import annotations

import signal
from pathlib import Path

from tests.support.daemon import answer, paused_workspace, running


def test_a_broken_lease_does_not_stop_the_daemon(tmp_path: Path) -> None:
    """A writer opening response.txt while the daemon holds its read lease (a save in place
    at the wrong microsecond) makes the kernel send the daemon SIGIO, which by default ends a
    process. The window cannot be hit on purpose, so the test sends what the kernel sends."""
    root = tmp_path / "root"
    ws = root / "ws1"
    paused_workspace(ws)
    with running(tmp_path, [root]) as d:
        d.signal(signal.SIGIO)
        answer(ws, "after the lease break")
        [rec] = d.wait_resumed(ws)
        assert rec["answer"] == "after the lease break"
        assert d.proc is not None and d.proc.poll() is None
