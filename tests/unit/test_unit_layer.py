"""The unit layer's own guards (tests/unit/conftest.py) see what they are there to see."""

from __future__ import annotations

import gc
import os
import socket
import subprocess
import weakref

import pytest

from tests.unit import conftest as layer


@pytest.mark.spawns  # the spawn below is the one this test makes the guard see
def test_an_unmarked_spawn_is_seen() -> None:
    layer._guard["allowed"], layer._guard["what"] = False, []
    try:
        subprocess.run(["true"], check=True)
        seen = list(layer._guard["what"])
    finally:
        layer._guard["allowed"], layer._guard["what"] = True, []
    assert len(seen) == 1 and "true" in seen[0]


def test_a_socket_beyond_loopback_is_refused_before_it_leaves() -> None:
    with socket.socket() as s:
        with pytest.raises(AssertionError, match="beyond loopback"):
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: never reached
        with pytest.raises(AssertionError, match="every address"):
            s.bind(("0.0.0.0", 0))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # loopback is what the unit layer uses


def test_fsync_is_a_checked_no_op_here(tmp_path: os.PathLike[str]) -> None:
    fd = os.open(os.path.join(tmp_path, "f"), os.O_CREAT | os.O_WRONLY, 0o600)
    os.fsync(fd)
    os.close(fd)
    with pytest.raises(OSError):
        os.fsync(fd)  # a closed descriptor still fails as the real one would


def test_the_garbage_collector_runs_during_the_tests_and_frees_cycles() -> None:
    # tests/conftest.py turns it off while the test modules are imported, and on again after
    class Cycle:
        def __init__(self) -> None:
            self.me = self

    assert gc.isenabled()
    gone = weakref.ref(Cycle())
    gc.collect()
    assert gone() is None
