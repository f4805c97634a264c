"""The watch table (deltad/watch/tree.py): one workspace's directories never take
another's watch. A fake kernel for the table's bookkeeping (two paths on one descriptor, as a
bind mount makes them); the real inotify for what the kernel does (IN_DONT_FOLLOW,
IN_MASK_ADD, one descriptor per inode)."""

from __future__ import annotations

import itertools
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from deltad.watch import events as F
from deltad.watch.hints import HintQueue, Why
from deltad.watch.inotify import InotifyBackend
from deltad.watch.tree import Kind, WatchTree, refusal
from tests.support.daemon import answer, wait_for


class NoFallback:
    def adopt_workspace(self, ws: Path) -> None:
        raise AssertionError("no watch limit here")

    def adopt_dir(self, path: Path, levels: int) -> None:
        raise AssertionError("no watch limit here")

    def release_dir(self, path: Path) -> None:
        pass  # told of every directory that goes: nothing was handed over


def _workspace(ws: Path) -> Path:
    (ws / ".delta" / "interaction").mkdir(parents=True)
    (ws / ".delta" / "runs").mkdir()
    return ws


def _mailbox(ws: Path) -> Path:
    return ws / ".delta" / "interaction"


def _drain(queue: HintQueue) -> dict[Path, Why]:
    out: dict[Path, Why] = {}
    while (hint := queue.pop()) is not None:
        out[hint.workspace] = out.get(hint.workspace, Why.CHECK) | hint.why
    return out


# -- the table, over a fake kernel ------------------------------------------------------------
class BindMounts(WatchTree):
    """One descriptor per directory, where `same` makes two paths one directory (a bind
    mount); records the kernel watches removed."""

    def __init__(self, same: dict[Path, Path]) -> None:
        super().__init__(HintQueue(), NoFallback(), None)
        self.same = same
        self._wds: dict[Path, int] = {}
        self._next = itertools.count(1)
        self.removed: list[int] = []

    def _add_watch(self, path: str, kind: Kind) -> int:
        key = self.same.get(Path(path), Path(path))
        if key not in self._wds:
            self._wds[key] = next(self._next)
        return self._wds[key]

    def _rm_watch(self, wd: int) -> None:
        self.removed.append(wd)
        self._wds = {k: v for k, v in self._wds.items() if v != wd}


@pytest.mark.parametrize("leaving", ["first", "second"])
def test_two_paths_on_one_descriptor_keep_it_until_the_last_goes(
    tmp_path: Path, leaving: str
) -> None:
    root = tmp_path / "root"
    a, b = _workspace(root / "a"), _workspace(root / "b")
    tree = BindMounts({_mailbox(b): _mailbox(a)})
    tree.add_root(root, 1)
    tree.sync()
    wd = tree.paths()[_mailbox(a)]
    assert tree.paths()[_mailbox(b)] == wd
    assert set(tree.holders(wd)) == {_mailbox(a), _mailbox(b)}
    _drain(tree._queue)

    tree._event(wd, F.CLOSE_WRITE, "response.txt")  # reported to both paths' owners
    assert _drain(tree._queue) == {a: Why.ANSWER_CLOSED, b: Why.ANSWER_CLOSED}

    gone, kept = (a, b) if leaving == "first" else (b, a)
    shutil.rmtree(gone)
    tree._event(tree.paths()[root], F.DELETE | F.ISDIR, gone.name)
    _drain(tree._queue)
    assert wd not in tree.removed  # still the other path's watch
    assert set(tree.holders(wd)) == {_mailbox(kept)}
    tree._event(wd, F.CLOSE_WRITE, "response.txt")
    assert _drain(tree._queue) == {kept: Why.ANSWER_CLOSED}

    shutil.rmtree(kept)
    tree._event(tree.paths()[root], F.DELETE | F.ISDIR, kept.name)
    assert wd in tree.removed and wd not in tree._by_wd


def test_ignored_frees_every_path_of_the_descriptor(tmp_path: Path) -> None:
    root = tmp_path / "root"
    a, b = _workspace(root / "a"), _workspace(root / "b")
    tree = BindMounts({_mailbox(b): _mailbox(a)})
    tree.add_root(root, 1)
    tree.sync()
    wd = tree.paths()[_mailbox(a)]
    tree._event(wd, F.IGNORED, "")
    assert wd not in tree._by_wd
    assert _mailbox(a) not in tree.paths() and _mailbox(b) not in tree.paths()


