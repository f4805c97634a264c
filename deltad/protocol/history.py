"""One read model of the journal: what is pending, what was asked and answered, how it ended.

The engine, the CLI and the answering package all ask the journal the same questions; this is
the one place that answers them. It is incremental (`add` each event as it is read or
appended), so a long run pays for each event once, not once per question.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .events import Answered, Asked, typed
from .models import EventType, InputType, InteractionRequest, JournalEvent
from .replies import Reply


@dataclass(frozen=True)
class Call:
    """A tool call the model made in a THOUGHT."""

    id: str
    name: str
    arguments: str

    @classmethod
    def of(cls, raw: dict[str, Any]) -> Call:
        fn = raw.get("function") or {}
        args = fn.get("arguments")
        return cls(str(raw["id"]), str(fn.get("name", "")), args if isinstance(args, str) else "{}")


@dataclass
class History:
    started: bool = False
    last_thought: JournalEvent | None = None
    calls: list[Call] = field(default_factory=list)  # of the last THOUGHT
    requested: set[str] = field(default_factory=set)  # ACTION_REQUEST since the last THOUGHT
    answered: set[str] = field(default_factory=set)  # ACTION_RESULT since the last THOUGHT
    results: set[str] = field(default_factory=set)  # every action with a result
    call_ids: set[str] = field(default_factory=set)  # every tool call id the model used
    asked_requests: list[InteractionRequest] = field(default_factory=list)
    replies: dict[str, Reply] = field(default_factory=dict)  # request_id -> recorded reply
    # Replies recorded after the first for the same question (none, unless a record the run
    # did not write was refused: a gated question takes the first whose seal verifies).
    later: dict[str, list[Reply]] = field(default_factory=dict)
    sources: Counter[str] = field(default_factory=Counter)
    last_end: JournalEvent | None = None
    last_retry_seq: int = 0
    count: int = 0
    thoughts: int = 0  # model replies recorded in the whole run: what max_iterations counts

    @classmethod
    def of(cls, events: Iterable[JournalEvent]) -> History:
        h = cls()
        for e in events:
            h.add(e)
        return h

    # -- a snapshot (protocol/snapshot.py) -----------------------------------------------
    def state(self) -> dict[str, Any]:
        """Everything `add` derived, as JSON: restoring it equals replaying the same events."""

        def event(e: JournalEvent | None) -> dict[str, Any] | None:
            return None if e is None else e.model_dump(mode="json")

        return {
            "started": self.started,
            "last_thought": event(self.last_thought),
            "calls": [[c.id, c.name, c.arguments] for c in self.calls],
            "requested": sorted(self.requested),
            "answered": sorted(self.answered),
            "results": sorted(self.results),
            "call_ids": sorted(self.call_ids),
            "asked_requests": [r.model_dump(mode="json") for r in self.asked_requests],
            "replies": {k: r.model_dump(mode="json") for k, r in self.replies.items()},
            "later": {k: [r.model_dump(mode="json") for r in v] for k, v in self.later.items()},
            "sources": dict(self.sources),
            "last_end": event(self.last_end),
            "last_retry_seq": self.last_retry_seq,
            "count": self.count,
            "thoughts": self.thoughts,
        }

    @classmethod
    def restored(cls, s: dict[str, Any]) -> History:
        """The inverse of `state`; raises ValueError/KeyError/TypeError on anything else."""

        def event(raw: object) -> JournalEvent | None:
            return None if raw is None else JournalEvent.model_validate(raw)

        def ids(raw: object) -> set[str]:
            if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
                raise TypeError("a list of ids")
            return set(raw)

        return cls(
            started=bool(s["started"]),
            last_thought=event(s["last_thought"]),
            calls=[Call(str(i), str(n), str(a)) for i, n, a in s["calls"]],
            requested=ids(s["requested"]),
            answered=ids(s["answered"]),
            results=ids(s["results"]),
            call_ids=ids(s["call_ids"]),
            asked_requests=[InteractionRequest.model_validate(r) for r in s["asked_requests"]],
            replies={str(k): Reply.model_validate(r) for k, r in dict(s["replies"]).items()},
            later={
                str(k): [Reply.model_validate(r) for r in v]
                for k, v in dict(s.get("later") or {}).items()
            },
            sources=Counter({str(k): int(v) for k, v in dict(s["sources"]).items()}),
            last_end=event(s["last_end"]),
            last_retry_seq=int(s["last_retry_seq"]),
            count=int(s["count"]),
            thoughts=int(s["thoughts"]),  # missing from an older snapshot: a miss, a full read
        )

    def add(self, e: JournalEvent) -> None:
        self.count += 1
        p = e.payload
        match e.type:
            case EventType.RUN_START:
                self.started = True
            case EventType.THOUGHT:
                self.last_thought = e
                self.thoughts += 1
                self.calls = [Call.of(c) for c in p.get("tool_calls") or []]
                self.call_ids.update(c.id for c in self.calls)
                self.requested, self.answered = set(), set()
            case EventType.ACTION_REQUEST:
                self.requested.add(p["action_id"])
            case EventType.ACTION_RESULT:
                self.answered.add(p["action_id"])
                self.results.add(p["action_id"])
            case EventType.HUMAN_INTERACTION if p.get("phase") == "asked":
                self.asked_requests.append(typed(e, Asked).request)
            case EventType.HUMAN_INTERACTION if p.get("phase") == "answered":
                answered = typed(e, Answered)
                if answered.request_id in self.replies:
                    self.later.setdefault(answered.request_id, []).append(answered.reply)
                else:
                    self.replies[answered.request_id] = answered.reply
                self.sources[answered.reply.source] += 1
            case EventType.RUN_END:
                self.last_end = e
            case EventType.NODE_START:
                # A pipeline node is a conversation of its own: nothing of the last one is
                # pending in it.
                self.last_thought, self.calls = None, []
                self.requested, self.answered = set(), set()
            case EventType.NODE_MESSAGE:
                self.last_thought = None  # the human spoke last: the model answers next
            case EventType.SYSTEM_MESSAGE if p.get("retry"):
                self.last_retry_seq = e.seq
            case _:
                pass  # other messages (unknown types never get here: journal.py refuses them)

    # -- questions ---------------------------------------------------------------------------
    def pending_calls(self) -> list[Call]:
        """The last THOUGHT's tool calls without a result, in order."""
        return [c for c in self.calls if c.id not in self.answered]

    def ended(self) -> JournalEvent | None:
        """The RUN_END that ends the run (none after a retry marker, nor before the last
        THOUGHT: then the run went on)."""
        end = self.last_end
        if end is None or end.seq < self.last_retry_seq:
            return None
        if self.last_thought is not None and self.last_thought.seq > end.seq:
            return None
        return end

    def asked(self, action_id: str, kind: InputType | None = None) -> InteractionRequest | None:
        """The question recorded for `action_id` (any of its calls, for an approval)."""
        for req in reversed(self.asked_requests):
            ids = [c.action_id for c in req.calls] or [req.action_id]
            if action_id in ids and (kind is None or req.input_type == kind):
                return req
        return None

    def reply(self, request_id: str) -> Reply | None:
        return self.replies.get(request_id)

    def replies_to(self, request_id: str) -> list[Reply]:
        """Every reply recorded to question `request_id`, in the journal's order."""
        first = self.replies.get(request_id)
        return [] if first is None else [first, *self.later.get(request_id, [])]

    def replies_from(self, source: str) -> int:
        """How many recorded replies came from `source` (a resumed answers queue skips them)."""
        return self.sources[source]
