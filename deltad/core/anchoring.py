"""The audit chain's head kept where a tenant cannot reach (docs/inbox.md, "Anchors"): every
`audit.anchor_every_seconds`, if the head moved, one line `{"at", "seq", "head"}` appended to
`audit.anchor_file` (0600, fsync'd) and/or given to `audit.anchor_command` on its stdin (a
command that files it elsewhere: another host, a ticket, a webhook). `deltad audit verify
--anchors FILE` then checks the log against every line: entries cut off the end, or a chain
rewritten with every hash recomputed, no longer match.

Beside the loop: the file may be on a slow mount and the command may hang (60 s at most), so
each anchoring runs on a thread of its own, one at a time, and the loop only starts it."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import structlog

from deltad.core.config import DaemonConfig
from deltad.inbox import audit
from deltad.protocol import iso, utcnow

log = structlog.get_logger("deltad.service")
COMMAND_TIMEOUT = 60.0


def due(now: float, next_at: float, busy: bool) -> bool:
    """Whether an anchoring starts now (`next_at`: monotonic; one at a time). Pure."""
    return not busy and now >= next_at


class Anchoring:
    """`tick(now)` on the loop (monotonic seconds); the work on a thread."""

    def __init__(self, config: DaemonConfig) -> None:
        cfg = config.audit
        self.path = audit.audit_path(config)
        self.file: Path | None = cfg.anchor_file
        self.command: list[str] | None = cfg.anchor_command
        self.every = cfg.anchor_every_seconds
        self.on = cfg.enabled and (self.file is not None or bool(self.command))
        self._next_at = 0.0  # the first at once: a restart anchors where the chain stands
        self._busy = False
        self._last: tuple[int, str] | None = None
        self._failing = ""

    def tick(self, now: float) -> None:
        if not self.on or not due(now, self._next_at, self._busy):
            return
        self._next_at = now + self.every
        self._busy = True
        threading.Thread(target=self._anchor, name="deltad-anchor", daemon=True).start()

    def _anchor(self) -> None:
        try:
            seq, head = audit.chain_head(self.path)
            if (seq, head) == self._last or seq == 0:
                return
            anchor = audit.Anchor(iso(utcnow()), seq, head)
            if self.file is not None:
                fd = os.open(
                    self.file, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600
                )
                try:
                    os.write(fd, anchor.line())
                    os.fsync(fd)
                finally:
                    os.close(fd)
            if self.command:
                subprocess.run(
                    self.command,
                    input=anchor.line(),
                    capture_output=True,
                    timeout=COMMAND_TIMEOUT,
                    check=True,
                )
            self._last, self._failing = (seq, head), ""
            log.info("audit_anchored", seq=seq, head=head)
        except (OSError, subprocess.SubprocessError, audit.AuditError) as e:
            if str(e) != self._failing:  # said once per distinct failure; tried each period
                log.warning("audit_anchor_failed", error=str(e))
            self._failing = str(e)
        finally:
            self._busy = False
