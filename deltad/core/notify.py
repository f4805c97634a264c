"""sd_notify(3) without a dependency: one datagram to $NOTIFY_SOCKET per message, from one
socket kept for the process's life.

The sdnotify package (2017) swallows every error with a bare except; this is ten lines.
"""

from __future__ import annotations

import os
import socket
import time

_sock: socket.socket | None = None  # one per process: the loop pings every turn or two


def sd_notify(*lines: str) -> bool:
    """Send `lines` to systemd; False when not running under a notify-type unit."""
    global _sock
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return False
    if addr[0] == "@":  # abstract namespace
        addr = "\0" + addr[1:]
    try:
        if _sock is None:
            _sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        # Never block the main loop on a reader that is not reading (a full queue).
        _sock.sendto("\n".join(lines).encode(), socket.MSG_DONTWAIT, addr)
    except OSError:
        if _sock is not None:  # made again next time (closed under us, a fork...)
            _sock.close()
            _sock = None
        return False  # sd_notify(3): "recommended to ignore the return value"
    return True


def monotonic_usec() -> str:
    return f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}"


def watchdog_interval() -> float | None:
    """Half of WatchdogSec= (systemd's advice), or None when the watchdog is off or not ours."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return int(usec) / 1e6 / 2
    except ValueError:
        return None
