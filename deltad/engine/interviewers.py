"""The Interviewer layer: the single way the engine asks a human (after seed 004).

Every interviewer answers `ask(request) -> Reply | None`; None means "no answer here, now".
The engine tries a chain of them, records what was asked and answered in the journal, and
pauses (exit 101) when the chain ends without a reply.

    Mailbox      async files: request.json out, response.txt / response.json in
    Console      `-i`: options with their keys, hidden typing for secrets, timeouts
    AutoApprove  `--auto-approve`: yes, the first option, approve; never invents a secret
    Queue        `--answers FILE`: scripted replies; exhausted is an explicit SKIPPED
    Callback     library users: a function decides
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import select
import sys
import termios
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol, TextIO

import yaml

from deltad.errors import UsageError
from deltad.protocol import (
    AnswerState,
    CorruptFile,
    InteractionRequest,
    Mailbox,
    UnsafeFile,
    utcnow,
)
from deltad.protocol.deadline import disagreement
from deltad.protocol.fsio import lstat_or_none
from deltad.protocol.kinds import auto_reply, kind_of
from deltad.protocol.printable import show
from deltad.protocol.questions import (
    AnswerRejected,
    CallDecision,
    Decision,
    Reply,
    interpret_json,
    interpret_text,
)

from .hooks import Checkpoints, NoCheckpoints, Point


class Interviewer(Protocol):
    def ask(self, req: InteractionRequest) -> Reply | None: ...

    def settle(self, req: InteractionRequest, reply: Reply) -> None:
        """Called once the reply is durably recorded: tidy up (e.g. remove mailbox files)."""

    def reject(self, req: InteractionRequest, reason: str) -> bool:
        """The last reply failed a check the engine makes (an edit that does not fit the tool).
        True: ask again now. False: no answer for now."""


class _Quiet:
    def settle(self, req: InteractionRequest, reply: Reply) -> None:
        return None

    def reject(self, req: InteractionRequest, reason: str) -> bool:
        raise UsageError(f"the answer to {req.prompt!r} does not fit: {reason}")


# -- mailbox --------------------------------------------------------------------------------
class MailboxInterviewer:
    def __init__(
        self,
        mailbox: Mailbox,
        warn: Callable[[str], None],
        post: bool = True,
        hooks: Checkpoints | None = None,
    ) -> None:
        self.mailbox = mailbox
        self.warn = warn
        self.hooks = hooks or NoCheckpoints()
        self.post = post  # False: only take an answer already there (used before Console)
        self.last: Path | None = None
        self.taken_ino: int | None = None  # the answer file this interviewer's reply came from

    def _posted(self, req: InteractionRequest) -> bool:
        try:
            current = self.mailbox.read_request()
        except (CorruptFile, UnsafeFile) as e:
            where = self.mailbox.set_aside_request("corrupt")
            self.warn(f"{e}; set aside as {where.name}")
            return False
        if current is None or current.request_id != req.request_id:
            return False
        if (why := disagreement(current, req)) is not None:  # `req` is the journal's
            kept = self.mailbox.restore_request(req, why)
            self.warn(f"{why}; request.json is rewritten from it (the copy: {kept.name})")
        return True

    def ask(self, req: InteractionRequest) -> Reply | None:
        if not self._posted(req):
            if self.post and not req.expired():
                for kept in self.mailbox.post(req):
                    self.warn(
                        f"an answer file written before this question was set aside as "
                        f"{kept.name} (it does not answer it; write the answer again)"
                    )
                self.hooks.reached(Point.AFTER_POST)
            return None
        answer = self.mailbox.read_answer(req, secret=req.is_secret)
        if answer.state == AnswerState.READY:
            if reply := self._interpret(req, answer):
                return reply
        elif answer.state == AnswerState.REFUSED:
            # Unreadable as an answer (FIFO, symlink, too big, not UTF-8): set it aside like any
            # misfit, so it neither blocks the question nor gets retried forever.
            self._refuse(req, answer.path, answer.reason)
        elif answer.state == AnswerState.STALE:
            self.warn(f"response not taken: {answer.reason}")
        return None

    def _interpret(self, req: InteractionRequest, answer: Any) -> Reply | None:
        if req.expires_at and answer.mtime_ns > req.expires_at.timestamp() * 1e9:
            self._refuse(req, answer.path, "it arrived after the question expired")
            return None
        try:
            if answer.path.suffix == ".json":
                reply = interpret_json(req, answer.text)
            else:
                reply = interpret_text(req, answer.text)
        except AnswerRejected as e:
            self._refuse(req, answer.path, str(e))
            return None
        reply.source = "mailbox"
        reply.answered_by = reply.answered_by or _owner(answer.uid)
        self.last = answer.path
        st = lstat_or_none(answer.path)
        self.taken_ino = st.st_ino if st is not None else None
        return reply

    def reject(self, req: InteractionRequest, reason: str) -> bool:
        if self.last is not None:
            self._refuse(req, self.last, reason)
        return False

    def _refuse(self, req: InteractionRequest, path: Path, reason: str) -> None:
        kept = self.mailbox.refuse(path, reason, secret=req.is_secret)
        where = f"moved to {kept.name}" if kept else "discarded: the question is sensitive"
        self.warn(f"answer not taken: {reason} ({where})")

    def settle(self, req: InteractionRequest, reply: Reply) -> None:
        if not self._posted(req):
            return
        if self.taken_ino is None and reply.source == "mailbox":
            self.mailbox.discard_answer()  # after a crash: the file is the reply on record
        else:
            settle_mailbox(self.mailbox, self.taken_ino, self.warn)
        self.hooks.reached(Point.AFTER_DISCARD_ANSWER)
        self.mailbox.withdraw()


def settle_mailbox(mailbox: Mailbox, taken_ino: int | None, warn: Callable[[str], None]) -> None:
    """The question is answered: remove the answer that was taken (inode `taken_ino`); any
    other answer file (one written while a person answered at the terminal, say) is kept as
    `response.stale-*` and reported — first answer wins, the other is never lost."""
    for kept in mailbox.set_aside_answers(keep_ino=taken_ino):
        warn(
            f"the question was already answered; the answer in the mailbox was set aside as "
            f"{kept.name}"
        )
    mailbox.discard_answer()


def _owner(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


# -- console --------------------------------------------------------------------------------
class _Timeout(Exception):
    pass


class _AnsweredElsewhere(Exception):
    def __init__(self, reply: Reply) -> None:
        super().__init__("answered elsewhere")
        self.reply = reply


POLL_SECONDS = 0.5  # how often a terminal prompt looks at the mailbox too


class LineReader:
    """Lines from a file descriptor with a deadline; keeps its own buffer so that select()
    never misses a line that an earlier read already pulled in."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = b""
        self.eof = False

    def readline(
        self, deadline: float | None, tick: Callable[[], None] | None = None
    ) -> str | None:
        """A line, or None at end of input; _Timeout at `deadline`. `tick` runs every
        POLL_SECONDS while nothing is typed (it may raise to end the wait)."""
        while b"\n" not in self.buf and not self.eof:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            if tick is not None:
                wait = POLL_SECONDS if wait is None else min(wait, POLL_SECONDS)
            if not select.select([self.fd], [], [], wait)[0]:
                if deadline is not None and time.monotonic() >= deadline:
                    raise _Timeout
                if tick is not None:
                    tick()
                continue
            chunk = os.read(self.fd, 4096)
            self.eof = not chunk
            self.buf += chunk
        if not self.buf:
            return None
        line, _, self.buf = self.buf.partition(b"\n")
        return line.decode("utf-8", errors="replace").rstrip("\r")


