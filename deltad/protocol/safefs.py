"""Filesystem access beneath a workspace that never follows a symlink inside `.delta/`.

A workspace belongs to whoever can write in it, and `deltad` may act on it with more
privileges than its owner. So every path with a `.delta` component is resolved from the
directory that holds `.delta` (the workspace root, which may itself be reached through
symlinks, e.g. /home -> /usr/home) one component at a time with `O_NOFOLLOW | O_DIRECTORY`,
and the last step (open, rename, unlink, stat, list) is made relative to that directory fd.
A symlink anywhere from `.delta` down is refused with `UnsafeFile`, never followed.

Paths without a `.delta` component (agent files, the daemon's state dir) are opened as asked.

Modes (docs/daemon.md, "File modes") are applied here too, explicitly, so no umask matters:
private by default (dirs 0700, files 0600); a shared `.delta/` (setgid, group rwx) makes
new dirs 2770 and files 0660. When root creates something in a directory owned by someone
else, it is handed to that directory's owner, so a root daemon never leaves root-owned files
in a user's run.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from .errors import UnsafeFile

DELTA_DIR = ".delta"

PRIVATE_DIR, PRIVATE_FILE = 0o700, 0o600
SHARED_DIR, SHARED_FILE = 0o2770, 0o660


def is_shared(st: os.stat_result) -> bool:
    """A `.delta/` an operator made for a group: setgid and group rwx."""
    return bool(st.st_mode & stat.S_ISGID) and st.st_mode & 0o070 == 0o070


@dataclass(frozen=True)
class Modes:
    dir: int
    file: int

    @classmethod
    def of(cls, delta_st: os.stat_result | None) -> Modes:
        if delta_st is not None and is_shared(delta_st):
            return cls(SHARED_DIR, SHARED_FILE)
        return cls(PRIVATE_DIR, PRIVATE_FILE)


# What the agent's tools create in a shared workspace is group rw, like `.delta/`'s own files.
SHARED_TOOL_UMASK = 0o007


def tool_umask(delta_st: os.stat_result | None) -> int | None:
    """The umask the agent's tools run with, decided from `.delta/` as its files' modes are:
    a shared `.delta/` means the owner reads through the group what a service user's tools
    write (0660 files, 2770 directories under a setgid workspace); otherwise None, the umask
    `delta` was started with (a person's own, or 0077 for a daemon's resume as the owner)."""
    return SHARED_TOOL_UMASK if delta_st is not None and is_shared(delta_st) else None


def split(path: Path) -> tuple[Path, tuple[str, ...]] | None:
    """(the directory holding `.delta`, the components from `.delta` down), or None when
    `path` has no `.delta` component. The first `.delta` counts: names below it are the
    protocol's own (or sanitised ids), so a later `.delta` is just a name."""
    found = _split(os.fspath(path))
    return None if found is None else (Path(found[0]), tuple(found[1]))


def _split(path: str) -> tuple[str, list[str]] | None:
    """`split` on the string of a Path (already normal: no `//` but a leading one, no `.`
    component, no trailing `/`), without pathlib's parsing: it runs for every file a look
    reads, and pathlib's parsing was a fifth of a look's time."""
    names = path.split("/")
    try:
        i = names.index(DELTA_DIR)
    except ValueError:
        return None
    return ("/".join(names[:i]) or "/") if i else ".", names[i:]


def _is_beneath(path: str) -> bool:
    """`_split(path) is not None` without splitting: whether a component is `.delta`."""
    return (
        path == DELTA_DIR
        or path.startswith(_DELTA_FIRST)
        or _DELTA_INSIDE in path
        or path.endswith(_DELTA_LAST)
    )


_DELTA_FIRST, _DELTA_INSIDE, _DELTA_LAST = f"{DELTA_DIR}/", f"/{DELTA_DIR}/", f"/{DELTA_DIR}"


