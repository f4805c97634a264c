"""The client's `live` file (deltad/protocol/live.py): held open for writing while a run is
driven, never a way to make the client hang or write through a link."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from deltad.protocol import Workspace
from deltad.protocol.live import Live
from deltad.protocol.process import proc_stat


def _writers(path: Path) -> int:
    """How many of this process's descriptors hold `path` open for writing."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") != str(path):
                continue
            flags = int(
                Path(f"/proc/self/fdinfo/{fd}").read_text().split("flags:")[1].split()[0], 8
            )
        except (OSError, IndexError, ValueError):
            continue
        n += bool(flags & (os.O_WRONLY | os.O_RDWR))
    return n


def test_held_open_for_writing_until_closed(tmp_path: Path) -> None:
    ws = Workspace.at(tmp_path / "ws")
    ws.root.mkdir()
    live = Live(ws)
    live.open()  # makes .delta/interaction/ when there is none yet
    assert ws.live_file.is_file() and _writers(ws.live_file) == 1
    assert ws.live_file.read_text().split()[0] == str(os.getpid())
    live.close()
    assert _writers(ws.live_file) == 0


def test_a_fifo_or_a_symlink_at_its_name_is_left_alone(tmp_path: Path) -> None:
    ws = Workspace.at(tmp_path / "ws")
    ws.interaction_dir.mkdir(parents=True)
    os.mkfifo(ws.live_file)
    live = Live(ws)
    live.open()  # no reader: would block without O_NONBLOCK; here it just gives up
    live.close()
    os.unlink(ws.live_file)
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    ws.live_file.symlink_to(target)
    Live(ws).open()
    assert target.read_text() == "keep"


@pytest.mark.linux_only  # /proc
def test_this_process_is_not_exiting() -> None:
    st = proc_stat(os.getpid())
    assert st is not None and not st.exiting and not st.dead
