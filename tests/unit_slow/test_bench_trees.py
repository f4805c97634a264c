"""The bench's fast tree builder (bench/trees.py) writes what `paused_workspace` writes, names
that sort at every size, and finishes an interrupted build instead of redoing it."""

from __future__ import annotations

import os
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bench import trees
from deltad.protocol import Mailbox, RunStatus, Workspace, load_metadata
from deltad.testing.stub import paused_workspace

RUN_ID = re.compile(r"\d{8}_\d{6}_[0-9a-f]{6}")
NONE = trees.Reserve(0, 0)  # a test's few workspaces fit whatever else is on the disk
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def layout(ws: Path) -> list[tuple[str, int, bytes | None]]:
    """Every entry beneath `ws`: path, mode, contents; ids, times and the path normalised."""

    def norm(text: str) -> str:
        text = text.replace(str(ws), "WS")
        return trees.ISO_TIME.sub("TIME", UUID.sub("UUID", RUN_ID.sub("RUN", text)))

    out: list[tuple[str, int, bytes | None]] = [(".", os.stat(ws).st_mode, None)]
    for parent, dirs, files in os.walk(ws):
        for name in dirs + files:
            path = Path(parent) / name
            body = None if path.is_dir() else norm(path.read_text()).encode()
            out.append((norm(str(path.relative_to(ws))), os.stat(path).st_mode, body))
    return sorted(out)


def test_a_built_workspace_is_a_paused_workspace_but_for_ids_and_times(tmp_path: Path) -> None:
    slow, fast = tmp_path / "slow", tmp_path / "fast"
    for i in range(3):
        paused_workspace(slow / trees.workspace_name(i, 3))
    trees.build(fast, 3, jobs=1, reserve=NONE)
    assert trees.complete(fast)
    assert sorted(os.listdir(fast)) == sorted(os.listdir(slow)) == ["ws00000", "ws00001", "ws00002"]
    for name in os.listdir(slow):
        assert layout(fast / name) == layout(slow / name)
    # …and the protocol reads them back as a question waiting, each with its own ids.
    run_ids, request_ids = set(), set()
    for name in os.listdir(fast):
        ws = Workspace.at(fast / name)
        run_id = ws.latest_run_id()
        assert run_id is not None
        meta = load_metadata(ws.run(run_id).metadata)
        request = Mailbox(ws).read_request()
        assert meta.status is RunStatus.WAITING_FOR_INPUT and meta.agent_ref == str(
            ws.root / "agent"
        )
        assert request is not None and request.run_id == run_id
        run_ids.add(run_id)
        request_ids.add(request.request_id)
    assert len(run_ids) == len(request_ids) == 3


def test_names_are_padded_to_the_size_so_they_sort(tmp_path: Path) -> None:
    assert trees.workspace_name(7, 3000) == "ws00007"  # the trees built before stay as named
    assert trees.workspace_name(7, 100_000) == "ws00007"
    assert trees.workspace_name(7, 1_000_000) == "ws000007"
    spaces = trees.Spaces(tmp_path, 1_000_000)
    picked = [spaces[i].name for i in (0, 9, 10, 99_999, 100_000, 999_999)]
    assert picked == sorted(picked) and len(spaces) == 1_000_000
    assert spaces[-1] == tmp_path / "ws999999"


def test_an_interrupted_build_is_finished_not_redone(tmp_path: Path) -> None:
    n = 2 * trees.CHUNK + 5  # three chunks; the first and the last were done before the stop
    root = tmp_path / f"root{n}"
    state = trees.building_dir(root)
    state.mkdir()
    (state / "base").write_text("2026-01-01T00:00:00+00:00")
    (state / "chunk-000000.done").touch()
    (state / "chunk-000002.done").touch()
    # The middle chunk was cut short in its first workspace's first file.
    half = root / trees.workspace_name(trees.CHUNK, n) / ".delta" / "interaction"
    half.mkdir(parents=True)
    (half / "request.json").write_text('{"request_id": "trunc')
    assert not trees.complete(root)

    trees.build(root, n, jobs=2, reserve=NONE)

    assert trees.complete(root) and not state.exists()
    names = sorted(os.listdir(root))  # chunks marked done were not written again
    assert names == [trees.workspace_name(i, n) for i in range(trees.CHUNK, 2 * trees.CHUNK)]
    ws = Workspace.at(root / names[0])
    assert ws.latest_run_id() == "20260101_000001_0003e8"  # the build's first time, kept
    request = Mailbox(ws).read_request()
    assert request is not None and request.run_id == ws.latest_run_id()


def test_a_build_that_would_fill_the_disk_stops_before_writing(tmp_path: Path) -> None:
    st = os.statvfs(tmp_path)
    # The whole disk must stay free: never true, whatever others free meanwhile (a reserve of
    # what was free a moment ago was met once another process deleted a few files).
    everything = trees.Reserve(st.f_blocks * st.f_frsize, 0)
    root = tmp_path / "root5"
    with pytest.raises(trees.DiskFull, match="must stay free"):
        trees.build(root, 5, jobs=1, reserve=everything)
    assert os.listdir(root) == [] and not trees.complete(root)
    trees.build(root, 5, jobs=1, reserve=NONE)  # with room, the same build goes on
    assert trees.complete(root) and len(os.listdir(root)) == 5


def test_every_question_of_a_tree_was_asked_before_the_build(tmp_path: Path) -> None:
    root = tmp_path / "root1000000"
    trees.building_dir(root).mkdir()
    started = datetime.now(UTC)
    base = trees._base(root, 1_000_000)
    last = datetime.fromisoformat(trees.Template.taken().fields(999_999, base)["time"])
    assert last <= started
    assert trees._base(root, 1_000_000) == base  # kept: a resumed build writes the same times
