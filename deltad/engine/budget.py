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
    def of(cls, payload: dict[str, Any]) -> Cut:
        c = payload["context_cut"]
        return cls(int(c["through_seq"]), int(c["turns"]), dict(c["tools"]), str(c["note"]))


def last_cut(events: Sequence[JournalEvent]) -> Cut | None:
    for e in reversed(events):
        if e.type == EventType.SYSTEM_MESSAGE and isinstance(e.payload.get("context_cut"), dict):
            return Cut.of(e.payload)
    return None


def turns_after(events: Sequence[JournalEvent], seq: int) -> list[Turn]:
    """The conversation's turns after journal event `seq` (events are in seq order)."""
    start = bisect.bisect_right(events, seq, key=lambda e: e.seq)
    turns: list[Turn] = []
    for e in events[start:]:
        if e.type == EventType.THOUGHT:
            m: dict[str, Any] = {"role": "assistant", "content": e.payload.get("content")}
            calls = e.payload.get("tool_calls") or []
            if calls:
                m["tool_calls"] = calls
            turn = Turn(e.seq, e.seq, [m])
            turn.tools.update(str((c.get("function") or {}).get("name", "")) for c in calls)
            turns.append(turn)
        elif e.type == EventType.ACTION_RESULT and turns:
            turns[-1].messages.append(
                {
                    "role": "tool",
                    "tool_call_id": e.payload["action_id"],
                    "content": e.payload["observation_content"],
                }
            )
        else:
            continue
        turns[-1].last_seq = e.seq
    for t in turns:
        t.tokens = sum(estimate(m) for m in t.messages)
    return turns


def plan(turns: list[Turn], budget: int, fixed: int, previous: Cut | None) -> Cut | None:
    """A new cut if the turns do not fit in `budget` beside `fixed` tokens (system prompt,
    task, the current note); None if they do. The newest turn is always kept."""
    total = fixed + sum(t.tokens for t in turns)
    if total <= budget or len(turns) < 2:
        return None
    target = int(budget * REFILL)
    dropped = 0
    while dropped < len(turns) - 1 and total > target:
        total -= turns[dropped].tokens
        dropped += 1
    gone = turns[:dropped]
    tools = Counter(previous.tools if previous else {})
    for t in gone:
        tools.update(t.tools)
    count = (previous.turns if previous else 0) + len(gone)
    return Cut(gone[-1].last_seq, count, dict(tools), _note(count, gone[-1].last_seq, tools))


def _note(turns: int, through: int, tools: Counter[str]) -> str:
    used = ", ".join(f"{name} x{n}" for name, n in sorted(tools.items()) if name) or "none"
    return (
        f"the {turns} earliest turn(s) of this run (journal events up to {through}) are left out "
        f"of the conversation to fit the model's context; tool calls in them: {used}. Ask again "
        "for anything you need from them."
    )


def note_message(cut: Cut) -> dict[str, Any]:
    return {"role": "user", "content": f"[deltad] {cut.note}"}