def _join(parent: str, name: str) -> str:
    if parent == ".":
        return name
    return parent + name if parent.endswith("/") else f"{parent}/{name}"


def _refuse(path: Path, what: str) -> UnsafeFile:
    return UnsafeFile(f"{path} is {what}; inside .delta/ only real directories and files are used")


@dataclass
class Dir:
    """An open directory fd and what new entries in it should look like."""

    fd: int
    where: str  # its path, for messages only: every operation is relative to `fd`
    modes: Modes
    owner: tuple[int, int] | None  # (uid, gid) to hand new entries to, when root creates them

    @property
    def path(self) -> Path:
        return Path(self.where)

    def close(self) -> None:
        os.close(self.fd)


def _owner_for(st: os.stat_result) -> tuple[int, int] | None:
    if os.geteuid() == 0 and st.st_uid != 0:
        return st.st_uid, st.st_gid
    return None


def _adopt(fd: int, d: Dir, mode: int) -> None:
    os.fchmod(fd, mode)
    if d.owner is not None:
        os.fchown(fd, *d.owner)


def _open_sub(d: Dir, name: str, create: bool) -> int:
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(name, flags, dir_fd=d.fd)
    except FileNotFoundError:
        if not create:
            raise
    with contextlib.suppress(FileExistsError):  # made meanwhile by someone else: fine
        os.mkdir(name, d.modes.dir, dir_fd=d.fd)
        fd = os.open(name, flags, dir_fd=d.fd)
        try:
            _adopt(fd, d, d.modes.dir)
        except BaseException:
            os.close(fd)
            raise
        return fd
    return os.open(name, flags, dir_fd=d.fd)


# CPython's pathlib up to 3.11 joins a child without parsing it (private, hence looked up, not
# called by name); 3.12 rewrote pathlib: there is none, and `child` falls back to the plain join.
_UNPARSED_CHILD: Callable[[Path, str], Path] | None = getattr(Path, "_make_child_relpath", None)


def child(path: Path, name: str) -> Path:
    """`path / name` without interning `name`: pathlib interns every part it parses, and a
    run id joined so at each read of a workspace, though let go at once, grew the
    interpreter's table of interned strings, which never shrinks (deltad: ~190 bytes per
    workspace). Where pathlib has no unparsed child (3.12 and later), the plain join: there
    every path parsed interns its parts anyway, so a run id read is interned once (one entry
    per run, not per read; tests/unit/test_daemon_memory.py)."""
    if _UNPARSED_CHILD is None:
        return path / name
    return _UNPARSED_CHILD(path, name)


def _walk_error(e: OSError, path: str) -> Exception:
    if e.errno in (errno.ELOOP, errno.EMLINK):
        return _refuse(Path(path), "a symlink")
    if e.errno == errno.ENOTDIR:
        return _refuse(Path(path), "not a directory")
    return e


