"""The core's side of webhook deliveries: each one is written into the inbox's outbox, which the
inbox process delivers from (a deltad/outbound/courier.py `Courier` per target). The core never
connects to a receiver and reads nothing a receiver sends.

Layout, under the inbox's directory (`<state_dir>/inbox`, deltad/privsep/core.py):

    outbox/<target>/new/<event id>-<webhook id>.json  written by the core (atomic, fsync'd),
                                                      the inbox's user's; taken by the inbox
    outbox/<target>/<event id>-<webhook id>.json      the inbox's: waiting for its next attempt
    dead-letter/<target>/...                          given up (by the inbox, with the reason)

What the core wrote is delivered across a restart of either process: the inbox moves a file
from `new/` to its own directory before it attempts it, and removes it only after a 2xx. As
root, every directory here is root's with the inbox's group and the sticky bit (1770): the
inbox makes, replaces and removes its own files, never a directory; the core opens each level
once, without following a link, and works relative to those descriptors only, so whatever the
inbox plants (a link, a FIFO) never redirects a write of root's. The core reads no file here.

While no inbox takes them (it is restarting, or its unit is stopped), deliveries wait in
`new/` up to the target's `outbox_max`; beyond it the oldest goes to the dead letter as it is.

The channels' messages (mail, Slack's Web API calls, notify commands: deltad/outbound/
senders.py) are handed over the same way, one target per channel, named by `target_key` of
the channel's name. The inbox's counts for every target go to deltad_deliveries_total, by
target, kind and result.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
import threading
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import structlog
from prometheus_client import Counter

from deltad import wire
from deltad.outbound.outbox import DEAD_LETTER, OUTBOX, Delivery, target_key

log = structlog.get_logger("deltad.notify")

NEW = "new"


def kind_of(name: str) -> str:
    """A target's kind, from its name: webhook0 → webhook, command1 → command, email, slack."""
    return name.rstrip("0123456789") or name


DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class HandoffError(Exception):
    """One line: the inbox's outbox cannot be used."""


