"""The inotify backend (`backend: inotify`), set explicitly: whatever `auto` picks (tests run
as root, where a fanotify mark is possible), the inotify path is run here.

The detection scenarios of `test_daemon_detect.py` and the symlinked-mailbox scenarios of
`test_tenant_watches.py` run again with every plain root set to `backend: inotify`
(`harness.ROOT_BACKEND`); below them, the kernel's own count of the daemon's watches."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.test_daemon_detect import (  # noqa: F401 - collected again, under inotify
    test_a_dozen_answered_at_once_each_resumed_exactly_once,
    test_answer_written_while_daemon_was_down,
    test_atomic_rename,
    test_moved_in_from_outside_and_hard_linked,
    test_queue_overflow_triggers_a_full_reconcile,
    test_root_itself_can_be_a_workspace_and_depth_is_respected,
    test_slow_writer_in_two_parts_is_delivered_whole,
    test_structured_answer_file_response_json,
    test_working_files_cost_no_watches,
    test_workspace_created_after_start,
)
from tests.e2e.test_daemon_fanotify import inotify_watches
from tests.e2e.test_tenant_watches import (  # noqa: F401 - collected again, under inotify
    test_a_symlinked_mailbox_made_before_start_does_not_take_the_victims_watch,
    test_a_symlinked_mailbox_moved_in_after_ready_does_not_take_the_victims_watch,
)
from tests.support import daemon as harness
from tests.support.daemon import answer, paused_workspace, running

NO_RESCAN = 3600


@pytest.fixture(autouse=True)
def _inotify_roots(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(harness, "ROOT_BACKEND", "inotify")


def test_at_most_one_inotify_watch_per_workspace(tmp_path: Path) -> None:
    root = tmp_path / "root"
    teams = [root / f"team{t}" for t in range(3)]
    workspaces = [team / f"ws{i}" for team in teams for i in range(10)]
    for ws in workspaces:
        paused_workspace(ws)
    with running(tmp_path, [root], rescan_interval_seconds=NO_RESCAN) as d:
        assert d.proc is not None
        directories_above = 1 + len(teams)
        assert inotify_watches(d.proc.pid) <= len(workspaces) + directories_above
        answer(workspaces[-1], "one watch is enough")
        assert d.wait_resumed(workspaces[-1])[0]["answer"] == "one watch is enough"
