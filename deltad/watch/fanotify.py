"""The root backend on Linux: one fanotify filesystem mark per filesystem, no watch per directory.

`fanotify_init(FAN_CLASS_NOTIF | FAN_REPORT_DFID_NAME)` plus `fanotify_mark(FAN_MARK_FILESYSTEM)`
reports every directory-entry change of a whole filesystem as (parent directory's file handle,
entry name). The `WatchTree` still decides which directories matter; "watching" one here is only
taking its handle (`name_to_handle_at`) into a table, `handle -> descriptor`, where the
descriptor is a number of our own that the tree uses as it uses inotify's. An event whose handle
is not in the table is dropped after one dictionary lookup, before any other work: the mark sees
every file written anywhere on the filesystem.

Handles are per inode, like inotify's watches: a symlinked `interaction/` has its own handle
(the link's, never its target's), so it never maps to another workspace's directory.

Needs Linux >= 5.9 and CAP_SYS_ADMIN (`probe` says why not). ctypes only: no new dependency.
The record parsing (`parse`) is pure and tested from byte tables.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import struct
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import structlog

from . import events as F
from .hints import HintQueue
from .tree import Kind, PollingLike, WatchLimit, WatchTree

log = structlog.get_logger("deltad.watch")

# <linux/fanotify.h>
FAN_CLOEXEC = 0x1
FAN_NONBLOCK = 0x2
FAN_REPORT_DFID_NAME = 0x400 | 0x800  # FAN_REPORT_DIR_FID | FAN_REPORT_NAME
FAN_MARK_ADD = 0x1
FAN_MARK_FILESYSTEM = 0x100
FAN_NOFD = -1
INFO_DFID_NAME = 2
INFO_DFID = 3
# The event bits below are inotify's values (and FAN_ONDIR is IN_ISDIR): masks pass unchanged.
MARK_MASK = (
    F.CREATE
    | F.MOVED_TO
    | F.MOVED_FROM
    | F.DELETE
    | F.CLOSE_WRITE
    | F.DELETE_SELF
    | F.MOVE_SELF
    | F.ISDIR  # FAN_ONDIR: directory events too
)
AT_FDCWD = -100
AT_SYMLINK_FOLLOW = 0x400
MAX_HANDLE_SZ = 128
READ_SIZE = 256 * 1024  # ~3,500 records
READS_PER_TURN = 16  # then back to the loop; select says the fd is still readable
# After a turn whose records were all others' (the filesystem is busy elsewhere), the fd is
# left unread this long: each wake of the loop costs more than a record, and others' writes
# would wake it thousands of times a second. Our own events wait at most this long meanwhile.
REST_SECONDS = 0.01

_METADATA = struct.Struct("=IBBHQii")  # fanotify_event_metadata
_INFO_HEADER = struct.Struct("=BBH")  # fanotify_event_info_header
_HANDLE_HEAD = struct.Struct("=Ii")  # file_handle: handle_bytes, handle_type
_FID_HEAD = _INFO_HEADER.size + 8  # + fsid
# The usual record's fixed part in one unpack: event_len, metadata_len, mask (metadata), then
# the first info's type and length, and its file_handle's handle_bytes (after the fsid).
_USUAL = struct.Struct("=I2xHQ8xBxH8xI")
_KEY_AT = _METADATA.size + _INFO_HEADER.size  # fsid + file_handle, the table's key
_HANDLE_AT = _KEY_AT + 8 + _HANDLE_HEAD.size  # the handle's bytes
_NONE: dict[bytes, int] = {}  # the table of a filesystem we did not mark
UNMARKABLE = (errno.EXDEV, errno.EOPNOTSUPP, errno.ENODEV, errno.ENOSYS, errno.EINVAL)


@dataclass(frozen=True)
class Record:
    """One event: its mask, and the key (fsid + file handle) and entry name of its directory.
    A directory's own event (DELETE_SELF, MOVE_SELF) has its own handle and the name "."."""

    mask: int
    key: bytes
    name: str


