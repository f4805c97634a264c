"""Does the kernel report a writer's close before it stops counting the file as open for writing?

    .venv/bin/python bench/close_lease_window.py --closes 20000

One writer process opens, writes and closes `response.txt`, then waits for an acknowledgement
before its next open, so at most one writer ever exists and none while we look. The watcher
waits for each IN_CLOSE_WRITE and at once asks for a read lease (`deltad/core/answer.py`'s
test for "still being written"), counting the times the kernel still refuses it (EAGAIN: "open
for writing"). Any count above zero is the window in which the look that a close event brings
sees a writer that has already closed; the daemon must then look again by itself
(`OPEN_WRITER_RECHECK_SECONDS` in deltad/core/reconcile.py), since no later event comes.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import fcntl
import os
import select
import signal
import tempfile
from pathlib import Path

IN_CLOSE_WRITE = 0x8


def writer(path: Path, closes: int, ack: int) -> None:
    for _ in range(closes):
        with open(path, "w") as f:
            f.write("yes")
        if not os.read(ack, 1):
            return


def lease_refused(path: Path) -> bool:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
    except OSError as e:
        if e.errno != errno.EAGAIN:
            raise
        return True
    finally:
        os.close(fd)
    return False


def measure(d: Path, closes: int) -> int:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    path = d / "response.txt"
    path.write_text("")
    ifd = libc.inotify_init1(os.O_CLOEXEC)
    if ifd < 0 or libc.inotify_add_watch(ifd, str(d).encode(), IN_CLOSE_WRITE) < 0:
        raise OSError(ctypes.get_errno(), "inotify")
    ack_r, ack_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        writer(path, closes, ack_r)
        os._exit(0)
    refused = 0
    for _ in range(closes):
        select.select([ifd], [], [])
        os.read(ifd, 65536)
        refused += lease_refused(path)
        os.write(ack_w, b"x")
    os.waitpid(pid, 0)
    return refused


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--closes", type=int, default=20_000)
    args = ap.parse_args()
    # A lease holder gets SIGIO when someone opens the file for writing; its default ends us.
    signal.signal(signal.SIGIO, lambda signum, frame: None)
    with tempfile.TemporaryDirectory(prefix="close-lease-") as tmp:
        refused = measure(Path(tmp), args.closes)
    print(f"closes: {args.closes}, read lease still refused right after IN_CLOSE_WRITE: {refused}")


if __name__ == "__main__":
    main()
