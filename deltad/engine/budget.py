"""The context budget: what of a long run's conversation goes into one model call.

Every call replays the conversation from the journal, so a long run would eventually overflow
the model's context window. Each call therefore has a budget in tokens (`llm.context_budget`,
default: the model's window, `llm.context_window` or a known default for its name, less the
reply's `max_tokens` and the tools' schemas). When the turns since the last cut no longer fit,
the oldest whole turns (a THOUGHT and its tool results, never split) are left out, down to
`REFILL` of the budget so that a cut is not needed again at the very next call, and a
condensed note takes their place.

The decision is made from the journal alone and recorded in it before the call: a
SYSTEM_MESSAGE with a `context_cut` object (`through_seq`, the condensed note, counts). Every
later call starts from the latest recorded cut, so a resumed process sends exactly what the
process before it would have, and nothing is left out without a journal line saying so.
Tokens are estimated (4 characters of JSON per token, plus a little per message): no
tokenizer is needed, the estimate is the same on every machine, and it errs on the large side
for English text.
"""

from __future__ import annotations

import bisect
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from deltad.agent import LLMSettings
from deltad.protocol import EventType, JournalEvent
from deltad.protocol.events import ActionResult, NodeMessage, SystemMessage, Thought, typed

CHARS_PER_TOKEN = 4
PER_MESSAGE = 4  # role and framing
REFILL = 0.75  # after a cut, the kept turns take at most this share of the budget
REPLY_RESERVE = 4096  # tokens kept for the reply when llm.max_tokens is not set
DEFAULT_WINDOW = 32_768  # an unknown model (a local server) is assumed to be small

# Windows of well-known models, by name prefix (longest match wins).
KNOWN_WINDOWS = {
    "gpt-4.1": 1_047_576,
    "gpt-4o": 128_000,
    "gpt-4-turbo": 128_000,
    "gpt-4": 8_192,
    "gpt-3.5-turbo": 16_385,
    "gpt-5": 400_000,
    "o1": 200_000,
    "o3": 200_000,
    "o4": 200_000,
}


def window_of(settings: LLMSettings) -> int:
    if settings.context_window is not None:
        return settings.context_window
    name = settings.model.rsplit("/", 1)[-1]
    known = [p for p in KNOWN_WINDOWS if name.startswith(p)]
    return KNOWN_WINDOWS[max(known, key=len)] if known else DEFAULT_WINDOW


def budget_of(settings: LLMSettings, tools: list[dict[str, Any]]) -> int:
    """Tokens for the messages of one call."""
    if settings.context_budget is not None:
        return settings.context_budget
    reserve = settings.max_tokens or REPLY_RESERVE
    return max(1, window_of(settings) - reserve - estimate(tools))


def estimate(obj: Any) -> int:
    return len(json.dumps(obj, ensure_ascii=False)) // CHARS_PER_TOKEN + PER_MESSAGE


@dataclass
class Turn:
    """A THOUGHT and the tool results that follow it: left out together or kept together
    (a tool message without its assistant message is an invalid request)."""

    first_seq: int
    last_seq: int
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: Counter[str] = field(default_factory=Counter)
    tokens: int = 0


@dataclass(frozen=True)
class Cut:
    """What a `context_cut` record says: every turn up to `through_seq` is left out."""

    through_seq: int
    turns: int  # turns left out in all, this cut and the earlier ones
    tools: dict[str, int]  # tool calls in those turns, by name
    note: str

    def payload(self, budget: int, kept_tokens: int) -> dict[str, Any]:
        return {
            "level": "INFO",
            "content": f"context budget ({budget} tokens): {self.note}",
            "context_cut": {
                "through_seq": self.through_seq,
                "turns": self.turns,
                "tools": self.tools,
                "note": self.note,
                "budget_tokens": budget,
                "kept_tokens": kept_tokens,
            },
        }

    @classmethod
    def of(cls, c: dict[str, Any]) -> Cut:
        return cls(int(c["through_seq"]), int(c["turns"]), dict(c["tools"]), str(c["note"]))


def last_cut(events: Sequence[JournalEvent], after: int = 0) -> Cut | None:
    """The latest cut recorded after event `after` (a pipeline node's start: an earlier
    node's cut does not apply, and the scan stops there instead of reading the whole run)."""
    for i in range(
        len(events) - 1, bisect.bisect_right(events, after, key=lambda e: e.seq) - 1, -1
    ):
        e = events[i]
        if e.type == EventType.SYSTEM_MESSAGE and (c := typed(e, SystemMessage).context_cut):
            return Cut.of(c)
    return None


