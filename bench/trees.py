"""Trees of paused workspaces for the benchmarks, built fast enough for 1,000,000.

    .venv/bin/python bench/trees.py /tmp/ready-dev 1000000      # builds /tmp/ready-dev/root1000000

`deltad.testing.stub.paused_workspace` writes each file through the protocol package (atomic
replace, fsync, models serialised per workspace): ~500 workspaces a second, 30 minutes for
1,000,000 before the disk's share. Here one workspace is built that way as a template, and every
workspace of the tree is written from it with plain `os` calls (no fsync, no temporary names):
the same directories, files, modes and bytes but for the run id, the request id, the times and
the workspace's own path, which are per workspace and deterministic (a chunk written twice
writes the same bytes). Two processes write chunks of `CHUNK` workspaces; a marker per chunk in
DIR/root<N>.building/ records it done, so an interrupted build is finished, not redone; the
directory goes when the last chunk is in. A tree is complete when its root exists and no such
directory does (`complete`). Names are zero-padded to the size's width, so they sort.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from multiprocessing import get_context
from pathlib import Path
from typing import TextIO, overload

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from deltad.protocol import iso  # noqa: E402
from deltad.protocol.printable import show_path  # noqa: E402
from deltad.testing.stub import paused_workspace  # noqa: E402

CHUNK = 1000  # workspaces per marker: a crash redoes at most this many
TEMPLATE_RUN_ID = "20000101_000000_abcdef"
ISO_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z")


def width(n: int) -> int:
    """Digits in a name: 5 at least (the trees built before 1,000,000 are named ws00000…)."""
    return max(5, len(str(max(n - 1, 0))))


def workspace_name(i: int, n: int) -> str:
    return f"ws{i:0{width(n)}d}"


class Spaces(Sequence[Path]):
    """The workspaces of a tree of N, as paths made on demand: a million Paths held at once
    would be ~200 MB of the bench's own memory."""

    def __init__(self, root: Path, n: int) -> None:
        self.root, self.n = root, n

    def __len__(self) -> int:
        return self.n

    @overload
    def __getitem__(self, i: int) -> Path: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Path]: ...
    def __getitem__(self, i: int | slice) -> Path | Sequence[Path]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.n))]
        if not -self.n <= i < self.n:
            raise IndexError(i)
        return self.root / workspace_name(i % self.n, self.n)

    def __iter__(self) -> Iterator[Path]:
        return (self[i] for i in range(self.n))


def building_dir(root: Path) -> Path:
    return root.with_name(root.name + ".building")


def complete(root: Path) -> bool:
    return root.is_dir() and not building_dir(root).exists()


# -- the template -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Template:
    """One paused workspace as format strings: relative paths and contents with the fields
    {run_id}, {request_id}, {time}, {agent_ref}; modes as `paused_workspace` left them."""

    mode: int  # the workspace directory's own
    dirs: tuple[tuple[str, int], ...]  # parents first
    files: tuple[tuple[str, str, int], ...]

    @staticmethod
    def taken() -> Template:
        with tempfile.TemporaryDirectory(prefix="tree-template-") as tmp:
            ws = Path(tmp) / "ws"
            paused_workspace(ws, run_id=TEMPLATE_RUN_ID)
            return Template.of(ws)

    @staticmethod
    def of(ws: Path) -> Template:
        request = json.loads((ws / ".delta" / "interaction" / "request.json").read_text())
        tokens = {
            TEMPLATE_RUN_ID: "{run_id}",
            request["request_id"]: "{request_id}",
            json.dumps(show_path(ws / "agent"))[1:-1]: "{agent_ref}",
        }
        dirs, files = [], []
        for parent, names, leaves in sorted(os.walk(ws)):
            rel = os.path.relpath(parent, ws)
            for name in sorted(names):
                path = os.path.normpath(os.path.join(rel, name))
                dirs.append((_formatted(path, tokens), os.stat(ws / path).st_mode & 0o7777))
            for name in sorted(leaves):
                path = os.path.normpath(os.path.join(rel, name))
                text = (ws / path).read_text()
                mode = os.stat(ws / path).st_mode & 0o7777
                files.append((_formatted(path, tokens), _formatted(text, tokens), mode))
        dirs.sort(key=lambda d: d[0].count("/"))  # parents before children
        return Template(os.stat(ws).st_mode & 0o7777, tuple(dirs), tuple(files))

    @property
    def inodes(self) -> int:
        return 1 + len(self.dirs) + len(self.files)

    def fields(self, i: int, base: datetime) -> dict[str, str]:
        """Workspace i's own values: a time 1 ms after the one before, a run id of that time
        and i, a request id hashed from both (deterministic: a redone chunk writes the same)."""
        at = base + timedelta(milliseconds=i)
        digest = hashlib.md5(f"{base.isoformat()}/{i}".encode()).digest()
        return {
            "run_id": f"{at:%Y%m%d_%H%M%S}_{i % 0x1000000:06x}",
            "request_id": str(uuid.UUID(bytes=digest, version=4)),
            "time": iso(at),
            "agent_ref": "",  # per workspace, in write
        }


def _formatted(text: str, tokens: dict[str, str]) -> str:
    """`text` as a format string: braces escaped, the tokens and every ISO time as fields."""
    out = text.replace("{", "{{").replace("}", "}}")
    for value, field in tokens.items():
        out = out.replace(value, field)
    return ISO_TIME.sub("{time}", out)