def open_dir(path: Path | str, *, create: bool = False) -> Dir:
    """Open directory `path` (making missing ones when `create`) without following a symlink
    from `.delta` down. Raises FileNotFoundError, UnsafeFile or OSError."""
    where = os.fspath(path)
    parts = _split(where)
    if parts is None:
        if create:
            os.makedirs(where, exist_ok=True)
        fd = os.open(where, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        return Dir(fd, where, Modes(0o755, 0o644), None)
    root, rel = parts
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    # Who owns a directory matters only for what is made in it: the last one's, or each
    # one's on the way when missing ones are made.
    owner = _owner_for(os.fstat(fd)) if create else None
    d = Dir(fd, root, Modes(PRIVATE_DIR, PRIVATE_FILE), owner)
    here = root
    last = len(rel) - 1
    try:
        for i, name in enumerate(rel):
            here = _join(here, name)
            try:
                sub = _open_sub(d, name, create)
            except OSError as e:
                raise _walk_error(e, here) from None
            os.close(d.fd)
            d = Dir(sub, here, d.modes, None)
            if i == 0 or i == last or create:
                st = os.fstat(sub)
                if i == 0:  # `.delta` itself decides the modes of everything below it
                    d.modes = Modes.of(st)
                d.owner = _owner_for(st)
    except BaseException:
        d.close()
        raise
    return d


class _Reused(threading.local):
    """The directories one thread has open for reuse (`reusing_dirs`), by path; None outside."""

    dirs: dict[str, Dir] | None = None


_REUSED = _Reused()


@contextlib.contextmanager
def reusing_dirs() -> Iterator[None]:
    """Within it, this thread opens each directory beneath `.delta` once and reads every file
    in it relative to that one handle, instead of walking from the workspace root per file:
    one look of a workspace reads nine files in four directories. The directory holding
    `.delta` is kept open too (it is opened as any path without `.delta` is, links followed),
    so the lstat of `.delta` itself (tenancy) and of names beside it are made from it. For
    reads only (creating goes the usual way), and for a span as short as one look: a directory
    replaced meanwhile is not seen until the next (`reconcile.inspect` looks twice before it
    acts)."""
    if _REUSED.dirs is not None:  # nested: the outer span owns the handles
        yield
        return
    _REUSED.dirs = {}
    try:
        yield
    finally:
        dirs, _REUSED.dirs = _REUSED.dirs, None
        for d in dirs.values():
            d.close()


def _reused(where: str, dirs: dict[str, Dir]) -> Dir:
    """`where` opened from its parent's reused handle, kept in `dirs`. `.delta` itself is
    opened as `open_dir` opens it, from the directory holding it, and that directory's handle
    is kept too (opened as `open_dir` opens a path without `.delta`, following links): the
    look's lstat of `.delta` itself (tenancy) is then made relative to it."""
    if (d := dirs.get(where)) is not None:
        return d
    i = where.rfind("/")
    if i > 0 and (above := dirs.get(where[:i])) is not None and where[i + 1 :] != DELTA_DIR:
        # Its parent is held (a hit, as in `_held_parent`), and it is not `.delta` itself:
        # the parent is `.delta` or below it.
        return _reused_sub(above, where, where[i + 1 :], dirs)
    up, name = os.path.split(where)
    if name == "" or not _is_beneath(up or "."):
        if name != DELTA_DIR:
            d = open_dir(where)
        else:
            top = _reused_top(up or ".", dirs)
            try:
                fd = _open_sub(top, name, False)
            except OSError as e:
                raise _walk_error(e, where) from None
            d = Dir(fd, where, Modes(PRIVATE_DIR, PRIVATE_FILE), None)
            st = os.fstat(fd)
            d.modes, d.owner = Modes.of(st), _owner_for(st)
    else:
        return _reused_sub(_reused(up, dirs), where, name, dirs)
    dirs[where] = d
    return d


def _reused_sub(above: Dir, where: str, name: str, dirs: dict[str, Dir]) -> Dir:
    """`where`, the directory `name` in `above` (beneath `.delta`), opened and kept."""
    try:
        fd = _open_sub(above, name, False)
    except OSError as e:
        raise _walk_error(e, where) from None
    d = dirs[where] = Dir(fd, where, above.modes, _owner_for(os.fstat(fd)))
    return d


def _reused_top(where: str, dirs: dict[str, Dir]) -> Dir:
    """The directory holding `.delta`, opened as `open_dir` opens it, kept in `dirs`."""
    if (d := dirs.get(where)) is None:
        fd = os.open(where, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        d = dirs[where] = Dir(fd, where, Modes(0o755, 0o644), None)  # as `open_dir`'s
    return d


@contextlib.contextmanager
def opened_dir(path: Path | str, *, create: bool = False) -> Iterator[Dir]:
    dirs = _REUSED.dirs
    if dirs is not None and not create and (where := os.fspath(path)) and _is_beneath(where):
        yield _reused(where, dirs)  # closed when the span ends
        return
    d = open_dir(path, create=create)
    try:
        yield d
    finally:
        d.close()


@contextlib.contextmanager
def parent(path: Path, *, create: bool = False) -> Iterator[Dir]:
    with opened_dir(os.path.dirname(os.fspath(path)) or ".", create=create) as d:
        yield d


def _held_parent(where: str) -> tuple[Dir, str, bool]:
    """`parent` for the reads a look makes many of, without a context manager's cost: (the
    directory, the name in it, whether the caller closes it: not when it is reused)."""
    dirs = _REUSED.dirs
    if dirs is not None:
        # Within a look the parent is most often held already: found by a string cut, with
        # no parsing (`os.path.split` and `_split` cost a tenth of a look when run per file).
        # Every key in `dirs` is a directory `_reused` opened, so a hit is what a miss would
        # open (its `_split` was checked then, or it is the directory holding `.delta`).
        i = where.rfind("/")
        if i > 0 and (d := dirs.get(where[:i])) is not None:
            return d, where[i + 1 :], False
    up, name = os.path.split(where)
    up = up or "."
    if dirs is not None and _is_beneath(up):
        return _reused(up, dirs), name, False
    return open_dir(up), name, True


# -- single operations ----------------------------------------------------------------------
def open_file(path: Path, flags: int, *, create_dirs: bool = False) -> int:
    """Open a file with O_NOFOLLOW from its verified directory (see `open_in`)."""
    with parent(path, create=create_dirs) as d:
        return open_in(d, path.name, flags)


def open_in(d: Dir, name: str, flags: int) -> int:
    """O_NOFOLLOW open relative to `d`. With O_CREAT a file that is new gets the mode of the
    rule and, when root creates it, the directory owner's ownership."""
    flags |= os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        if flags & os.O_CREAT and not flags & os.O_EXCL:
            try:  # tell a creation from an open of an existing file: only new files get modes
                fd = os.open(name, flags | os.O_EXCL, d.modes.file, dir_fd=d.fd)
            except FileExistsError:
                return os.open(name, flags & ~os.O_CREAT, dir_fd=d.fd)
            _adopt(fd, d, d.modes.file)
            return fd
        fd = os.open(name, flags, d.modes.file, dir_fd=d.fd)
        if flags & os.O_CREAT:
            _adopt(fd, d, d.modes.file)
        return fd
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise _refuse(d.path / name, "a symlink") from None
        raise


def lstat(path: Path) -> os.stat_result | None:
    """lstat without following a symlink on the way; None when absent (or its dir is)."""
    try:
        d, name, owned = _held_parent(os.fspath(path))
    except FileNotFoundError:
        return None
    try:
        return os.stat(name, dir_fd=d.fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    finally:
        if owned:
            d.close()


def exists(path: Path) -> bool:
    return lstat(path) is not None


def is_dir(path: Path) -> bool:
    """A real directory (not a symlink to one), reached without following symlinks."""
    try:
        with opened_dir(path):
            return True
    except (FileNotFoundError, UnsafeFile, NotADirectoryError):
        return False


def listdir(path: Path) -> list[str]:
    """Names in a directory (empty when it does not exist)."""
    try:
        with opened_dir(path) as d:
            return os.listdir(d.fd)
    except FileNotFoundError:
        return []


def scandir_stats(path: Path, prefix: str = "") -> list[tuple[str, os.stat_result]]:
    """(name, lstat) of the entries starting with `prefix` (for rejected/stale files)."""
    try:
        d = open_dir(path)
    except FileNotFoundError:
        return []
    out = []
    try:
        for name in os.listdir(d.fd):
            if name.startswith(prefix):
                with contextlib.suppress(FileNotFoundError):
                    out.append((name, os.stat(name, dir_fd=d.fd, follow_symlinks=False)))
    finally:
        d.close()
    return out


def unlink(path: Path, *, durable: bool = True) -> bool:
    """Remove a file (a symlink is removed, never followed). False when it was not there."""
    try:
        with parent(path) as d:
            os.unlink(path.name, dir_fd=d.fd)
            if durable:
                os.fsync(d.fd)
    except FileNotFoundError:
        return False
    return True


def rename(src: Path, dst: Path) -> None:
    """Rename within one directory (the protocol only ever moves files next to themselves)."""
    if src.parent != dst.parent:
        raise ValueError("rename across directories")
    with parent(src) as d:
        os.rename(src.name, dst.name, src_dir_fd=d.fd, dst_dir_fd=d.fd)
        os.fsync(d.fd)


def mkdirs(path: Path) -> None:
    with opened_dir(path, create=True):
        pass


def read_in(d: Dir, name: str, limit: int) -> bytes:
    fd = open_in(d, name, os.O_RDONLY | os.O_NONBLOCK)
    try:
        return _read_fd(fd, _join(d.where, name), limit)
    finally:
        os.close(fd)


def _read_fd(fd: int, path: Path | str, limit: int) -> bytes:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeFile(f"{path} is not a regular file (FIFO, device or directory)")
    if st.st_size > limit:
        raise UnsafeFile(f"{path} is {st.st_size} bytes; the limit is {limit}")
    chunks: list[bytes] = []
    total = 0
    while chunk := os.read(fd, 1 << 20):
        total += len(chunk)
        if total > limit:  # grew while we read it
            raise UnsafeFile(f"{path} is over the {limit}-byte limit")
        chunks.append(chunk)
    return b"".join(chunks)


def read_beneath(base: Path, parts: tuple[str, ...], limit: int) -> bytes:
    """A regular file of at most `limit` bytes at `base/parts...`, opened one component at a
    time without following a symlink below `base` (a linked directory could lead out of it).
    Raises FileNotFoundError, UnsafeFile, or OSError (ELOOP/ENOTDIR: a link on the way)."""
    nofollow = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    fds = [os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)]
    try:
        for part in parts[:-1]:
            fds.append(os.open(part, nofollow | os.O_DIRECTORY, dir_fd=fds[-1]))
        fds.append(os.open(parts[-1], nofollow | os.O_NONBLOCK, dir_fd=fds[-1]))
        return _read_fd(fds[-1], base.joinpath(*parts), limit)
    finally:
        for fd in fds:
            os.close(fd)


def read(path: Path, limit: int, *, follow: bool = False) -> bytes:
    """A regular file of at most `limit` bytes, opened non-blocking (a FIFO never blocks).
    Beneath `.delta` no symlink is followed anywhere; elsewhere only the last component is
    checked, unless `follow` (agent files may be links)."""
    where = os.fspath(path)
    if _is_beneath(where):
        d, name, owned = _held_parent(where)
        try:
            return read_in(d, name, limit)
        finally:
            if owned:
                d.close()
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafeFile(f"{path} is a symlink; write a regular file instead") from None
        raise
    try:
        return _read_fd(fd, path, limit)
    finally:
        os.close(fd)


def temp_name(name: str) -> str:
    return f".{name}.{secrets.token_hex(4)}.tmp"


def publish(path: Path, data: bytes, *, replace: bool) -> bool:
    """Write `data` to a temp file beside `path` (modes by the rule) and put it in place:
    renamed over an existing file when `replace`, else hard-linked, which fails if `path`
    exists — a compare-and-set on "no such file yet". Returns False when it existed."""
    with parent(path, create=True) as d:
        tmp = temp_name(path.name)
        fd = open_in(d, tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            if replace:
                os.rename(tmp, path.name, src_dir_fd=d.fd, dst_dir_fd=d.fd)
            else:
                try:
                    os.link(tmp, path.name, src_dir_fd=d.fd, dst_dir_fd=d.fd, follow_symlinks=False)
                except FileExistsError:
                    return False
                finally:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(tmp, dir_fd=d.fd)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=d.fd)
            raise
        os.fsync(d.fd)
    return True
