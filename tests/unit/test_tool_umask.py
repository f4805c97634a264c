"""The umask the agent's tools run with follows `.delta/`'s file-mode rule (safefs.tool_umask)."""

from __future__ import annotations

import os
import stat

import pytest

from deltad.protocol.safefs import tool_umask


def _st(mode: int) -> os.stat_result:
    return os.stat_result((mode, 0, 0, 1, 0, 0, 0, 0, 0, 0))


@pytest.mark.parametrize(
    ("delta_dir", "umask"),
    [
        (None, None),  # no .delta/ yet: delta's own umask
        (_st(stat.S_IFDIR | 0o700), None),  # private
        (_st(stat.S_IFDIR | 0o2770), 0o007),  # shared: setgid, group rwx
        (_st(stat.S_IFDIR | 0o2750), None),  # setgid without group write: not shared
        (_st(stat.S_IFDIR | 0o770), None),  # group rwx without setgid: not shared
        (_st(stat.S_IFDIR | 0o2777), 0o007),  # shared (and other-writable: tenancy refuses it)
    ],
)
def test_tools_in_a_shared_workspace_create_group_readable_files(
    delta_dir: os.stat_result | None, umask: int | None
) -> None:
    assert tool_umask(delta_dir) == umask