def parse(buf: bytes) -> Iterator[Record]:
    """The records of one read of a `FAN_REPORT_DFID_NAME` group. An overflow has no info
    record (key b""). Unknown info types are skipped; a truncated record ends the buffer."""
    off, end = 0, len(buf)
    while off + _METADATA.size <= end:
        event_len, _vers, _res, meta_len, mask, _fd, _pid = _METADATA.unpack_from(buf, off)
        if event_len < meta_len or off + event_len > end:
            return
        if mask & F.Q_OVERFLOW:
            yield Record(mask, b"", "")
        else:
            info = _dir_info(buf, off + meta_len, off + event_len)
            if info is not None:
                yield Record(mask, *info)
        off += event_len


def _dir_info(buf: bytes, off: int, end: int) -> tuple[bytes, str] | None:
    """The (key, name) of the first directory info record in `buf[off:end]`."""
    while off + _INFO_HEADER.size <= end:
        info_type, _pad, length = _INFO_HEADER.unpack_from(buf, off)
        if length < _INFO_HEADER.size or off + length > end:
            return None
        if info_type in (INFO_DFID_NAME, INFO_DFID):
            if length < _FID_HEAD + _HANDLE_HEAD.size:
                return None
            size = _HANDLE_HEAD.unpack_from(buf, off + _FID_HEAD)[0]
            handle_end = off + _FID_HEAD + _HANDLE_HEAD.size + size
            if handle_end > off + length:
                return None
            key = buf[off + _INFO_HEADER.size : handle_end]  # fsid + file_handle, as `key_of`
            raw = buf[handle_end : off + length].split(b"\0", 1)[0]
            return key, os.fsdecode(raw)
        off += length
    return None


def key_of(fsid: int, handle_type: int, handle: bytes) -> bytes:
    """The table key of a directory: the bytes its events carry (fsid, then `file_handle`)."""
    return struct.pack("=QIi", fsid, len(handle), handle_type) + handle


_HEAD = 8 + _HANDLE_HEAD.size  # a key's fsid, handle_bytes and handle_type


class Handles:
    """The handle table, `key -> descriptor` and back, kept small (three per workspace): keys
    are split into their head (fsid, handle size and type: the same for every directory of a
    filesystem), one table each, and the handle's own bytes; a descriptor is an index into a
    list of handles, and one freed is given again (events are mapped by key when read, so a
    stale record never reaches a reused descriptor)."""

    def __init__(self) -> None:
        self.tables: dict[bytes, dict[bytes, int]] = {}  # head -> handle -> descriptor
        self._handles: list[bytes | None] = [None]  # descriptor -> handle (0: none given)
        self._free: list[int] = []

    def get(self, key: bytes) -> int | None:
        table = self.tables.get(key[:_HEAD])
        return None if table is None else table.get(key[_HEAD:])

    def add(self, key: bytes) -> int:
        """The descriptor of `key`, given now if it has none."""
        table = self.tables.setdefault(key[:_HEAD], {})
        handle = key[_HEAD:]
        wd = table.get(handle)
        if wd is None:
            wd = self._free.pop() if self._free else len(self._handles)
            if wd == len(self._handles):
                self._handles.append(handle)
            else:
                self._handles[wd] = handle
            table[handle] = wd
        return wd

    def remove(self, wd: int) -> None:
        handle = self._handles[wd] if 0 < wd < len(self._handles) else None
        if handle is None:
            return
        for table in self.tables.values():  # one per filesystem: a few at most
            if table.get(handle) == wd:
                del table[handle]
                break
        self._handles[wd] = None
        self._free.append(wd)

    def __contains__(self, wd: int) -> bool:
        return 0 < wd < len(self._handles) and self._handles[wd] is not None

    def __len__(self) -> int:
        return len(self._handles) - 1 - len(self._free)


