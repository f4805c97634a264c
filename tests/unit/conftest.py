"""The unit layer's own rules (tests/unit: in-process, fakes of external things only).

- `fsync` is a checked no-op here. A unit test asserts what was written and in which order,
  never that it survived a power cut (nothing in-process can show that), and the layer made
  ~7,000 fsyncs: 4 ms each on a busy shared disk, which made its wall time the disk's, not the
  code's. The descriptor is still checked (a closed one raises as `fsync` would); a test that
  patches `os.fsync` (a failing disk) still sees its own. The e2e layer keeps the real one.
- `tmp_path` is made in O(1) (`tempfile.mkdtemp` in one directory per session): pytest's own
  lists every earlier test's directory to number the next one, so a session of ~1,000 of them
  spent its time reading ever larger directories (quadratic).
- No test here starts a process or reaches beyond loopback unless it says so: a test that
  spawns (`subprocess`, `os.fork`, `os.posix_spawn`) must carry `@pytest.mark.spawns`, and a
  socket may connect or bind to loopback or a Unix path only. Both hold while tests/unit's
  tests run (package scope), not in the other layers of the same session.

The unit layer stays seconds because what makes it slow is visible here and in
bench/unit_layer_bench.py (which times it; its output is committed).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_real_fsync = os.fsync
_real_fdatasync = getattr(os, "fdatasync", None)


def _checked_noop_sync(fd: Any) -> None:
    os.fstat(fd if isinstance(fd, int) else fd.fileno())


@pytest.fixture(autouse=True, scope="package")
def _no_fsync() -> Iterator[None]:
    os.fsync = _checked_noop_sync
    if _real_fdatasync is not None:
        os.fdatasync = _checked_noop_sync
    try:
        yield
    finally:
        os.fsync = _real_fsync
        if _real_fdatasync is not None:
            os.fdatasync = _real_fdatasync


class _Spawned(Exception):
    pass


_guard: dict[str, Any] = {"allowed": True, "what": []}


def _note(what: str) -> None:
    if not _guard["allowed"]:
        _guard["what"].append(what)


_real_popen_init = subprocess.Popen.__init__
_real_fork = os.fork
_real_posix_spawn = getattr(os, "posix_spawn", None)
_real_connect = socket.socket.connect
_real_bind = socket.socket.bind


# ctypes.util.find_library asks `ldconfig -p` once per library and process (inotify_simple for
# libc, trio for pthread when httpcore imports it): the first importer's, not a test's spawn.
_LIBRARY_LOOKUP = ["/sbin/ldconfig", "-p"]


def _popen_init(self: subprocess.Popen[Any], args: Any, *a: Any, **k: Any) -> None:
    if args != _LIBRARY_LOOKUP:
        _note(f"subprocess {args!r:.80}")
    _real_popen_init(self, args, *a, **k)


def _fork() -> int:
    _note("os.fork()")
    return _real_fork()


def _posix_spawn(path: Any, *a: Any, **k: Any) -> int:
    # Popen itself spawns this way where it can (3.13 does for the library lookup)
    if not (a and list(a[0]) == _LIBRARY_LOOKUP):
        _note(f"os.posix_spawn({path!r})")
    assert _real_posix_spawn is not None
    return int(_real_posix_spawn(path, *a, **k))


def _loopback(address: Any) -> bool:
    if not isinstance(address, tuple):
        return True  # a Unix socket's path (or abstract name)
    host = str(address[0])
    if host in ("", "localhost"):
        return True  # connect(("", port)) is this host's; bind refuses "" itself
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


def _connect(self: socket.socket, address: Any) -> None:
    if self.family in (socket.AF_INET, socket.AF_INET6) and not _loopback(address):
        raise AssertionError(f"a unit test connected beyond loopback: {address!r}")
    _real_connect(self, address)


def _bind(self: socket.socket, address: Any) -> None:
    if (
        self.family in (socket.AF_INET, socket.AF_INET6)
        and isinstance(address, tuple)
        and str(address[0]) in ("", "0.0.0.0", "::")
    ):
        raise AssertionError(f"a unit test bound every address: {address!r} (use 127.0.0.1)")
    if self.family in (socket.AF_INET, socket.AF_INET6) and not _loopback(address):
        raise AssertionError(f"a unit test bound beyond loopback: {address!r}")
    _real_bind(self, address)


@pytest.fixture(autouse=True, scope="package")
def _guards() -> Iterator[None]:
    subprocess.Popen.__init__ = _popen_init  # type: ignore[method-assign]
    os.fork = _fork
    if _real_posix_spawn is not None:
        os.posix_spawn = _posix_spawn
    socket.socket.connect = _connect  # type: ignore[method-assign]
    socket.socket.bind = _bind  # type: ignore[method-assign]
    try:
        yield
    finally:
        subprocess.Popen.__init__ = _real_popen_init  # type: ignore[method-assign]
        os.fork = _real_fork
        if _real_posix_spawn is not None:
            os.posix_spawn = _real_posix_spawn
        socket.socket.connect = _real_connect  # type: ignore[method-assign]
        socket.socket.bind = _real_bind  # type: ignore[method-assign]


@pytest.fixture(autouse=True)
def _no_unmarked_spawn(request: pytest.FixtureRequest) -> Iterator[None]:
    _guard["allowed"] = request.node.get_closest_marker("spawns") is not None
    _guard["what"] = []
    try:
        yield
    finally:
        spawned, _guard["allowed"] = list(_guard["what"]), True
        if spawned:
            pytest.fail(
                "a unit test started a process without @pytest.mark.spawns (each costs tens"
                f" of ms; the slow ones go to tests/unit_slow): {spawned[:3]}",
                pytrace=False,
            )


@pytest.fixture(scope="session")
def _unit_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("unit", numbered=False)


@pytest.fixture
def tmp_path(_unit_tmp: Path) -> Path:
    """A fresh 0700 directory of the test's own, as pytest's, without numbering it."""
    return Path(tempfile.mkdtemp(prefix="t", dir=_unit_tmp))


from tests.support.sealing import decision_key  # noqa: E402,F401  (autouse: the core's key)
