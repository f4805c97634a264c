"""The state dir holds keys, tokens and receipts: 0700 however `deltad serve` makes it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from deltad.core.status import StateDirLock


def test_a_state_dir_serve_makes_is_0700_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        lock = StateDirLock(tmp_path / "var" / "lib" / "deltad")
        lock.acquire()
        lock.release()
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "var" / "lib" / "deltad").st_mode) == 0o700
