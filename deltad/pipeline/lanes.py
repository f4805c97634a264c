"""A parallel branch's own view of the run: its lane of the journal, and questions held back.

Branches interleave in one journal, so a node's conversation (its turns since its
NODE_START), what is pending in it, and a question's context (`last_message`, `tool_calls`)
must be read from its own branch only. `LaneJournal` is that view: the run's events before
the fan-out, then only the events tagged with the branch (everything it appends is tagged).

A branch's question is journaled when its node asks, but put in the mailbox only when no
branch can go on (`parallel.next_step` says when: `may_ask`). Until then `Holding` keeps it
back: the node stops, the branch is blocked on the question (its `asking`), and the other
branches go on. The mailbox holds one question at a time, always the journal's.
"""

from __future__ import annotations

from typing import Any

from deltad.engine.interviewers import Interviewer
from deltad.protocol import EventType, InteractionRequest, Journal, JournalEvent
from deltad.protocol.history import History
from deltad.protocol.journal import read_journal
from deltad.protocol.replies import Reply

# Events about the run as a whole, journaled untagged while branches run: every lane sees them.
_RUN_WIDE = (EventType.RUN_START, EventType.RUN_END)
_LANE_KEYS = ("branch", "child")  # what marks a line as a branch's (of a child pipeline)


def in_lane(e: JournalEvent, tag: dict[str, Any], since: int) -> bool:
    """Whether event `e` belongs to the lane tagged `tag` whose fan-out began at seq `since`:
    the run before the fan-out, the branch's own events, and the run-wide ones."""
    if e.seq < since or e.type in _RUN_WIDE:
        return True
    p = e.payload
    if e.type == EventType.SYSTEM_MESSAGE and p.get("retry") and p.get("branch") is None:
        return True  # a resume's marker
    return all(p.get(k) == tag.get(k) for k in _LANE_KEYS)


class LaneJournal(Journal):
    """The journal as one branch sees it (a filter over the run's `Journal`, which it writes
    through, tagging each line with the branch). What is the run's stays the run's: whether it
    started or ended, the count of model calls (`max_iterations` bounds the run) and the tool
    call ids (unique in the run)."""

    def __init__(self, base: Journal, tag: dict[str, Any], since: int) -> None:
        # Not Journal.__init__: nothing is read from disk, the run's journal is filtered.
        self.base, self.tag, self.since = base, tag, since
        self.path = base.path
        self.restored_bytes = base.restored_bytes
        self.events: list[JournalEvent] = []
        self.history = History()
        self._seen, self._read_through = 0, 0
        if self._cut_after(base.events, since):
            # Opening kept only the events after the latest context cut; a cut made in
            # another branch would leave out this branch's earlier turns: read them again.
            for e in read_journal(base.path).events:
                self._fold(e)
                self._read_through = e.seq
        self.refresh()

    @staticmethod
    def _cut_after(events: list[JournalEvent], since: int) -> bool:
        """Whether a context cut after the fan-out may have left lines out of `events`."""
        return any(
            e.type == EventType.SYSTEM_MESSAGE
            and isinstance(cut := e.payload.get("context_cut"), dict)
            and int(cut.get("through_seq", 0)) >= since
            for e in events
        )

    def _fold(self, e: JournalEvent) -> None:
        if in_lane(e, self.tag, self.since):
            self.events.append(e)
            self.history.add(e)

    def refresh(self) -> None:
        """Fold in what the run journaled since (other branches' lines are skipped)."""
        for e in self.base.events[self._seen :]:
            if e.seq > self._read_through:
                self._fold(e)
        self._seen = len(self.base.events)
        run = self.base.history  # the run's, whatever the lines read at open held
        self.history.started, self.history.thoughts = run.started, run.thoughts
        self.history.last_end, self.history.last_retry_seq = run.last_end, run.last_retry_seq
        self.history.call_ids = run.call_ids

    @property
    def next_seq(self) -> int:
        return self.base.next_seq

    def append(self, type_: EventType, payload: dict[str, Any]) -> JournalEvent:
        event = self.base.append(type_, {**payload, **self.tag})
        self.refresh()
        return event

    def snapshot(self) -> None:
        self.base.snapshot()


class Holding:
    """An interviewer for a branch's node: it asks through `inner` only when the branch may
    ask (no other branch can go on, or its question is the one in the mailbox); otherwise it
    holds the question back (`held`) and nobody answers now."""

    def __init__(self, inner: Interviewer, may_ask: bool) -> None:
        self.inner, self.may_ask, self.held = inner, may_ask, False

    def ask(self, req: InteractionRequest) -> Reply | None:
        if self.may_ask:
            return self.inner.ask(req)
        self.held = True
        return None

    def settle(self, req: InteractionRequest, reply: Reply) -> None:
        self.inner.settle(req, reply)

    def reject(self, req: InteractionRequest, reason: str) -> bool:
        return self.inner.reject(req, reason)