def _dir_at(parent: int, name: str, owner: tuple[int, int] | None, mode: int) -> int:
    """`name` under the directory `parent` (made if missing) as a descriptor, never through a
    link, owned root:the inbox's group with `mode` (as root), else 0700."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, 0o700, dir_fd=parent)
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=parent)
    except OSError as e:
        raise HandoffError(f"{name}: {e.strerror} (not a directory of the daemon's)") from None
    if owner is not None:
        os.fchown(fd, 0, owner[1])
        os.fchmod(fd, mode)
    elif stat.S_IMODE(os.fstat(fd).st_mode) != 0o700:
        os.fchmod(fd, 0o700)
    return fd


class Handoff:
    """The targets' `new/` and dead-letter directories, held open; `put` writes a delivery.
    `owner`: the inbox's (uid, gid) when the core is root (None: one user, 0700)."""

    def __init__(
        self,
        inbox_dir: Path,
        state_dir: Path,
        urls: list[str],
        caps: list[int],
        owner: tuple[int, int] | None,
        counted: Counter | None = None,
        channels: list[tuple[str, int]] | None = None,
    ) -> None:
        """`urls`: the webhooks' (named webhook0, webhook1, ... in that order); `channels`:
        each channel target's name and `outbox_max`; `counted`: deltad_deliveries_total, by
        (target, kind, result)."""
        self.owner = owner
        self.counted = counted  # the inbox's reports (deltad/metrics.py)
        self.channel_of = {target_key(n): n for n, _ in channels or []}
        self.webhooks = [f"webhook{i}" for i in range(len(urls))]
        self.name_of = {target_key(u): n for u, n in zip(urls, self.webhooks, strict=True)}
        self.name_of |= self.channel_of
        # What waits in each target's outbox in the inbox, and its counts so far, as it said.
        self.depths = dict.fromkeys(self.name_of.values(), 0)
        self._seen = dict.fromkeys(self.name_of.values(), (0, 0, 0))
        self.keys = [target_key(u) for u in urls] + list(self.channel_of)
        caps = [*caps, *(c for _, c in channels or [])]
        self.caps = dict(zip(self.keys, caps, strict=True))
        self._lock = threading.Lock()
        self._estimate: dict[str, int] = {}
        self.buried = 0  # deliveries the core moved to the dead letter (outbox_full)
        self.hint: Callable[[str], None] = lambda key: None  # set by the inbox's host
        self._fds: list[int] = []
        root = os.open(inbox_dir, DIR_FLAGS)
        try:
            self._outbox = self._hold(_dir_at(root, OUTBOX, owner, 0o750))
            self._dead = self._hold(_dir_at(root, DEAD_LETTER, owner, 0o750))
        finally:
            os.close(root)
        self.new: dict[str, int] = {}
        self.dead: dict[str, int] = {}
        for key in self.keys:
            self.dead[key] = self._hold(_dir_at(self._dead, key, owner, 0o1770))
            target = _dir_at(self._outbox, key, owner, 0o1770)
            try:
                self.new[key] = self._hold(_dir_at(target, NEW, owner, 0o1770))
            finally:
                os.close(target)
            self._estimate[key] = self._count(key)
        self._adopt_old(state_dir, [n for n, _ in channels or []])
        self._bury_orphans()

    # -- what the inbox says of its deliveries -----------------------------------------------
    @property
    def depth(self) -> int:
        """What waits in the webhooks' outboxes (deltad_webhook_outbox_depth)."""
        return sum(self.depths.get(n, 0) for n in self.webhooks)

    @property
    def channel_depth(self) -> dict[str, int]:
        """What waits in each channel's (deltad_channel_outbox_depth)."""
        return {n: self.depths.get(n, 0) for n in self.channel_of.values()}

    def connected(self) -> None:
        """A new inbox process: its counts start from zero."""
        self._seen = dict.fromkeys(self._seen, (0, 0, 0))

    def report(self, c: wire.Deliveries) -> None:
        """A target's counts since the inbox started, added to the core's counter (what grew
        only: an inbox cannot take back what it said). A target not configured is ignored:
        the inbox names it, the core decides."""
        was = self._seen.get(c.target)
        if was is None:
            return
        now = (max(was[0], c.sent), max(was[1], c.retry), max(was[2], c.dead))
        for result, before, after in zip(("sent", "retry", "dead"), was, now, strict=True):
            if after > before:
                self._tally(c.target, result, after - before)
        self._seen[c.target] = now
        self.depths[c.target] = c.depth

    def _tally(self, name: str, result: str, n: int = 1) -> None:
        if self.counted is not None:
            self.counted.labels(name, kind_of(name), result).inc(n)

    def _hold(self, fd: int) -> int:
        self._fds.append(fd)
        return fd

    def close(self) -> None:
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()

    # -- a delivery --------------------------------------------------------------------------
    def put(self, d: Delivery, key: str | None = None) -> None:
        """On disk in the target's `new/` (then the inbox is told): from here on it is the
        inbox's to deliver. Called from the notifier's or the channels' intake thread, never
        the loop. `key`: the target (default: the webhook's, by its URL)."""
        key = key if key is not None else target_key(d.url)
        with self._lock:
            self._make_room(key)
            self._write(self.new[key], d.file_name, json.dumps(asdict(d)).encode())
            self._estimate[key] += 1
        self.hint(key)

    def _write(self, dir_fd: int, name: str, data: bytes) -> None:
        tmp = f".{name}.{secrets.token_hex(4)}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(tmp, flags, 0o600, dir_fd=dir_fd)
        try:
            if self.owner is not None:
                os.fchown(fd, *self.owner)  # the inbox's from the start: it renames it away
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
        os.close(fd)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        os.fsync(dir_fd)

    def _names(self, key: str) -> list[str]:
        return sorted(n for n in os.listdir(self.new[key]) if n.endswith(".json"))

    def _count(self, key: str) -> int:
        return len(self._names(key))

    def _make_room(self, key: str) -> None:
        """At most `outbox_max` wait in `new/`. Counted again only when the estimate (what was
        there, plus what was written since) reaches the cap: the inbox takes files away."""
        cap = self.caps[key]
        if self._estimate[key] < cap:
            return
        names = self._names(key)
        while len(names) >= cap:
            oldest = names.pop(0)  # names sort by event id
            with contextlib.suppress(FileNotFoundError):  # the inbox took it meanwhile
                os.rename(oldest, oldest, src_dir_fd=self.new[key], dst_dir_fd=self.dead[key])
                self.buried += 1
                self._tally(self.name_of[key], "dead")
                log.error(
                    "notify_dead_letter",
                    target_key=key,
                    file=oldest,
                    reason="outbox_full",
                    detail="no inbox process took the target's deliveries",
                )
        self._estimate[key] = len(names)

    # -- at start ----------------------------------------------------------------------------
    def _adopt_old(self, state_dir: Path, channels: list[str]) -> None:
        """An older deltad's outbox (`<state_dir>/outbox`, root's; a channel's in
        `<state_dir>/channels/<name>/`, from when the core sent its messages) is handed over
        as it is: waiting deliveries into `new/` (or the dead letter for a target no longer
        configured), dead letters into the inbox's dead letter."""
        moved = 0
        roots = [(state_dir / kind, kind) for kind in (OUTBOX, DEAD_LETTER)]
        for name in channels:
            channel = state_dir / "channels" / name
            roots += [(channel / kind, kind) for kind in (OUTBOX, DEAD_LETTER)]
        for old_root, kind in roots:
            if not old_root.is_dir() or old_root.is_symlink():
                continue
            for old in sorted(old_root.iterdir()):
                if not old.is_dir() or old.is_symlink():
                    continue
                if kind == OUTBOX and old.name in self.new:
                    to = self.new[old.name]
                else:
                    to = self.dead.get(old.name) or self._hold(
                        _dir_at(self._dead, old.name, self.owner, 0o1770)
                    )
                    self.dead[old.name] = to
                for path in sorted(old.glob("*.json")):
                    if not path.is_file() or path.is_symlink():
                        continue
                    if self.owner is not None:
                        os.lchown(path, *self.owner)
                    os.rename(path, path.name, dst_dir_fd=to)
                    moved += 1
                with contextlib.suppress(OSError):
                    old.rmdir()
            with contextlib.suppress(OSError):
                old_root.rmdir()
        if moved:
            log.info("notify_outbox_moved", files=moved, to="inbox/outbox")
            for key in self.keys:
                self._estimate[key] = self._count(key)

    def _bury_orphans(self) -> None:
        """Deliveries of targets no longer configured go to the dead letter, as they are."""
        moved = 0
        for name in sorted(os.listdir(self._outbox)):
            if name in self.new:
                continue
            try:
                target = os.open(name, DIR_FLAGS, dir_fd=self._outbox)
            except OSError:
                continue  # not a directory of ours: left alone
            try:
                dead = self.dead.get(name) or self._hold(
                    _dir_at(self._dead, name, self.owner, 0o1770)
                )
                self.dead[name] = dead
                moved += _move_all(target, dead)
                with contextlib.suppress(OSError):
                    new = os.open(NEW, DIR_FLAGS, dir_fd=target)
                    try:
                        moved += _move_all(new, dead)
                    finally:
                        os.close(new)
                    os.rmdir(NEW, dir_fd=target)
            finally:
                os.close(target)
            with contextlib.suppress(OSError):
                os.rmdir(name, dir_fd=self._outbox)
        if moved:
            log.warning("notify_dead_letter", reason="target_removed", deliveries=moved)


def _move_all(src: int, dst: int) -> int:
    moved = 0
    for name in sorted(os.listdir(src)):
        if name.endswith(".json"):
            with contextlib.suppress(FileNotFoundError, IsADirectoryError, NotADirectoryError):
                os.rename(name, name, src_dir_fd=src, dst_dir_fd=dst)
                moved += 1
    return moved