def _turn(thought: JournalEvent, results: list[JournalEvent]) -> Turn:
    m: dict[str, Any] = {"role": "assistant", "content": typed(thought, Thought).content}
    calls = thought.payload.get("tool_calls") or []  # as the model sent them: the wire form
    if calls:
        m["tool_calls"] = calls
    turn = Turn(thought.seq, results[-1].seq if results else thought.seq, [m])
    turn.tools.update(_tool_names(thought))
    for r in results:
        if r.type == EventType.NODE_MESSAGE:  # a person's turn in an interactive node
            turn.messages.append({"role": "user", "content": typed(r, NodeMessage).text})
            continue
        result = typed(r, ActionResult)
        turn.messages.append(
            {
                "role": "tool",
                "tool_call_id": result.action_id,
                "content": result.observation_content,
            }
        )
    turn.tokens = sum(estimate(x) for x in turn.messages)
    return turn


def _tool_names(thought: JournalEvent) -> list[str]:
    return [c.function.name for c in typed(thought, Thought).tool_calls]


def turns_after(
    events: Sequence[JournalEvent], seq: int, stop_above: int | None = None
) -> list[Turn]:
    """The conversation's turns after journal event `seq`, oldest first. Built from the newest
    backwards; with `stop_above`, building stops once they exceed that many tokens (what is
    older is left out anyway), so a call costs what it sends, not the journal's length."""
    start = bisect.bisect_right(events, seq, key=lambda e: e.seq)
    turns: list[Turn] = []
    results: list[JournalEvent] = []
    total = 0
    for i in range(len(events) - 1, start - 1, -1):
        e = events[i]
        if e.type in (EventType.ACTION_RESULT, EventType.NODE_MESSAGE):
            results.append(e)
        elif e.type == EventType.THOUGHT:
            turns.append(_turn(e, results[::-1]))
            results = []
            total += turns[-1].tokens
            if stop_above is not None and total > stop_above:
                break
    return turns[::-1]


def plan(
    events: Sequence[JournalEvent],
    turns: list[Turn],
    budget: int,
    fixed: int,
    previous: Cut | None,
    since: int = 0,
) -> Cut | None:
    """A new cut if the conversation (its turns since the previous cut, `turns` being the newest
    of them) does not fit in `budget` beside `fixed` tokens (system prompt, task, the current
    note); None if it does. The newest turn is always kept; after a cut the rest takes at most
    `REFILL` of the budget. `since`: where the conversation begins (a pipeline node's start)."""
    after = max(since, previous.through_seq if previous else 0)
    older = turns and _any_thought(events, after, turns[0].first_seq)
    total = fixed + sum(t.tokens for t in turns)
    if total <= budget and not older:
        return None
    if len(turns) < 2 and not older:
        return None
    target = int(budget * REFILL)
    keep = len(turns)
    while keep > 1 and fixed + sum(t.tokens for t in turns[len(turns) - keep :]) > target:
        keep -= 1
    first_kept = turns[len(turns) - keep]
    through = first_kept.first_seq - 1
    tools = Counter(previous.tools if previous else {})
    count = previous.turns if previous else 0
    for e in _between(events, after, through):
        if e.type == EventType.THOUGHT:
            count += 1
            tools.update(_tool_names(e))
    return Cut(through, count, dict(tools), _note(count, through, tools))


def _between(events: Sequence[JournalEvent], after: int, through: int) -> Sequence[JournalEvent]:
    lo = bisect.bisect_right(events, after, key=lambda e: e.seq)
    hi = bisect.bisect_right(events, through, key=lambda e: e.seq)
    return events[lo:hi]


def _any_thought(events: Sequence[JournalEvent], after: int, before: int) -> bool:
    return any(e.type == EventType.THOUGHT for e in _between(events, after, before - 1))


def _note(turns: int, through: int, tools: Counter[str]) -> str:
    used = ", ".join(f"{name} x{n}" for name, n in sorted(tools.items()) if name) or "none"
    return (
        f"the {turns} earliest turn(s) of this run (journal events up to {through}) are left out "
        f"of the conversation to fit the model's context; tool calls in them: {used}. Ask again "
        "for anything you need from them."
    )


def note_message(cut: Cut) -> dict[str, Any]:
    return {"role": "user", "content": f"[deltad] {cut.note}"}
