"""The email channel's Maildir, read in the unprivileged inbox process (deltad/http/child.py):
mail from anyone is opened and parsed here, never in the root core.

Each pass takes at most `max_per_pass` messages from `new/` (oldest name first), each opened
without following a symlink, a regular file only, read up to `max_message_bytes` (a larger one
is not parsed at all), parsed with `mail.received` (the standard library's parser, the plain
part only, quoted text cut), and relayed to the core: the reply address's token, the sender,
the answer's text. The file stays open while the core decides, and is moved to `cur/` (by
rename, both directories fsync'd) only once the core replied; a kill -9 of either process
leaves it in `new/`, to be relayed again (the core's claim on the reply address, naming the
message, makes the second relay answer nothing). A core that cannot take mail now (starting,
or gone) leaves the rest of the pass for the next.

What this process may do to the Maildir is what its user may: the operator gives it the
Maildir (docs/inbox.md, "Email": the mailbox delivered as the inbox's user, or its group with
an MTA that keeps group bits). A message it cannot open (EACCES) stays in `new/` and is said
once in the log.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import re
import selectors
import signal
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import structlog

from deltad.outbound import mail

log = structlog.get_logger("deltad.inbox.mail")

# The core's verdict on one relayed message: True once it replied (the file goes to cur/),
# False when it could not take it now (the file stays in new/, the pass ends).
Relay = Callable[[mail.Received], bool]


PARSE_SECONDS = 5.0  # a reply parses in milliseconds; anything slower is an attack
WARM_UP = b"From: a@b.c\r\nTo: d@e.f\r\nSubject: s\r\n\r\nx\r\n"
Parse = Callable[[str, bytes | None, re.Pattern[str]], mail.Received]
# How a message is parsed within its time: received_within below (unit tests parse in-process).
Within = Callable[[str, bytes | None, re.Pattern[str], float], "mail.Received | str"]


class MaildirReader:
    def __init__(
        self,
        maildir: Path,
        reply_local: str,
        reply_domain: str,
        relay: Relay,
        max_message_bytes: int,
        max_per_pass: int = 100,
        poll_seconds: float = 2.0,
        parse_seconds: float = PARSE_SECONDS,
        within: Within | None = None,
    ) -> None:
        self.maildir, self.relay = maildir, relay
        self.max_bytes, self.max_per_pass, self.poll = max_message_bytes, max_per_pass, poll_seconds
        self.address = mail.reply_address(reply_local, reply_domain)
        self.parse_seconds = parse_seconds
        self.within: Within = within or received_within
        mail.received("warm-up", WARM_UP, self.address)  # the parser's imports, before any fork
        self.stopping = threading.Event()
        self._problem: str | None = None  # said once, until it changes
        self._unopened: set[str] = set()  # messages in new/ this user cannot open
        self._thread = threading.Thread(target=self._run, name="deltad-inbox-mail", daemon=True)

    def start(self) -> None:
        log.info("email_maildir_reading", maildir=str(self.maildir), pid=os.getpid())
        self._thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self.stopping.is_set():
            try:
                self.take()
            except Exception as err:  # the reader must not end on a bug
                log.error("email_read_failed", error=repr(err))
            self.stopping.wait(self.poll)

    def _say(self, problem: str | None, **fields: object) -> None:
        if problem is not None and problem != self._problem:
            log.warning("email_maildir_unreadable", maildir=str(self.maildir), **fields)
        self._problem = problem

    def take(self) -> int:
        """One pass over `new/`: how many messages went to cur/."""
        new = self.maildir / "new"
        try:
            names = sorted(e.name for e in os.scandir(new) if not e.name.startswith("."))
        except OSError as e:  # the MTA makes it on first mail; or the operator's step is missing
            self._say(str(e), error=e.strerror, user=os.getuid())
            return 0
        self._say(None)
        self._unopened &= set(names)
        moved = 0
        # At most max_per_pass moved a pass; messages this user cannot open (left in new/ for
        # the operator) do not hold back the ones after them.
        for name in names[: self.max_per_pass + len(self._unopened)]:
            if self.stopping.is_set() or moved >= self.max_per_pass:
                break
            done = self._one(name)
            if done is None:
                break  # the core cannot take mail now: the rest waits for the next pass
            moved += done
        return moved

    def _one(self, name: str) -> int | None:
        """1 when it was moved to cur/ (the core replied, or it was set aside unread), 0 when
        it was left in new/, None when the core could not take it now."""
        if not _relayable(name):  # a name the protocol cannot carry: set aside, unread
            log.warning("email_message_set_aside", message=ascii(name), reason="name")
            self._done(name)
            return 1
        with self._opened(self.maildir / "new" / name) as data:
            if isinstance(data, bool):  # gone, or not ours to read: left in new/
                return 0
            why = None if data is None else mail.over_budget(data)
            got = why or self.within(name, data, self.address, self.parse_seconds)
            if isinstance(got, str):  # one message never holds back the ones after it
                log.warning("email_message_set_aside", message=ascii(name), reason=got)
            elif not self.relay(got):
                return None
        self._done(name)
        return 1

    @contextlib.contextmanager
    def _opened(self, path: Path) -> Iterator[bytes | bool | None]:
        """The message's bytes (None: not a regular file, or over the cap; False: gone, or
        not ours to read), the file held open until the core replied."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EPERM):  # left in new/ for the operator's step
                if not self._unopened:  # said once, until every such message is gone
                    log.warning(
                        "email_maildir_unreadable",
                        maildir=str(self.maildir),
                        message=ascii(path.name),
                        error=e.strerror,
                        user=os.getuid(),
                    )
                self._unopened.add(path.name)
                yield False
            else:  # ELOOP (a symlink), ENXIO (a socket): unreadable; ENOENT: gone meanwhile
                yield False if e.errno == errno.ENOENT else None
            return
        try:
            yield self._read(fd)
        finally:
            os.close(fd)

    def _read(self, fd: int) -> bytes | None:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > self.max_bytes:
            return None
        chunks, left = [], self.max_bytes + 1
        while left > 0 and (chunk := os.read(fd, min(left, 65536))):
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        return data if len(data) <= self.max_bytes else None

    def _done(self, name: str) -> None:
        """Moved to cur/ (seen): never read again."""
        box = self.maildir
        target = name if ":2," in name else f"{name}:2,S"
        with contextlib.suppress(FileNotFoundError):
            os.rename(box / "new" / name, box / "cur" / target)
        for d in ("new", "cur"):
            fd = os.open(box / d, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def received_within(
    name: str,
    data: bytes | None,
    address: re.Pattern[str],
    seconds: float,
    parse: Parse = mail.received,
) -> mail.Received | str:
    """`parse` run in a forked child, given `seconds`: what it read, or why it was stopped.
    The standard library's parser is pure Python with no time bound of its own; a child can be
    killed where a thread cannot, and its memory goes with it."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: parse, write the result, leave without cleanup
        code = 1
        try:
            os.close(r)
            got = parse(name, data, address)
            out = json.dumps(dataclasses.asdict(got)).encode()
            view = memoryview(out)
            while view:
                view = view[os.write(w, view) :]
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    chunks: list[bytes] = []
    deadline = time.monotonic() + seconds
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(r, selectors.EVENT_READ)
            while (left := deadline - time.monotonic()) > 0:
                if not sel.select(left):
                    continue
                if not (chunk := os.read(r, 65536)):
                    break
                chunks.append(chunk)
            else:
                os.kill(pid, signal.SIGKILL)
                return f"parsing took over {seconds:g} s"
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    try:
        return mail.Received(**json.loads(b"".join(chunks)))
    except (ValueError, TypeError):  # the child died before it said anything
        return "the parser failed"


def _relayable(name: str) -> bool:
    """A name the protocol carries (privsep/wire.py's MaildirName): printable UTF-8, short."""
    try:
        size = len(name.encode())
    except UnicodeEncodeError:  # a name that is not UTF-8 (surrogate-escaped by scandir)
        return False
    return size > 0 and len(name) <= 255 and name.isprintable()
