"""The fanotify backend (deltad/watch/fanotify.py): its record parser from byte
tables, and its handle table over the real kernel (tests run as root)."""

from __future__ import annotations

import os
import select
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from deltad.watch import events as F
from deltad.watch.fanotify import (
    INFO_DFID,
    INFO_DFID_NAME,
    FanotifyBackend,
    Handles,
    Record,
    key_of,
    parse,
    probe,
)
from deltad.watch.hints import HintQueue, Why
from tests.support.daemon import wait_for

FSID = 0x219CE831329B3837
HANDLE = bytes.fromhex("13c42000299c0997")
KEY = key_of(FSID, 1, HANDLE)


def info(name: bytes, info_type: int = INFO_DFID_NAME, handle: bytes = HANDLE) -> bytes:
    """A `fanotify_event_info_fid` record as the kernel writes it (padded to 4 bytes)."""
    body = struct.pack("=Q", FSID) + struct.pack("=Ii", len(handle), 1) + handle + name + b"\0"
    body += b"\0" * (-(len(body) + 4) % 4)
    return struct.pack("=BBH", info_type, 0, len(body) + 4) + body


def event(mask: int, *infos: bytes) -> bytes:
    """A `fanotify_event_metadata` record (fd FAN_NOFD, as with fid reporting) and its infos."""
    rest = b"".join(infos)
    return struct.pack("=IBBHQii", 24 + len(rest), 3, 0, 24, mask, -1, 1234) + rest


@pytest.mark.parametrize(
    ("buf", "records"),
    [
        (event(F.CLOSE_WRITE, info(b"response.txt")), [Record(F.CLOSE_WRITE, KEY, "response.txt")]),
        (  # merged bits, a directory, and two records in one read
            event(F.CREATE | F.ISDIR, info(b"ws1")) + event(F.MOVED_TO, info(b"LATEST")),
            [Record(F.CREATE | F.ISDIR, KEY, "ws1"), Record(F.MOVED_TO, KEY, "LATEST")],
        ),
        (event(F.DELETE_SELF | F.ISDIR, info(b".")), [Record(F.DELETE_SELF | F.ISDIR, KEY, ".")]),
        (event(F.Q_OVERFLOW), [Record(F.Q_OVERFLOW, b"", "")]),
        (event(F.CREATE, info(b"caf\xe9")), [Record(F.CREATE, KEY, "caf\udce9")]),  # not UTF-8
        (event(F.DELETE, info(b"", INFO_DFID)), [Record(F.DELETE, KEY, "")]),
        (  # an unknown info type first: skipped, the directory's record used
            event(F.CREATE, struct.pack("=BBHI", 99, 0, 8, 0), info(b"x")),
            [Record(F.CREATE, KEY, "x")],
        ),
        (event(F.CREATE), []),  # no info record: nothing to route
        (event(F.CREATE, info(b"x"))[:-3], []),  # truncated: the rest of the buffer is dropped
        (b"\0" * 10, []),
    ],
)
def test_parse(buf: bytes, records: list[Record]) -> None:
    assert list(parse(buf)) == records


def test_key_is_the_bytes_events_carry() -> None:
    [rec] = parse(event(F.CREATE, info(b"x", handle=b"\1\2\3\4\5\6\7\x08")))
    assert rec.key == key_of(FSID, 1, b"\1\2\3\4\5\6\7\x08") != KEY


# -- the handle table, over the real kernel ----------------------------------------------------
class NoFallback:
    def adopt_workspace(self, ws: Path) -> None:
        raise AssertionError("every filesystem here is markable")

    def adopt_dir(self, path: Path, levels: int) -> None:
        raise AssertionError("every filesystem here is markable")

    def release_dir(self, path: Path) -> None:
        pass  # told of every directory that goes: nothing was handed over


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[tuple[FanotifyBackend, HintQueue]]:
    if (reason := probe(tmp_path)) is not None:
        pytest.skip(reason)
    queue = HintQueue()
    b = FanotifyBackend(queue, NoFallback())
    b.add_root(tmp_path / "root", 2)
    (tmp_path / "root").mkdir()
    yield b, queue
    b.close()


def _workspace(ws: Path) -> Path:
    (ws / ".delta" / "interaction").mkdir(parents=True)
    (ws / ".delta" / "runs").mkdir()
    return ws


