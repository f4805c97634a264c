"""Where deltad calls a private CPython API, the fallback for a Python without it, forced on
the one running the tests (CI runs them on 3.11 and 3.13: .ci/py313). The unparsed path join
(`safefs.child`) is tested in test_daemon_memory.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

# A child that ends through the fork server's exit: buffered output, an atexit function, and a
# non-daemon thread that must be joined before the exit.
# Without the join, the thread waits for good and the exit must not wait for it.
CHILD = """
import atexit, sys, threading
from deltad.executors import forkserver
go = threading.Event()
if sys.argv[1] == "without":
    del threading._shutdown, atexit._run_exitfuncs
atexit.register(lambda: print("atexit ran", flush=True))
threading.Thread(target=lambda: (go.wait(), print("thread done"))).start()
print("buffered", end="")
if sys.argv[1] == "with":
    go.set()  # after the main thread's output: the join makes the thread's come next
forkserver._finish(3)
"""


@pytest.mark.parametrize(
    ("steps", "out"),
    [
        ("with", "bufferedthread done\natexit ran\n"),  # as CPython's own exit
        ("without", "buffered"),  # neither step: the exit code and the output still hold
    ],
)
def test_the_fork_servers_exit_with_and_without_cpythons_private_steps(
    steps: str, out: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, steps], capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout, done.stderr) == (3, out, "")