def write_workspace(template: Template, ws: Path, fields: dict[str, str]) -> None:
    """Plain os calls, umask 0 (the template's modes exactly); a redo overwrites in place."""
    fields = {**fields, "agent_ref": json.dumps(show_path(ws / "agent"))[1:-1]}
    base = str(ws)
    _mkdir(base, template.mode)
    for rel, mode in template.dirs:
        _mkdir(f"{base}/{rel.format_map(fields)}", mode)
    for rel, text, mode in template.files:
        fd = os.open(
            f"{base}/{rel.format_map(fields)}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode
        )
        try:
            os.write(fd, text.format_map(fields).encode())
        finally:
            os.close(fd)


def _mkdir(path: str, mode: int) -> None:
    with contextlib.suppress(FileExistsError):  # a redone chunk
        os.mkdir(path, mode)


# -- building ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Job:
    template: Template
    root: Path
    n: int
    chunk: int
    base: datetime


def _marker(root: Path, chunk: int) -> Path:
    return building_dir(root) / f"chunk-{chunk:06d}.done"


def _write_chunk(job: Job) -> int:
    os.umask(0)
    lo, hi = job.chunk * CHUNK, min(job.n, (job.chunk + 1) * CHUNK)
    for i in range(lo, hi):
        ws = job.root / workspace_name(i, job.n)
        write_workspace(job.template, ws, job.template.fields(i, job.base))
    _marker(job.root, job.chunk).touch()  # after the chunk's last write: done means done
    return hi - lo


def _base(root: Path, n: int) -> datetime:
    """The first workspace's time, kept beside the markers (a resumed build writes the same):
    N ms before the build started, so the last question too was asked in the past."""
    path = building_dir(root) / "base"
    if not path.exists():
        start = datetime.now(UTC).replace(microsecond=0) - timedelta(milliseconds=n)
        path.write_text(start.isoformat())
    return datetime.fromisoformat(path.read_text())


class DiskFull(Exception):
    """The tree would leave less free than the reserve."""


@dataclass(frozen=True)
class Reserve:
    """What a build leaves free on the disk, for everyone else on the machine."""

    bytes: int = 8 << 30
    inodes: int = 1_000_000

    def check(self, root: Path, template: Template, workspaces: int) -> None:
        inodes = workspaces * template.inodes
        st = os.statvfs(root)
        free_bytes, free_inodes = st.f_bavail * st.f_frsize, st.f_favail
        if free_bytes - inodes * st.f_bsize < self.bytes or free_inodes - inodes < self.inodes:
            raise DiskFull(
                f"{workspaces:,} workspaces need {inodes:,} inodes and "
                f"{inodes * st.f_bsize / 2**30:.1f} GB; {free_inodes:,} and "
                f"{free_bytes / 2**30:.1f} GB free, {self.inodes:,} and "
                f"{self.bytes / 2**30:.0f} GB must stay free"
            )


def build(
    root: Path, n: int, jobs: int = 2, out: TextIO = sys.stderr, reserve: Reserve = Reserve()
) -> float:
    """Build (or finish building) the tree of N at `root`; return the seconds it took. Before
    each chunk the disk must hold what is left to write plus `reserve`, else `DiskFull` (the
    chunks written so far stay: a later build finishes them)."""
    t0 = time.monotonic()
    if complete(root):
        return 0.0
    building_dir(root).mkdir(parents=True, exist_ok=True)
    root.mkdir(exist_ok=True)
    base = _base(root, n)
    template = Template.taken()
    chunks = [c for c in range(-(-n // CHUNK)) if not _marker(root, c).exists()]
    todo = sum(min(n, (c + 1) * CHUNK) - c * CHUNK for c in chunks)
    _say(out, f"{root}: {n - todo:,} of {n:,} workspaces already there, {todo:,} to write")
    reserve.check(root, template, todo)
    written, last = 0, 0.0
    with get_context("fork").Pool(jobs) as pool:
        for count in pool.imap_unordered(
            _write_chunk, (Job(template, root, n, c, base) for c in chunks)
        ):
            written += count
            reserve.check(root, template, todo - written)  # others use the disk too
            now = time.monotonic()
            if now - last >= 10 or written == todo:
                last = now
                rate = written / max(now - t0, 1e-9)
                left = (todo - written) / rate if rate else float("inf")
                _say(
                    out, f"{written:,} / {todo:,} written, {rate:,.0f}/s, {left / 60:.1f} min left"
                )
    shutil.rmtree(building_dir(root))
    return time.monotonic() - t0


def _say(out: TextIO, text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {text}", file=out, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("dir", type=Path, help="the tree is DIR/root<N>")
    ap.add_argument("n", type=int)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--reserve-gb", type=float, default=8, help="disk left free (default 8)")
    ap.add_argument("--reserve-inodes", type=int, default=1_000_000, help="inodes left free")
    args = ap.parse_args()
    reserve = Reserve(int(args.reserve_gb * 2**30), args.reserve_inodes)
    try:
        took = build(args.dir / f"root{args.n}", args.n, args.jobs, reserve=reserve)
    except DiskFull as e:
        sys.exit(f"trees: stopped, the disk is too full: {e}")
    print(f"{args.n:,} workspaces in {took:.0f} s")


if __name__ == "__main__":
    main()
