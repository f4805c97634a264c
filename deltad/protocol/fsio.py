"""Durable file primitives: atomic replace, fsynced append, and refusing reads.

Every state file goes through `atomic_write` (temp in the same dir, fsync, rename, fsync dir),
so a crash leaves either the old or the new content, never a torn file.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from .errors import UnsafeFile

# An answer or request larger than this is refused, not read into memory.
MAX_MAILBOX_BYTES = 1024 * 1024


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace `path` with `data` so that readers see the old or the new file, never a mix."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str, mode: int = 0o644) -> None:
    atomic_write(path, text.encode("utf-8"), mode)


def atomic_write_json(path: Path, obj: Any, mode: int = 0o644) -> None:
    atomic_write(path, (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode(), mode)


def append_durable(path: Path, data: bytes) -> None:
    """Append and fsync: a journal line is on disk before the caller acts on it."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_regular(path: Path, limit: int = MAX_MAILBOX_BYTES) -> bytes:
    """Read a file that must be a regular file no larger than `limit`.

    Refuses symlinks (O_NOFOLLOW), FIFOs and devices (checked on the open fd, so the check
    cannot race a swap), and oversized files, each with a message naming the file.
    Raises FileNotFoundError when it does not exist.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafeFile(f"{path} is a symlink; write a regular file instead") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFile(f"{path} is not a regular file (FIFO, device or directory)")
        if st.st_size > limit:
            raise UnsafeFile(f"{path} is {st.st_size} bytes; the limit is {limit}")
        chunks: list[bytes] = []
        total = 0
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            total += len(chunk)
            if total > limit:  # grew while we read it
                raise UnsafeFile(f"{path} is over the {limit}-byte limit")
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_regular_text(path: Path, limit: int = MAX_MAILBOX_BYTES) -> str:
    data = read_regular(path, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise UnsafeFile(f"{path} is not valid UTF-8") from None


def lstat_or_none(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None