@pytest.mark.parametrize("where", ["below", "root"])
def test_a_workspace_without_delta_is_watched_again_down_to_the_depth(
    tmp_path: Path, where: str
) -> None:
    """Its levels are its parent directory's less one (a root's: the root's depth): a
    workspace made below it afterwards is still found."""
    root = tmp_path / "root"
    ws = _workspace(root / "g" / "ws") if where == "below" else _workspace(root)
    tree = BindMounts({})
    tree.add_root(root, 3 if where == "below" else 1)
    tree.sync()
    shutil.rmtree(ws / ".delta")
    tree.forget(ws)  # as the daemon does when its reconcile finds no `.delta/`
    assert ws in tree.paths() and ws not in tree.workspaces()
    _workspace(ws / "sub")
    tree._event(tree.paths()[ws], F.CREATE | F.ISDIR, "sub")
    assert tree.workspaces() == [ws / "sub"]
    assert _drain(tree._queue) == {ws / "sub": Why.DISCOVERED}


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        (stat.S_IFDIR | 0o755, None),
        (stat.S_IFLNK | 0o777, "a symlink"),
        (stat.S_IFREG | 0o644, "not a directory"),
        (stat.S_IFIFO | 0o644, "not a directory"),
    ],
)
def test_refusal_by_mode(mode: int, reason: str | None) -> None:
    assert refusal(mode) == reason


# -- the real kernel --------------------------------------------------------------------------
@pytest.fixture
def backend() -> Iterator[InotifyBackend]:
    b = InotifyBackend(HintQueue(), NoFallback(), None)
    yield b
    b.close()


def _hints_until(tree: InotifyBackend, ws: Path) -> dict[Path, Why]:
    """Events read from the real inotify fd until `ws` is hinted (all of one batch)."""
    seen: dict[Path, Why] = {}

    def hinted() -> bool:
        tree.process()
        for path, why in _drain(tree._queue).items():
            seen[path] = seen.get(path, Why.CHECK) | why
        return ws in seen

    wait_for(hinted, f"a hint for {ws}")
    return seen


def _victim_and_mallory(tmp_path: Path) -> tuple[Path, Path]:
    """Two roots, the victim's walked first: the order that used to hand its watch over."""
    victim, mallory = _workspace(tmp_path / "a" / "victim"), _workspace(tmp_path / "b" / "mallory")
    shutil.rmtree(_mailbox(mallory))
    os.symlink(_mailbox(victim), _mailbox(mallory))
    return victim, mallory


def test_a_symlinked_mailbox_is_refused_once_and_never_takes_the_watch(
    tmp_path: Path, backend: InotifyBackend
) -> None:
    victim, mallory = _victim_and_mallory(tmp_path)
    backend.add_root(tmp_path / "a", 1)
    backend.add_root(tmp_path / "b", 1)
    with capture_logs() as logs:
        backend.sync()
        backend.sync(force=True)  # re-adding every watch says nothing new
    refused = [e for e in logs if e["event"] == "watch_refused"]
    assert [(e["workspace"], e["path"]) for e in refused] == [
        (str(mallory), str(_mailbox(mallory)))
    ]
    assert "symlink" in refused[0]["reason"]
    assert _mailbox(mallory) not in backend.paths()
    assert set(backend.holders(backend.paths()[_mailbox(victim)])) == {_mailbox(victim)}
    _drain(backend._queue)
    answer(victim, "mine")
    hints = _hints_until(backend, victim)
    assert hints == {victim: Why.ANSWER_CLOSED}


