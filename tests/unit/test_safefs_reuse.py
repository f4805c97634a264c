"""One look opens each directory beneath `.delta` once (`safefs.reusing_dirs`): what it reads
and refuses is what a walk from the root per file reads and refuses, and it leaves nothing open."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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


@pytest.mark.parametrize("linked", ["interaction", "runs"])
def test_a_symlinked_directory_is_refused_within_a_look_as_without(
    tmp_path: Path, linked: str
) -> None:
    ws = tmp_path / "ws"
    paused_workspace(ws)
    real = ws / ".delta" / linked
    real.rename(tmp_path / "elsewhere")
    real.symlink_to(tmp_path / "elsewhere")
    inside = real / "some-file"
    with pytest.raises(UnsafeFile):
        safefs.read(inside, 1024)
    with safefs.reusing_dirs(), pytest.raises(UnsafeFile):
        safefs.read(inside, 1024)
    with safefs.reusing_dirs(), pytest.raises(UnsafeFile):
        safefs.lstat(inside)
    assert inspect(ws, Why.DISCOVERED, 0.0, Policy()).problem


def test_a_missing_directory_is_missing_within_a_look(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    paused_workspace(ws)
    gone = ws / ".delta" / "no-such-dir" / "file"
    with safefs.reusing_dirs():
        assert safefs.lstat(gone) is None
        assert safefs.listdir(gone.parent) == []
        with pytest.raises(FileNotFoundError):
            safefs.read(gone, 1024)
