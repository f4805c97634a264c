"""One look opens each directory beneath `.delta` once (`safefs.reusing_dirs`): what it reads
and refuses is what a walk from the root per file reads and refuses, and it leaves nothing open."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from deltad.core.facts import State
from deltad.core.reconcile import inspect
from deltad.core.tenancy import Policy
from deltad.protocol import Workspace, safefs
from deltad.protocol.errors import UnsafeFile
from deltad.testing.stub import paused_workspace
from deltad.watch.hints import Why


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_look_reads_the_same_with_one_handle_per_directory(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    paused_workspace(ws)
    (ws / ".delta" / "interaction" / "response.txt").write_text("yes")
    alone = Workspace(ws)
    request, run_id = alone.request_file, alone.latest_run_id()
    before = _open_fds()
    with safefs.reusing_dirs():
        assert Workspace(ws).latest_run_id() == run_id
        assert safefs.read(request, 1 << 20) == request.read_bytes()
        assert safefs.lstat(request) is not None
        assert safefs.lstat(request.with_name("nothing")) is None
        assert sorted(safefs.listdir(request.parent)) == sorted(os.listdir(request.parent))
        held = _open_fds()
        with safefs.reusing_dirs():  # nested: the outer span's handles serve it
            assert safefs.read(request, 1 << 20) == request.read_bytes()
        assert _open_fds() == held
    assert held > before  # the handles were kept for the span…
    assert _open_fds() == before  # …and closed at its end
    with safefs.reusing_dirs():
        seen = inspect(ws, Why.DISCOVERED, 0.0, Policy())
    assert seen == inspect(ws, Why.DISCOVERED, 0.0, Policy())
    assert seen.run_id == run_id and seen.request_id is not None


@pytest.mark.parametrize("linked", ["", "interaction", "runs", "RUN", "RUN/execution"])
def test_a_symlinked_directory_is_refused_within_a_look_as_without(
    tmp_path: Path, linked: str
) -> None:
    ws = tmp_path / "ws"
    paused_workspace(ws)
    run_id = Workspace(ws).latest_run_id()
    assert run_id is not None
    real = ws / ".delta" / linked.replace("RUN", f"runs/{run_id}")
    real.rename(tmp_path / "elsewhere")
    real.symlink_to(tmp_path / "elsewhere")
    inside = real / "some-file"
    with pytest.raises(UnsafeFile):
        safefs.read(inside, 1024)
    with safefs.reusing_dirs(), pytest.raises(UnsafeFile):
        safefs.read(inside, 1024)
    with safefs.reusing_dirs(), pytest.raises(UnsafeFile):
        safefs.lstat(inside)
    with safefs.reusing_dirs():  # its parent's handle held first, then the link met below it
        assert safefs.lstat(real.parent / "nothing") is None
        for _ in range(2):  # the first refusal leaves what it opened held, the second uses it
            with pytest.raises(UnsafeFile):
                safefs.read(inside, 1024)
    seen = inspect(ws, Why.DISCOVERED, 0.0, Policy())
    assert seen.problem if linked else seen.state is State.GONE  # a linked .delta: none here


def test_a_looks_lstat_of_delta_is_made_from_the_held_workspace_handle_without_following(
    tmp_path: Path,
) -> None:
    """The tenancy check lstats `.delta` itself relative to the workspace directory's handle
    the look holds: what it finds is `.delta` as it is, a link reported as a link."""
    ws = tmp_path / "ws"
    paused_workspace(ws)
    delta = ws / ".delta"
    with safefs.reusing_dirs():
        assert Workspace(ws).latest_run_id() is not None  # the workspace's handle is now held
        st = safefs.lstat(delta)
        assert st is not None and stat.S_ISDIR(st.st_mode)
        assert st.st_ino == os.lstat(delta).st_ino
        delta.rename(tmp_path / "moved")
        delta.symlink_to(tmp_path / "moved")
        st = safefs.lstat(delta)
        assert st is not None and stat.S_ISLNK(st.st_mode)
        assert safefs.lstat(ws / "nothing") is None
    refused = inspect(ws, Why.DISCOVERED, 0.0, Policy())
    assert refused.state is State.GONE  # not a workspace: as before the handle was held


@pytest.mark.parametrize(
    "path",
    [
        ".delta",
        ".delta/x",
        "a/.delta",
        "/a/.delta/b",
        "/a/.deltas/b",
        "/a/x.delta/b",
        "/a/b",
        "/",
        ".",
        "/.delta",
        "a/.delta/b/.delta",
        "/a/.delta.d",
        "delta",
        "/a/b.delta",
    ],
)
def test_the_quick_test_for_a_delta_component_is_the_split(path: str) -> None:
    assert safefs._is_beneath(path) is (safefs._split(path) is not None)


def test_a_missing_directory_is_missing_within_a_look(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    paused_workspace(ws)
    gone = ws / ".delta" / "no-such-dir" / "file"
    with safefs.reusing_dirs():
        assert safefs.lstat(gone) is None
        assert safefs.listdir(gone.parent) == []
        with pytest.raises(FileNotFoundError):
            safefs.read(gone, 1024)