def test_a_symlink_swapped_in_above_the_watched_directory_is_caught(
    tmp_path: Path, backend: InotifyBackend
) -> None:
    """`.delta` replaced by a link between the look and the watch: the kernel follows it (only
    the last component is not followed) and hands back the victim's descriptor."""
    victim, mallory = _workspace(tmp_path / "a" / "victim"), _workspace(tmp_path / "b" / "mallory")
    real_add = backend._add_watch

    def racing_add(path: str, kind: Kind) -> int:
        if path == str(_mailbox(mallory)):
            os.rename(mallory / ".delta", mallory / ".delta-old")
            os.symlink(victim / ".delta", mallory / ".delta")
        return real_add(path, kind)

    backend._add_watch = racing_add  # type: ignore[method-assign]
    backend.add_root(tmp_path / "a", 1)
    backend.add_root(tmp_path / "b", 1)
    with capture_logs() as logs:
        backend.sync()
    refused = [e for e in logs if e["event"] == "watch_refused"]
    assert [e["path"] for e in refused] == [str(mallory / ".delta")]
    assert _mailbox(mallory) not in backend.paths()
    wd = backend.paths()[_mailbox(victim)]
    assert set(backend.holders(wd)) == {_mailbox(victim)}
    _drain(backend._queue)
    answer(victim, "still mine")  # the kernel watch the link shared is still in place
    assert _hints_until(backend, victim)[victim] & Why.ANSWER_CLOSED


def test_a_second_add_on_one_directory_never_narrows_its_mask(
    tmp_path: Path, backend: InotifyBackend
) -> None:
    box = _mailbox(_workspace(tmp_path / "ws"))
    wd = backend._add_watch(str(box), Kind.INTERACTION)
    assert backend._add_watch(str(box), Kind.DIR) == wd  # the kernel's one watch per inode
    fdinfo = Path(f"/proc/self/fdinfo/{backend.fileno()}").read_text()
    [line] = [ln for ln in fdinfo.splitlines() if ln.startswith(f"inotify wd:{wd:x} ")]
    mask = int(line.split(" mask:")[1].split()[0], 16)
    assert mask & F.CLOSE_WRITE and mask & F.MOVED_TO  # what the mailbox needs is still there


def test_a_mailbox_moved_to_another_workspace_reports_only_there(
    tmp_path: Path, backend: InotifyBackend
) -> None:
    root = tmp_path / "root"
    a, b = _workspace(root / "a"), _workspace(root / "b")
    backend.add_root(root, 1)
    backend.sync()
    shutil.rmtree(_mailbox(b))
    _hints_until(backend, b)
    os.rename(_mailbox(a), _mailbox(b))  # the kernel's watch follows the directory to b
    _hints_until(backend, b)
    assert _mailbox(a) not in backend.paths()
    _mailbox(a).mkdir()  # a's new mailbox: a new watch, b's stays
    _hints_until(backend, a)
    assert backend.paths()[_mailbox(a)] != backend.paths()[_mailbox(b)]
    answer(b, "moved")
    assert _hints_until(backend, b) == {b: Why.ANSWER_CLOSED}
    answer(a, "new")
    assert _hints_until(backend, a) == {a: Why.ANSWER_CLOSED}