@contextlib.contextmanager
def _hidden(fd: int) -> Iterator[None]:
    if not os.isatty(fd):
        yield
        return
    old = termios.tcgetattr(fd)
    new = old[:]
    new[3] &= ~termios.ECHO
    termios.tcsetattr(fd, termios.TCSADRAIN, new)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, old)


class ConsoleInterviewer(_Quiet):
    def __init__(
        self,
        stdin: TextIO,
        stdout: TextIO,
        window: Callable[[], contextlib.AbstractContextManager[object]] = contextlib.nullcontext,
        elsewhere: Callable[[InteractionRequest], Reply | None] | None = None,
    ) -> None:
        self.reader = LineReader(stdin.fileno())
        self.fd = stdin.fileno()
        self.out = stdout
        self.window = window  # the engine's signal window: Ctrl+C interrupts a blocked read
        # Another channel (the mailbox) looked at while the prompt waits: first answer wins.
        self.elsewhere = elsewhere

    def _say(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def reject(self, req: InteractionRequest, reason: str) -> bool:
        self._say(f"{show(reason)}\n")
        return True

    def _line(self, req: InteractionRequest, hidden: bool = False) -> str | None:
        deadline = None
        if req.expires_at is not None:
            deadline = time.monotonic() + (req.expires_at - utcnow()).total_seconds()
        self._say("> ")
        tick = None
        if self.elsewhere is not None:
            look = self.elsewhere

            def tick() -> None:
                if (reply := look(req)) is not None:
                    raise _AnsweredElsewhere(reply)

        with self.window(), _hidden(self.fd) if hidden else contextlib.nullcontext():
            line = self.reader.readline(deadline, tick)
        if hidden:
            self._say("\n")
        return line

    def ask(self, req: InteractionRequest) -> Reply | None:
        # A pipeline's: its node. What came from a file is shown escaped (no forged lines).
        self._say(f"\n[{show(req.node_id or 'ask_human')}] {show(req.prompt)}\n")
        if req.expires_at is not None:
            self._say(
                f"(answer by {req.expires_at:%H:%M:%S} UTC"
                + (f"; default: {show(req.default)}" if req.default else "")
                + ")\n"
            )
        try:
            reply = self._approval(req) if kind_of(req.input_type).per_call else self._one(req)
        except _Timeout:
            self._say("\n(no answer in time)\n")
            return Reply(outcome="timeout", source="console")
        except _AnsweredElsewhere as e:
            self._say("\n(answered meanwhile through the mailbox; taking that answer)\n")
            return e.reply
        if reply is not None:
            reply.source, reply.answered_by = "console", _owner(os.getuid())
        return reply

    def _one(self, req: InteractionRequest) -> Reply | None:
        for hint in kind_of(req.input_type).hints(req):
            self._say(f"{show(hint)}\n")
        while True:
            line = self._line(req, hidden=req.is_secret)
            if line is None:
                return None
            try:
                return interpret_text(req, line if req.is_secret else line.strip())
            except AnswerRejected as e:
                self._say(f"{show(str(e))}\n")

    def _approval(self, req: InteractionRequest) -> Reply | None:
        decisions = []
        for call in req.calls:
            self._say(
                f"  {show(call.tool_name)} {json.dumps(call.arguments)}\n"
                f"    runs: {show(call.resolved_command)}\n"
                "  [a]pprove, [r]eject, [e]dit arguments, [c]ancel the run?\n"
            )
            while True:
                line = self._line(req)
                if line is None:
                    return None
                word = line.strip().lower()[:1]
                if word == "a":
                    decisions.append(
                        CallDecision(action_id=call.action_id, decision=Decision.APPROVE)
                    )
                elif word == "c":
                    return Reply(
                        decisions=[
                            CallDecision(action_id=c.action_id, decision=Decision.CANCEL)
                            for c in req.calls
                        ]
                    )
                elif word == "r":
                    self._say("Reason (optional):\n")
                    reason = self._line(req)
                    decisions.append(
                        CallDecision(
                            action_id=call.action_id,
                            decision=Decision.REJECT,
                            reason=(reason or "").strip() or None,
                        )
                    )
                elif word == "e":
                    self._say("New arguments as JSON:\n")
                    raw = self._line(req)
                    try:
                        args = json.loads(raw or "")
                        assert isinstance(args, dict)
                    except (ValueError, AssertionError):
                        self._say("That is not a JSON object.\n")
                        continue
                    decisions.append(
                        CallDecision(
                            action_id=call.action_id, decision=Decision.EDIT, arguments=args
                        )
                    )
                else:
                    continue
                break
        return Reply(decisions=decisions)


# -- stand-ins ------------------------------------------------------------------------------
class AutoApproveInterviewer(_Quiet):
    """For CI: what each kind answers by itself (its default when it has one; else yes, the
    first option, approve every call). Never invents a secret: that is SKIPPED."""

    def ask(self, req: InteractionRequest) -> Reply:
        return auto_reply(req)


def load_answers(path: str | Path) -> list[Any]:
    """An answers file: a YAML or JSON list; items are strings or {answer|decisions: ...}."""
    p = Path(path)
    try:
        doc = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as e:
        raise UsageError(f"--answers {p}: cannot read it ({type(e).__name__})") from None
    if not isinstance(doc, list):
        raise UsageError(f"--answers {p}: expected a list of answers")
    return doc


class QueueInterviewer(_Quiet):
    """Scripted replies, in order. `start` skips the ones a previous process already used,
    so a resumed run continues the script instead of replaying it."""

    def __init__(self, answers: list[Any], start: int = 0) -> None:
        self.answers = answers
        self.next = start

    def ask(self, req: InteractionRequest) -> Reply:
        if self.next >= len(self.answers):
            return Reply(outcome="skipped", source="queue", answered_by="answers file")
        item = self.answers[self.next]
        self.next += 1
        try:
            if isinstance(item, dict):
                reply = interpret_json(req, json.dumps({"request_id": req.request_id, **item}))
            else:
                reply = interpret_text(req, str(item))
        except AnswerRejected as e:
            raise UsageError(
                f"--answers item {self.next} does not fit the question {req.prompt!r}: {e}"
            ) from None
        reply.source, reply.answered_by = "queue", reply.answered_by or "answers file"
        return reply


class CallbackInterviewer(_Quiet):
    """Delegates to `fn`, which returns a Reply, a plain-text answer, or None (no answer)."""

    def __init__(self, fn: Callable[[InteractionRequest], Reply | str | None]) -> None:
        self.fn = fn

    def ask(self, req: InteractionRequest) -> Reply | None:
        got = self.fn(req)
        reply = got if got is None or isinstance(got, Reply) else interpret_text(req, got)
        if reply is not None:
            reply.source = "callback"
        return reply


class Chain:
    """Asks each interviewer in turn; the first reply wins."""

    def __init__(self, *members: Interviewer) -> None:
        self.members = members
        self.last: Interviewer | None = None

    def ask(self, req: InteractionRequest) -> Reply | None:
        for m in self.members:
            if (reply := m.ask(req)) is not None:
                self.last = m
                return reply
        return None

    def reject(self, req: InteractionRequest, reason: str) -> bool:
        return self.last.reject(req, reason) if self.last else False

    def settle(self, req: InteractionRequest, reply: Reply) -> None:
        # The member whose reply was recorded tidies first (it knows which answer file it took);
        # the others then find the question gone, or set aside an answer that came too late.
        first = [self.last] if self.last is not None else []
        for m in [*first, *(m for m in self.members if m is not self.last)]:
            m.settle(req, reply)


def console_interviewer(
    window: Callable[[], contextlib.AbstractContextManager[object]],
    elsewhere: Callable[[InteractionRequest], Reply | None] | None = None,
) -> ConsoleInterviewer:
    return ConsoleInterviewer(sys.stdin, sys.stdout, window, elsewhere)
