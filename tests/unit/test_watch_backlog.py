"""An event tree's events under a storm (deltad/watch/tree.py `take`, `handle`): a mailbox's
event is handled as soon as it is read, whatever was read before it; the rest waits in order, a
slice per loop turn; an overflow, or more waiting than the kernel's queue holds, gives what
waits up to a full reconcile. And what a storm hands the poller is let go when it goes
(`release_dir`, polling.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from structlog.testing import capture_logs

from deltad.watch import events as F
from deltad.watch import tree as T
from deltad.watch.hints import HintQueue, Why
from deltad.watch.polling import PollingBackend
from deltad.watch.tree import Kind, _Dir, _Sub, at_once, given_up
from tests.support.kernel import FakeKernelTree

WS = Path("/r/ws")
ANSWERED = F.CLOSE_WRITE


@pytest.mark.parametrize(
    ("holder", "mask", "now"),
    [
        (WS, ANSWERED, True),  # an answer: a look at once
        (WS, F.CREATE, True),  # a question, a client come
        (WS, F.DELETE, True),
        (WS, F.DELETE_SELF, False),  # the mailbox's own end changes what is watched
        (WS, F.MOVE_SELF, False),
        (WS, F.IGNORED, False),
        (_Dir(Path("/r")), F.CREATE | F.ISDIR, False),  # a directory made: in order
        (_Sub(Kind.DELTA, WS), F.CREATE | F.ISDIR, False),  # `interaction/` made
        (_Sub(Kind.RUNS, WS), ANSWERED, False),
        ([WS, Path("/r/other")], ANSWERED, False),  # a mailbox two paths reach: in order
        (None, ANSWERED, False),  # no longer watched
    ],
)
def test_only_a_mailbox_event_goes_ahead(holder: T.Holder | None, mask: int, now: bool) -> None:
    assert at_once(holder, mask) is now


@pytest.mark.parametrize(
    ("waiting", "overflow", "lost"),
    [
        (0, False, False),
        (T.BACKLOG_MAX, False, False),  # as many as the kernel holds: still in order
        (T.BACKLOG_MAX + 1, False, True),  # further behind than an overflow
        (0, True, True),  # the kernel lost some: what waits is no better
        (5, True, True),
    ],
)
def test_what_waits_is_given_up_past_the_kernels_queue_or_an_overflow(
    waiting: int, overflow: bool, lost: bool
) -> None:
    assert given_up(waiting, overflow) is lost


def _tree(tmp_path: Path) -> tuple[FakeKernelTree, HintQueue, Path, Path]:
    root = tmp_path / "root"
    ws = root / "ws"
    (ws / ".delta" / "interaction").mkdir(parents=True)
    (root / "d").mkdir()
    queue = HintQueue()
    tree = FakeKernelTree(queue)
    tree.add_root(root, 2)
    tree.sync()
    while queue.pop() is not None:  # the walk's own hints
        pass
    return tree, queue, root, ws


def _storm(tree: FakeKernelTree, root: Path, n: int) -> list[T.RawEvent]:
    wd = tree.paths()[root]
    return [(wd, (F.MOVED_FROM if i % 2 else F.MOVED_TO) | F.ISDIR, f"x{i}") for i in range(n)]


def test_an_answer_read_after_a_storm_is_taken_before_the_storm_is_handled(
    tmp_path: Path,
) -> None:
    tree, queue, root, ws = _tree(tmp_path)
    mailbox = tree.paths()[ws / ".delta" / "interaction"]
    tree.take([*_storm(tree, root, 1000), (mailbox, ANSWERED, "response.txt")])
    hint = queue.pop()
    assert hint is not None and (hint.workspace, hint.why) == (ws, Why.ANSWER_CLOSED)
    assert tree.behind()  # the storm's events wait, in order
    tree.handle(slice_s=0.0)  # one small batch per call at the least
    assert tree.behind()
    while tree.behind():
        tree.handle()
    assert len(queue) == 0


def test_events_waiting_are_handled_in_order(tmp_path: Path) -> None:
    tree, _, root, _ = _tree(tmp_path)
    made = root / "d" / "new"
    (made / ".delta" / "interaction").mkdir(parents=True)
    d = tree.paths()[root / "d"]
    # A directory made, then one becoming a workspace in it: the second needs the first.
    tree.take([(d, F.CREATE | F.ISDIR, "new")])
    tree.handle()
    assert made in tree.workspaces()


def test_an_overflow_gives_up_what_waits_but_a_watch_the_kernel_ended(tmp_path: Path) -> None:
    tree, queue, root, _ = _tree(tmp_path)
    gone = tree.paths()[root / "d"]
    (root / "late").mkdir()
    with capture_logs() as logs:
        tree.take([(gone, F.IGNORED, ""), *_storm(tree, root, 10)])
        tree.take([(tree.paths()[root], F.CREATE | F.ISDIR, "late"), (-1, F.Q_OVERFLOW, "")])
    assert not tree.behind()
    assert root / "d" not in tree.paths()  # IN_IGNORED still handled: its watch is gone
    assert root / "late" not in tree.paths()  # lost with the rest: the full reconcile finds it
    assert queue.take_rescan()
    [said] = [e for e in logs if e["event"] == "inotify_overflow"]
    assert (said["lost"], said["skipped"]) == ("kernel", 12)


def test_more_waiting_than_the_kernels_queue_is_an_overflow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(T, "BACKLOG_MAX", 100)
    tree, queue, root, _ = _tree(tmp_path)
    tree.take(_storm(tree, root, 60))
    assert tree.behind() and not queue.take_rescan()
    with capture_logs() as logs:
        tree.take(_storm(tree, root, 60))
    assert not tree.behind() and queue.take_rescan()
    assert [(e["lost"], e["skipped"]) for e in logs if e["event"] == "inotify_overflow"] == [
        ("backlog", 120)
    ]


# -- what the poller is handed, let go -------------------------------------------------------
def test_the_poller_lets_go_of_a_directory_gone_never_of_a_root(tmp_path: Path) -> None:
    poller = PollingBackend(HintQueue(), interval=3600)
    root, kept, gone, unsaid = (tmp_path / n for n in ("root", "kept", "gone", "unsaid"))
    for d in (root, kept, gone, unsaid):
        d.mkdir()
    try:
        poller.add_root(root, 2)
        for d in (kept, gone, unsaid):
            poller.adopt_dir(d, 0)
        gone.rmdir()
        poller.release_dir(gone)  # told
        poller.release_dir(root)  # a root is the admin's: never let go
        unsaid.rmdir()  # not told (its event was lost): the next walk lets it go
        root.rmdir()
        poller._walk()
        assert set(poller._tops) == {root, kept}
    finally:
        poller.close()