def test_a_root_may_be_a_symlink_but_nothing_below_it_is_followed(
    tmp_path: Path, backend: InotifyBackend
) -> None:
    real = tmp_path / "real"
    ws = _workspace(real / "ws")
    _workspace(tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", real / "linked")  # a linked directory is not walked
    root = tmp_path / "root"
    os.symlink(real, root)
    backend.add_root(root, 1)
    layout = backend.sync()
    assert layout.workspaces == {root / "ws"}
    assert root in backend.paths() and _mailbox(root / "ws") in backend.paths()
    _drain(backend._queue)
    answer(ws, "through the root's link")
    assert _hints_until(backend, root / "ws") == {root / "ws": Why.ANSWER_CLOSED}


def test_one_watch_per_workspace_the_mailbox_or_else_its_parent(
    tmp_path: Path, backend: InotifyBackend
) -> None:
    root = tmp_path / "root"
    ws = _workspace(root / "ws")
    backend.add_root(root, 1)
    backend.sync()
    assert set(backend.paths()) == {root, _mailbox(ws)}  # not `.delta/`, not `runs/`
    shutil.rmtree(_mailbox(ws))  # no mailbox: `.delta/` is watched, to see the next one
    _hints_until(backend, ws)
    assert set(backend.paths()) == {root, ws / ".delta"}
    _mailbox(ws).mkdir()
    _hints_until(backend, ws)
    assert set(backend.paths()) == {root, _mailbox(ws)}
    answer(ws, "in the new mailbox")
    assert _hints_until(backend, ws) == {ws: Why.ANSWER_CLOSED}


# -- one owner's share of the watches ----------------------------------------------------------
class Polled:
    """The polling fallback, recording what it is handed."""

    def __init__(self) -> None:
        self.dirs: list[Path] = []
        self.workspaces: list[Path] = []

    def adopt_workspace(self, ws: Path) -> None:
        self.workspaces.append(ws)

    def adopt_dir(self, path: Path, levels: int) -> None:
        self.dirs.append(path)

    def release_dir(self, path: Path) -> None:
        if path in self.dirs:
            self.dirs.remove(path)


TENANT = 4242  # a uid nobody uses: the directories are chowned to it (the tests run as root)


def _owned(path: Path, uid: int = TENANT) -> Path:
    for p in [path, *path.rglob("*")]:
        os.lchown(p, uid, uid)
    return path


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: directories of another owner")
def test_a_tenants_directory_flood_takes_at_most_its_share_of_watches(tmp_path: Path) -> None:
    """A tenant makes 40 directories and 5 workspaces under a root: its watches stop at the
    cap, the rest is polled (and said once); root's own directories are not counted."""
    root = tmp_path / "root"
    root.mkdir()
    cap = 10
    for i in range(40):
        _owned(_mkdir(root / f"f{i:02d}"))
    spaces = [_owned(_workspace(root / f"ws{i}")) for i in range(5)]
    mine = [_workspace(root / f"admin{i}") for i in range(15)]  # root's: never capped
    polled = Polled()
    b = InotifyBackend(HintQueue(), polled, None, max_per_owner=cap)
    try:
        b.add_root(root, 2)
        with capture_logs() as logs:
            layout = b.sync()
        assert b._per_owner == {TENANT: cap}
        tenant_dirs = {root / f"f{i:02d}" for i in range(40)}
        watched_tenant = {p for p in b.paths() if p in tenant_dirs or p in spaces}
        assert len(watched_tenant) <= cap
        assert len(polled.dirs) + len(polled.workspaces) == 45 - cap  # every other one polled
        assert set(polled.dirs) | set(polled.workspaces) | watched_tenant >= tenant_dirs
        assert all(_mailbox(ws) in b.paths() for ws in mine)
        assert set(mine) <= layout.workspaces
        said = [e for e in logs if e["event"] == "watch_owner_cap"]
        assert len(said) == 1 and said[0]["uid"] == TENANT
        assert b.capped_owners() == {TENANT: {"watches": cap, "polled": 45 - cap}}
        for d in sorted(watched_tenant & tenant_dirs)[:5]:  # some go: its share comes back
            d.rmdir()
        wait_for(lambda: b.process() or b._per_owner.get(TENANT, 0) <= cap - 5, "watches freed")
    finally:
        b.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: directories of another owner")
def test_a_tenants_polled_directories_renamed_are_polled_by_their_new_names_only(
    tmp_path: Path,
) -> None:
    """Past her cap, a tenant renames her directories back and forth: the poller is handed each
    new name and lets go of the old one, so it polls what is there, not every name she used."""
    root = tmp_path / "root"
    root.mkdir()
    cap = 2
    for i in range(6):
        _owned(_mkdir(root / f"a{i}"))
    polled = Polled()
    b = InotifyBackend(HintQueue(), polled, None, max_per_owner=cap)
    try:
        b.add_root(root, 2)
        b.sync()
        before = set(polled.dirs)
        assert len(before) == 6 - cap
        for _ in range(3):  # there and back, and there again
            for i in range(6):
                old, new = (root / f"a{i}", root / f"b{i}")
                src, dst = (old, new) if old.exists() else (new, old)
                src.rename(dst)
        b.process()
        while b.behind():
            b.process()
        assert {p.name for p in polled.dirs} <= {f"b{i}" for i in range(6)}
        assert len(polled.dirs) == 6 - cap  # the watched ones followed by their watch: renamed
        assert b.capped_owners()[TENANT]["polled"] <= 6
    finally:
        b.close()


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path
