"""READY in proportion to what matters (deltad/core/unread.py): at start a paused workspace
without an answer is known by its mailbox's names alone; its `request.json` is read after
READY, by a bounded background pass that still honours a deadline passed while the daemon was
down. Whether a file was opened is told by the kernel (an inotify IN_OPEN watch of the test's
own), not by instrumenting the daemon."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import pytest
from inotify_simple import INotify
from inotify_simple import flags as IN
from structlog.testing import capture_logs

from deltad.clock import ManualClock
from deltad.core.config import load_config
from deltad.core.service import Service
from deltad.inbox.feed import Index, View
from deltad.protocol import utcnow
from deltad.testing.stub import paused_workspace
from deltad.watch.discovery import unanswered

from .test_daemon_sweep import RecordingResumer, resumed

MAILBOX = Path(".delta/interaction")


@pytest.mark.parametrize(
    ("names", "deferred"),
    [
        (None, False),  # no mailbox (yet): look
        (frozenset(), False),  # no question: look (a run may be running, or done)
        (frozenset({"request.json"}), True),
        (frozenset({"request.json", "response.txt"}), False),  # an answer: look now
        (frozenset({"request.json", "response.json"}), False),
        (frozenset({"response.txt"}), False),  # an answer without a question: a problem
        (frozenset({"request.json", ".response.txt.swp", "refused"}), True),  # not answers
    ],
)
def test_what_a_glance_at_the_mailbox_decides(names: frozenset[str] | None, deferred: bool) -> None:
    assert unanswered(names) is deferred


class Opens:
    """The test's own inotify watch on files: which of them were opened since the last look."""

    def __init__(self, files: list[Path]) -> None:
        self.fd = INotify(nonblocking=True)
        self.paths = {self.fd.add_watch(f, IN.OPEN): f for f in files}

    def since(self) -> set[Path]:
        return {self.paths[e.wd] for e in self.fd.read(timeout=0) if e.mask & IN.OPEN}


@pytest.fixture
def service(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Service:
    monkeypatch.delenv("DELTAD_CONFIG", raising=False)
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    config = load_config(None, (str(tmp_path / "root"),))
    config.state_dir = tmp_path / "state"
    config.state_dir.mkdir()
    config.executor = "fresh"  # not a fork server (a Python start): no resume is started here
    clock = ManualClock(wall=__import__("time").time())
    return Service(config, None, (), clock=clock, resumer=RecordingResumer(config))


def _drain_unread(svc: Service) -> None:
    for _ in range(1000):  # a turn reads a bounded slice; far more turns than needed
        if not svc.unread:
            return
        svc.turn()
    raise AssertionError(f"{len(svc.unread)} workspaces still unread")


@pytest.mark.linux_only  # done by its read lease (deltad/platform.py); elsewhere: settle_seconds
def test_ready_reads_no_unanswered_question_and_a_deadline_passed_while_down_is_honoured_after(
    service: Service, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    paused = [root / f"ws{i}" for i in range(5)]
    for ws in paused:
        paused_workspace(ws)
    expired = root / "expired"  # its deadline passed while no daemon was running
    paused_workspace(expired, expires_at=utcnow() - timedelta(seconds=5))
    answered = root / "answered"
    paused_workspace(answered)
    (answered / MAILBOX / "response.txt").write_text("yes")
    opens = Opens([ws / MAILBOX / "request.json" for ws in [*paused, expired, answered]])

    service.life.start()  # watches, the startup reconcile, READY=1

    assert opens.since() == {answered / MAILBOX / "request.json"}  # only the answered one read
    assert resumed(service) == [answered]  # an answer found at start is not deferred
    assert len(service.unread) == len(paused) + 1
    _drain_unread(service)
    assert resumed(service) == [answered, expired]
    assert opens.since() == {ws / MAILBOX / "request.json" for ws in [*paused, expired]}
    assert service.registry.counts()["waiting"] == len(paused)
    service.life.close_backends()


@pytest.mark.linux_only  # done by its read lease (deltad/platform.py); elsewhere: settle_seconds
def test_a_periodic_reconcile_does_not_read_a_question_again_that_is_still_unanswered(
    service: Service, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    paused = [root / f"ws{i}" for i in range(5)]
    for ws in paused:
        paused_workspace(ws)
    service.life.start()
    _drain_unread(service)
    opens = Opens([ws / MAILBOX / "request.json" for ws in paused])
    (paused[0] / MAILBOX / "response.txt").write_text("yes")  # an answer whose event was lost
    service.full_reconcile("periodic")
    while service.sweep is not None:
        service.turn()
    assert opens.since() == {paused[0] / MAILBOX / "request.json"}
    assert resumed(service) == [paused[0]]
    service.life.close_backends()


def test_the_loop_does_not_wait_while_questions_are_left_to_read(
    service: Service, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paused_workspace(tmp_path / "root" / "ws")
    service.life.start()
    service.ticks.start(service.clock.monotonic(), service.config)  # as the loop does
    assert len(service.unread) == 1
    waits: list[float] = []

    def select(r: list[int], w: list[int], x: list[int], timeout: float) -> tuple[list[int], ...]:
        waits.append(timeout)
        return [], [], []

    monkeypatch.setattr("deltad.core.lifecycle.select.select", select)
    sig_r, sig_w = os.pipe()
    service.life._wait(sig_r)
    _drain_unread(service)
    service.life._wait(sig_r)  # nothing left: back to waiting for the next duty
    assert waits[0] == 0.0 and waits[1] > 0.0
    os.close(sig_r)
    os.close(sig_w)
    service.life.close_backends()


def test_the_index_keeps_every_copy_that_shows_one_request_and_run(tmp_path: Path) -> None:
    """Copies of one paused workspace show the same run id and request id (the bench's 100,000
    do): each id keeps one workspace without a set, and a set only once several share it."""
    index = Index()
    copies = [tmp_path / f"copy{i}" for i in range(3)]
    for ws in copies:
        ws.mkdir()
        index.put(View(ws, "waiting", "20261124_000000_abcdef", "WAITING", "r1", "text", 1.0))
    assert index.find("r1") == sorted(copies)
    assert index.run_holders("20261124_000000_abcdef") == sorted(copies)
    for gone in range(3):
        index.remove(copies[gone])
        assert index.find("r1") == sorted(copies[gone + 1 :])
        assert index.run_holders("20261124_000000_abcdef") == sorted(copies[gone + 1 :])
    index.put(View(copies[0], "waiting", "20261124_000000_abcdef", "WAITING", "r1", "text", 1.0))
    index.put(View(copies[0], "waiting", "20261124_000000_abcdef", "WAITING", "r2", "text", 2.0))
    assert (index.find("r1"), index.find("r2")) == ([], [copies[0]])


def test_the_end_of_the_reads_is_said_when_a_full_reconcile_read_them_first(
    service: Service, tmp_path: Path
) -> None:
    """An overflow (or a reload) right after READY reads every workspace itself: the
    `questions_read` line still comes, once, when the list of workspaces to read is empty."""
    for i in range(5):
        paused_workspace(tmp_path / "root" / f"ws{i}")
    service.life.start()
    assert len(service.unread) == 5
    with capture_logs() as logs:
        service.full_reconcile("overflow", force=True)
        for _ in range(1000):
            service.turn()
            if service.sweep is None and not service.unread:
                break
        service.turn()
    said = [e for e in logs if e["event"] == "questions_read"]
    assert [e["workspaces"] for e in said] == [5]
    service.life.close_backends()