class _FileHandle(ctypes.Structure):
    _fields_: ClassVar = [
        ("handle_bytes", ctypes.c_uint),
        ("handle_type", ctypes.c_int),
        ("f_handle", ctypes.c_ubyte * MAX_HANDLE_SZ),
    ]


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fanotify_init.argtypes = [ctypes.c_uint, ctypes.c_uint]
    libc.fanotify_mark.argtypes = [
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.c_uint64,
        ctypes.c_int,
        ctypes.c_char_p,
    ]
    libc.name_to_handle_at.argtypes = [
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.POINTER(_FileHandle),
        ctypes.POINTER(ctypes.c_int),
        ctypes.c_int,
    ]
    return libc


def _raise(call: str) -> None:
    err = ctypes.get_errno()
    raise OSError(err, f"{call}: {os.strerror(err)}")


class Fanotify:
    """The three system calls, thinly."""

    def __init__(self) -> None:
        self._libc = _libc()
        fd = self._libc.fanotify_init(FAN_REPORT_DFID_NAME | FAN_CLOEXEC | FAN_NONBLOCK, 0)
        if fd < 0:
            _raise("fanotify_init")
        self.fd = int(fd)

    def mark_filesystem(self, path: str | Path) -> None:
        if self._libc.fanotify_mark(
            self.fd, FAN_MARK_ADD | FAN_MARK_FILESYSTEM, MARK_MASK, AT_FDCWD, os.fsencode(path)
        ):
            _raise("fanotify_mark")

    def handle(self, path: str | Path, follow: bool) -> tuple[int, bytes]:
        """(handle_type, handle) of `path`; a final symlink is followed only if asked."""
        fh = _FileHandle(handle_bytes=MAX_HANDLE_SZ)
        mount_id = ctypes.c_int()
        flags = AT_SYMLINK_FOLLOW if follow else 0
        if self._libc.name_to_handle_at(
            AT_FDCWD, os.fsencode(path), ctypes.byref(fh), ctypes.byref(mount_id), flags
        ):
            _raise("name_to_handle_at")
        return int(fh.handle_type), bytes(fh.f_handle[: fh.handle_bytes])

    def close(self) -> None:
        os.close(self.fd)


def probe(path: Path) -> str | None:
    """Why a fanotify filesystem mark cannot watch `path`, or None if it can."""
    if not sys.platform.startswith("linux"):
        return "fanotify exists only on Linux"
    if os.geteuid() != 0:
        return "fanotify filesystem marks need root (CAP_SYS_ADMIN)"
    try:
        fan = Fanotify()
    except OSError as e:
        if e.errno == errno.EINVAL:
            return "the kernel lacks FAN_REPORT_DFID_NAME (needs Linux 5.9 or later)"
        return e.strerror or str(e)
    try:
        fan.mark_filesystem(path)
        fan.handle(path, follow=True)
    except OSError as e:
        if e.errno in UNMARKABLE:
            return f"the filesystem of {path} does not report file handles"
        if e.errno == errno.EPERM:
            return "fanotify filesystem marks need CAP_SYS_ADMIN"
        return f"{path}: {e.strerror}"
    finally:
        fan.close()
    return None


