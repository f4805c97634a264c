"""The webhook outbox: every delivery is a file before it is attempted, so a stop or a crash
loses nothing that was queued, and a delivery keeps its `webhook-id` across retries and
restarts.

Layout, per target (a target is named by the first 16 hex digits of its URL's SHA-256), under
the inbox process's directory (`<state_dir>/inbox`: the inbox delivers; the core only hands
deliveries over into `new/`, deltad/outbound/handoff.py):

    outbox/<target>/new/<event id>-<webhook id>.json     handed over by the core
    outbox/<target>/<event id>-<webhook id>.json         waiting (0600, atomic), the inbox's
    dead-letter/<target>/<event id>-<webhook id>.json    given up, with the reason

A delivery answered 2xx is removed at once and never sent again. The retry rule is a pure
function (`after_failure`), tested from a table; `Outbox` is the directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
from dataclasses import asdict, dataclass
from pathlib import Path

from deltad.pacing import Pacing, equal_jitter
from deltad.protocol import atomic_write_json

OUTBOX = "outbox"
DEAD_LETTER = "dead-letter"
NEW = "new"  # where the core hands deliveries over (deltad/outbound/handoff.py)
FILE_MAX = 1024 * 1024  # a delivery's file in the outbox at most (a 64 KiB body, escaped)


@dataclass(frozen=True)
class Delivery:
    msg_id: str  # the webhook-id: stable for the delivery's whole life
    event_id: int
    event: str  # the event's type (X-Deltad-Event)
    url: str
    body: str  # the exact JSON sent on every attempt
    created_at: float  # unix time it entered the outbox
    attempts: int = 0
    next_at: float = 0.0  # unix time of the next attempt
    last_error: str | None = None

    @property
    def file_name(self) -> str:
        return f"{self.event_id:020d}-{self.msg_id}.json"


@dataclass(frozen=True)
class Policy:
    max_attempts: int
    max_age: float
    backoff: float
    backoff_max: float


@dataclass(frozen=True)
class Retry:
    at: float


@dataclass(frozen=True)
class Dead:
    reason: str  # "max_attempts" | "max_age" | "outbox_full" | "target_removed" | "unreadable"


def too_old(d: Delivery, now: float, policy: Policy) -> bool:
    """Not worth sending any more (checked before each attempt: the daemon may have been down
    for a day)."""
    return now - d.created_at > policy.max_age


def after_failure(d: Delivery, now: float, policy: Policy, r: float) -> Retry | Dead:
    """What happens to `d` after its attempt number `d.attempts` failed; `r` in [0, 1) is the
    jitter's random draw."""
    if d.attempts >= policy.max_attempts:
        return Dead("max_attempts")
    at = now + equal_jitter(Pacing(policy.backoff, policy.backoff_max).delay(d.attempts), r)
    if too_old(d, at, policy):
        return Dead("max_age")
    return Retry(at)


def target_key(url: str) -> str:
    return hashlib.sha256(url.encode()).hexdigest()[:16]


def _load(path: Path) -> Delivery:
    doc = json.loads(path.read_bytes())
    doc.pop("dead_reason", None)
    return Delivery(**doc)


def load_capped(path: Path) -> Delivery:
    """A delivery's file, read without following a link and at most FILE_MAX bytes (what
    the core handed over: read by the inbox as it would read anything from outside)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        data = f.read(FILE_MAX + 1)
    if len(data) > FILE_MAX:
        raise ValueError("too large")
    doc = json.loads(data)
    if not isinstance(doc, dict):
        raise ValueError("not a delivery")
    doc.pop("dead_reason", None)
    return Delivery(**doc)


class Outbox:
    """One target's waiting and dead-letter directories (0700, files 0600)."""

    def __init__(self, state_dir: Path, url: str) -> None:
        key = target_key(url)
        self.pending_dir = state_dir / OUTBOX / key
        self.dead_dir = state_dir / DEAD_LETTER / key
        for d in (self.pending_dir.parent, self.dead_dir.parent, self.pending_dir, self.dead_dir):
            d.mkdir(parents=True, exist_ok=True, mode=0o700)

    def load(self) -> tuple[list[Delivery], list[Path]]:
        """The waiting deliveries, oldest first, and the files that could not be read."""
        for torn in self.pending_dir.glob(".*.tmp"):  # a write cut short by a crash
            with contextlib.suppress(FileNotFoundError):
                torn.unlink()
        found: list[Delivery] = []
        bad: list[Path] = []
        for path in sorted(self.pending_dir.glob("*.json")):
            try:
                found.append(_load(path))
            except (OSError, ValueError, TypeError):
                bad.append(path)
        return found, bad

    def save(self, d: Delivery) -> None:
        atomic_write_json(self.pending_dir / d.file_name, asdict(d), 0o600)

    def remove(self, d: Delivery) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.pending_dir / d.file_name)
        _fsync_dir(self.pending_dir)

    def bury(self, d: Delivery, reason: str) -> None:
        """Move `d` to the dead letter, saying why."""
        atomic_write_json(self.dead_dir / d.file_name, {**asdict(d), "dead_reason": reason}, 0o600)
        self.remove(d)

    def bury_file(self, path: Path) -> None:
        """A file that is not a delivery: moved aside as it is."""
        os.replace(path, self.dead_dir / path.name)

    def prune_dead(self, keep: int) -> int:
        """Delete the oldest dead letters beyond `keep`; how many went."""
        files = sorted(self.dead_dir.glob("*.json"))
        gone = files[: max(0, len(files) - keep)]
        for path in gone:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        return len(gone)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
