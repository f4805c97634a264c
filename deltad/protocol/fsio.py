"""Durable file primitives: atomic replace, fsynced append, and refusing reads.

Every state file goes through `atomic_write` (temp in the same dir, fsync, rename, fsync dir),
so a crash leaves either the old or the new content, never a torn file. Paths beneath a
workspace's `.delta/` are resolved by `safefs` (no symlink followed, modes by the rule).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from pathlib import Path
from typing import Any

from . import safefs
from .errors import UnsafeFile

# An answer or request larger than this is refused, not read into memory.
MAX_MAILBOX_BYTES = 1024 * 1024


def fsync_dir(path: Path) -> None:
    with safefs.opened_dir(path) as d:
        os.fsync(d.fd)


def atomic_write(path: Path, data: bytes, mode: int | None = None, *, durable: bool = True) -> None:
    """Replace `path` with `data` so that readers see the old or the new file, never a mix.

    Beneath `.delta/` the mode comes from the file-mode rule (`mode` is ignored there: the
    rule, not the caller, decides who may read workspace state); elsewhere `mode` or 0644.
    `durable=False` skips the fsync: for records nothing is decided from (io records), whose
    loss in a power cut costs a debugging aid, not a run."""
    beneath = safefs.split(path) is not None
    with safefs.parent(path, create=beneath) as d:
        tmp = safefs.temp_name(path.name)
        if not beneath:
            d.modes = safefs.Modes(d.modes.dir, 0o644 if mode is None else mode)
        fd = safefs.open_in(d, tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                if durable:
                    os.fsync(f.fileno())
            os.rename(tmp, path.name, src_dir_fd=d.fd, dst_dir_fd=d.fd)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=d.fd)
            raise
        if durable:
            os.fsync(d.fd)


def atomic_write_text(path: Path, text: str, mode: int | None = None) -> None:
    atomic_write(path, text.encode("utf-8"), mode)


def atomic_write_json(path: Path, obj: Any, mode: int | None = None) -> None:
    atomic_write(path, (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode(), mode)


def compact_json(obj: Any) -> bytes:
    """One line of JSON, no spaces: what a model request or an io record is written as (a
    pretty-printed 100,000-message body is several times larger and slower to write)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


def write_record(path: Path, data: bytes) -> None:
    """An io record (request/response bodies, tool output): atomic, compact, not fsynced."""
    atomic_write(path, data + b"\n", durable=False)


def append_durable(path: Path, data: bytes) -> None:
    """Append and fsync: a journal line is on disk before the caller acts on it."""
    with safefs.parent(path, create=True) as d:
        fd = safefs.open_in(d, path.name, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise UnsafeFile(f"{path} is not a regular file")
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)


def read_regular(path: Path, limit: int = MAX_MAILBOX_BYTES, *, follow: bool = False) -> bytes:
    """Read a file that must be a regular file no larger than `limit`.

    Refuses symlinks, FIFOs and devices (checked on the open fd, so the check cannot race a
    swap), and oversized files, each with a message naming the file. Raises FileNotFoundError
    when it does not exist."""
    return safefs.read(path, limit, follow=follow)


def read_regular_text(path: Path, limit: int = MAX_MAILBOX_BYTES, *, follow: bool = False) -> str:
    data = read_regular(path, limit, follow=follow)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise UnsafeFile(f"{path} is not valid UTF-8") from None


def lstat_or_none(path: Path) -> os.stat_result | None:
    try:
        return safefs.lstat(path)
    except (UnsafeFile, NotADirectoryError):
        return None