class FanotifyBackend(WatchTree):
    """The directories of `WatchTree` as file handles in a table; one mark per filesystem."""

    name = "fanotify"
    FREE_WATCHES = True  # a handle in a dict: `.delta/` and `runs/` are kept too

    def __init__(self, queue: HintQueue, fallback: PollingLike) -> None:
        super().__init__(queue, fallback, None)  # no kernel watch to budget
        self._fan = Fanotify()
        self._handles = Handles()
        self._fsid: dict[int, int] = {}  # st_dev -> fsid of each marked filesystem
        self.dropped = 0  # records for directories we do not know (the busy rest of the fs)
        self._awake_at = 0.0  # monotonic time until which the fd rests (REST_SECONDS)

    def fileno(self) -> int | None:
        return None if self.rests_for() is not None else self._fan.fd

    def rests_for(self) -> float | None:
        """Seconds left of a rest (the loop wakes then), None when the fd is read as usual."""
        left = self._awake_at - time.monotonic()
        return left if left > 0 else None

    def process(self) -> None:
        before, seen = self.dropped, 0
        for _ in range(READS_PER_TURN):
            try:
                buf = os.read(self._fan.fd, READ_SIZE)
            except BlockingIOError:
                break
            except OSError as e:
                self._failed = True
                log.error("fanotify_read_failed", error=e.strerror)
                return
            seen += self._records(buf)
        if seen:  # rest only after others' records alone
            others_only = seen == self.dropped - before
            self._awake_at = time.monotonic() + REST_SECONDS if others_only else 0.0

    def _records(self, buf: bytes) -> int:
        """Dispatch one read's records; return how many. The hot path is others' writes: a
        usual record (one directory info first) whose key is not in the table is dropped after
        one unpack, one slice and one lookup; nothing is built for it. Ours, and anything
        unusual, go through `parse`."""
        tables, usual, off, end = self._handles.tables, _USUAL.unpack_from, 0, len(buf)
        dropped = seen = 0
        while off + _METADATA.size <= end:
            seen += 1
            event_len = _METADATA.unpack_from(buf, off)[0] if off + _USUAL.size > end else 0
            if not event_len:
                event_len, meta_len, mask, info_type, _info_len, size = usual(buf, off)
                handle_end = off + _HANDLE_AT + size
                if (
                    meta_len == _METADATA.size
                    and not mask & F.Q_OVERFLOW
                    and info_type in (INFO_DFID_NAME, INFO_DFID)
                    and handle_end <= off + event_len <= end
                    and buf[off + _HANDLE_AT : handle_end]
                    not in tables.get(buf[off + _KEY_AT : off + _HANDLE_AT], _NONE)
                ):
                    dropped += 1
                    off += event_len
                    continue
            if event_len < _METADATA.size or off + event_len > end:
                break  # truncated: as `parse`
            for rec in parse(buf[off : off + event_len]):
                self._on_record(rec)
            off += event_len
        self.dropped += dropped
        return seen

    def _on_record(self, rec: Record) -> None:
        wd = self._handles.get(rec.key)
        if wd is None:
            if rec.mask & F.Q_OVERFLOW:
                self._event(0, F.Q_OVERFLOW, "")
            else:
                self.dropped += 1
        elif rec.name == ".":  # the directory itself
            self._event(wd, rec.mask & (F.DELETE_SELF | F.MOVE_SELF), "")
            if rec.mask & F.DELETE_SELF and self._handles.get(rec.key) == wd:  # still ours
                self._event(wd, F.IGNORED, "")  # as inotify says after DELETE_SELF
        else:
            self._event(wd, rec.mask & ~(F.DELETE_SELF | F.MOVE_SELF), rec.name)

    def healthy(self) -> bool:
        return not self._failed

    def close(self) -> None:
        self._fan.close()

    def _add_watch(self, path: str, kind: Kind) -> int:
        root = self._is_root(path)
        st = os.stat(path) if root else os.lstat(path)
        if not stat.S_ISDIR(st.st_mode):  # inotify's ONLYDIR | DONT_FOLLOW
            raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
        fsid = self._fsid.get(st.st_dev)
        if fsid is None:
            fsid = self._mark(path, st.st_dev)
        return self._handles.add(key_of(fsid, *self._fan.handle(path, follow=root)))

    def _mark(self, path: str | Path, dev: int) -> int:
        try:
            self._fan.mark_filesystem(path)
        except OSError as e:
            if e.errno not in UNMARKABLE:
                raise
            log.warning("fanotify_unmarkable", path=str(path), error=e.strerror, fallback="polling")
            raise WatchLimit from e
        fsid = os.statvfs(path).f_fsid
        self._fsid[dev] = fsid
        log.info("fanotify_marked", path=str(path), filesystems=len(self._fsid))
        return fsid

    def _rm_watch(self, wd: int) -> None:
        self._handles.remove(wd)

    def _released(self, wd: int) -> None:
        self._rm_watch(wd)