def _hint(b: FanotifyBackend, queue: HintQueue, ws: Path) -> Why:
    def seen() -> list[Why]:  # a list: Why.CHECK is falsy
        b.process()
        while (hint := queue.pop()) is not None:
            if hint.workspace == ws:
                return [hint.why]
        return []

    return wait_for(seen, f"a hint for {ws}")[0]


def test_table_add_move_remove(tmp_path: Path, backend: tuple[FanotifyBackend, HintQueue]) -> None:
    b, queue = backend
    ws = _workspace(tmp_path / "root" / "ws1")
    mailbox, delta, runs = ws / ".delta" / "interaction", ws / ".delta", ws / ".delta" / "runs"
    b.sync()
    # Handles, not kernel watches: free, so `.delta/` and `runs/` are kept as well.
    assert set(b.paths()) == {tmp_path / "root", delta, mailbox, runs}
    (mailbox / "response.txt").write_text("yes")
    assert _hint(b, queue, ws) & Why.ANSWER_CLOSED

    # Moved out: `.delta/`'s MOVED_FROM drops its handle; its MOVED_TO brings it back.
    os.rename(mailbox, tmp_path / "away")
    _hint(b, queue, ws)
    assert set(b.paths()) == {tmp_path / "root", delta, runs}
    (tmp_path / "away" / "response.txt").write_text("not here")
    (tmp_path / "away").rename(mailbox)
    _hint(b, queue, ws)
    assert set(b.paths()) == {tmp_path / "root", delta, mailbox, runs}
    (mailbox / "response.json").write_text("{}")
    assert _hint(b, queue, ws) & Why.ANSWER_CLOSED

    # Removed: the workspace's handles leave the table with it.
    for p in (mailbox / "response.txt", mailbox / "response.json"):
        p.unlink()
    for d in (mailbox, ws / ".delta" / "runs", ws / ".delta"):
        d.rmdir()
    _hint(b, queue, ws)
    b.forget(ws)  # as the daemon does when its reconcile finds no `.delta/`
    assert set(b.paths()) == {tmp_path / "root", ws}  # ws1 as a plain directory


def test_a_symlinked_mailbox_has_its_own_handle(
    tmp_path: Path, backend: tuple[FanotifyBackend, HintQueue]
) -> None:
    b, queue = backend
    victim = _workspace(tmp_path / "root" / "victim")
    mallory = _workspace(tmp_path / "root" / "mallory")
    (mallory / ".delta" / "interaction").rmdir()
    os.symlink(victim / ".delta" / "interaction", mallory / ".delta" / "interaction")
    b.sync()
    (victim / ".delta" / "interaction" / "response.txt").write_text("for the victim")
    assert _hint(b, queue, victim) & Why.ANSWER_CLOSED
    b.process()
    assert all(h.workspace != mallory for h in iter(queue.pop, None))


def test_files_elsewhere_are_dropped_by_handle(
    tmp_path: Path, backend: tuple[FanotifyBackend, HintQueue]
) -> None:
    b, queue = backend
    ws = _workspace(tmp_path / "root" / "ws1")
    b.sync()
    other = tmp_path / "other"
    other.mkdir()
    for i in range(100):
        (other / f"f{i}").write_text("x")
    (ws / ".delta" / "interaction" / "response.txt").write_text("yes")
    _hint(b, queue, ws)
    assert b.dropped >= 100


@pytest.mark.parametrize(
    ("backend", "dirs", "workspaces", "watches"),
    [
        ("inotify", 51, 5000, 5051),  # one per directory above, one per workspace
        ("watchdog", 1, 10, 11),
        ("fanotify", 51, 5000, 0),  # a filesystem mark: no inotify watch
        ("polling", 51, 5000, 0),
    ],
)
def test_check_counts_inotify_watches(
    backend: str, dirs: int, workspaces: int, watches: int
) -> None:
    from deltad.core.cli import root_watches

    assert root_watches(backend, dirs, workspaces) == watches


@pytest.mark.parametrize(
    ("needed", "in_use", "limit", "own_cap", "over"),
    [
        (100, 0, 200, None, False),
        (100, 150, 200, None, True),  # the kernel's limit is per user: others' watches count
        (100, 0, 200, 50, True),  # deltad's own cap counts only its own
        (100, 150, 300, 120, False),
    ],
)
def test_check_warns_over_the_watch_budget(
    needed: int, in_use: int, limit: int, own_cap: int | None, over: bool
) -> None:
    from deltad.core.cli import over_watch_budget

    assert over_watch_budget(needed, in_use, limit, own_cap) is over


