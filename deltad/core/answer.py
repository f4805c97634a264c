"""Is `response.txt` complete, i.e. is nobody still writing it?

Events say *that* something happened; this asks the kernel whether the file is still open for
writing. A read lease (fcntl F_SETLEASE, F_RDLCK) is refused with EAGAIN exactly when some
process has the file open for writing, so a writer that pauses between two writes is seen as
"not done" no matter how long it pauses. Taking the lease needs file ownership or CAP_LEASE
(root has it; the systemd unit grants it); where it is refused (or on NFS), completeness falls
back to "closed-after-write event seen, or unchanged for `settle_seconds`".
"""

from __future__ import annotations

import os
from enum import Enum
from pathlib import Path

import structlog

from deltad import platform
from deltad.protocol import Mailbox, Workspace, safefs
from deltad.protocol.errors import ProtocolError

log = structlog.get_logger("deltad.service")


class Writers(Enum):
    NONE = "none"  # complete: nobody has it open for writing
    OPEN = "open"  # someone is still writing it
    UNKNOWN = "unknown"  # the kernel would not tell us (no lease permission, NFS)


def open_writers(path: Path) -> Writers:
    try:
        fd = safefs.open_file(path, os.O_RDONLY | os.O_NONBLOCK)
    except (OSError, ProtocolError):
        return Writers.UNKNOWN  # gone, a symlink, unreadable: the reader reports which
    try:
        free = platform.read_lease_free(fd)
    finally:
        os.close(fd)
    return Writers.UNKNOWN if free is None else Writers.NONE if free else Writers.OPEN


def log_refusals(ws: Path, run_id: str | None, spawned_at: float) -> None:
    """After a resume: the client moved an answer aside (it did not fit the question, or no
    question was waiting for it); say so in the daemon's log too. Only the names of the notes
    are looked at, never what a user wrote: the reason is the client's to show (`delta
    status`), and may concern a secret."""
    since = int((spawned_at - 1.0) * 1e9)  # file times are coarser
    mailbox = Mailbox(Workspace(ws))
    found = (
        (
            "answer_refused",
            mailbox.rejected_since,
            "the client set the answer aside; `delta status` shows why",
        ),
        (
            "answer_set_aside",
            mailbox.stale_since,
            "an answer that no open question was waiting for; kept, not used",
        ),
    )
    for event, names_since, detail in found:
        try:
            names = names_since(since)
        except (OSError, ProtocolError):
            return
        for name in names:
            log.warning(event, workspace=str(ws), run_id=run_id, file=name, detail=detail)