# -- others' records: dropped before anything is built, then the fd rests ----------------------
OURS = key_of(FSID, 1, b"\7" * 8)


class Dispatched(FanotifyBackend):
    """The record dispatch alone (no kernel): what reaches the watch tree."""

    def __init__(self) -> None:  # no fanotify group: `_records` needs none
        self._handles, self.dropped = Handles(), 0
        assert self._handles.add(OURS) == 1
        self.events: list[tuple[int, int, str]] = []

    def _event(self, wd: int, mask: int, name: str) -> None:
        self.events.append((wd, mask, name))


@pytest.mark.parametrize(
    ("buf", "events", "dropped"),
    [
        (event(F.CREATE, info(b"noise")) * 3, [], 3),  # others': no event, counted
        (
            event(F.CREATE, info(b"noise")) + event(F.CLOSE_WRITE, info(b"a", handle=b"\7" * 8)),
            [(1, F.CLOSE_WRITE, "a")],
            1,
        ),
        (
            event(F.DELETE_SELF | F.ISDIR, info(b".", handle=b"\7" * 8)),
            [
                (1, F.DELETE_SELF, ""),
                (1, F.IGNORED, ""),
            ],
            0,
        ),
        (event(F.Q_OVERFLOW) + event(F.CREATE, info(b"noise")), [(0, F.Q_OVERFLOW, "")], 1),
        (event(F.CREATE, info(b"noise")) + event(F.Q_OVERFLOW), [(0, F.Q_OVERFLOW, "")], 1),
        (  # an unknown info type first: not the usual shape, parsed in full
            event(F.CREATE, struct.pack("=BBHI", 99, 0, 8, 0), info(b"x", handle=b"\7" * 8)),
            [(1, F.CREATE, "x")],
            0,
        ),
        (event(F.CREATE, info(b"noise")) + event(F.CREATE, info(b"x"))[:-3], [], 1),  # truncated
        (event(F.CREATE, info(b"noise"))[:30], [], 0),
    ],
)
def test_records_are_dispatched_as_parsed(
    buf: bytes, events: list[tuple[int, int, str]], dropped: int
) -> None:
    b = Dispatched()
    b._records(buf)
    assert (b.events, b.dropped) == (events, dropped)
    reference = Dispatched()
    for rec in parse(buf):  # the fast path agrees with the full parse, record by record
        reference._on_record(rec)
    assert (reference.events, reference.dropped) == (events, dropped)


def test_others_writes_alone_rest_the_fd(
    tmp_path: Path, backend: tuple[FanotifyBackend, HintQueue], monkeypatch: pytest.MonkeyPatch
) -> None:
    from deltad.watch import fanotify

    monkeypatch.setattr(fanotify, "REST_SECONDS", 3600.0)  # no race with the clock here
    b, queue = backend
    ws = _workspace(tmp_path / "root" / "ws1")
    b.sync()
    fd = b.fileno()
    assert fd is not None and b.rests_for() is None
    (tmp_path / "elsewhere").write_text("not ours")
    wait_for(lambda: select.select([fd], [], [], 0)[0], "others' records to read")
    b.process()
    assert b.fileno() is None and 0 < (b.rests_for() or 0) <= 3600  # the loop wakes then
    (ws / ".delta" / "interaction" / "response.txt").write_text("yes")
    assert _hint(b, queue, ws) & Why.ANSWER_CLOSED
    assert b.fileno() == fd and b.rests_for() is None  # ours seen: read as usual


def test_the_handle_table_gives_freed_descriptors_again() -> None:
    other_fs = key_of(FSID + 1, 1, HANDLE)  # the same handle bytes on another filesystem
    table = Handles()
    assert [table.add(KEY), table.add(OURS), table.add(other_fs), table.add(KEY)] == [1, 2, 3, 1]
    assert (table.get(KEY), table.get(OURS), table.get(other_fs), len(table)) == (1, 2, 3, 3)
    assert table.get(key_of(FSID, 2, HANDLE)) is None  # another handle type: another key
    table.remove(1)
    table.remove(1)  # twice: nothing more
    assert table.get(KEY) is None and table.get(other_fs) == 3 and 1 not in table
    assert table.add(key_of(FSID, 1, b"\1" * 8)) == 1 and len(table) == 3  # 1 given again
    table.remove(99)
    assert 2 in table and 0 not in table
