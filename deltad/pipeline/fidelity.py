"""What a codergen node sees of the nodes before it (attractor spec §5.4): its fidelity, and
under `full` the conversation (thread) it continues.

    full            the thread's earlier conversation, message for message, then this prompt
    truncate        the prompt, the pipeline's goal and the run id; nothing of earlier nodes
    compact         the prompt and the context values earlier nodes left (each cut at 2,000
                    characters): this runner's default, as the spec's
    summary:low     a digest: how many stages ran and the last 3 with their outcomes
    summary:medium  the last 10 stages with outcomes, the context values (each cut at 600)
    summary:high    the last 30 stages with outcomes and notes, the context values (each cut
                    at 1,500)

The summaries are deterministic digests of the journal's record, not model calls: the same
journal gives the same text, and a resume sends what was recorded in NODE_START anyway.

Which fidelity: the incoming edge's `fidelity`, else the node's, else the graph's
`default_fidelity`, else `compact`. Which thread under `full`: the node's `thread_id`, else the
incoming edge's, else the graph's `thread_id`, else the previous node's thread (its own id when
it was not itself continuing one). Pure functions; the driver records both in NODE_START.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

FIDELITIES = ("full", "truncate", "compact", "summary:low", "summary:medium", "summary:high")
DEFAULT = "compact"
COMPACT_VALUE_CHARS = 2000
# Repeated under response.<node>, or the engine's bookkeeping (§5.1): not shown to the model.
HIDDEN_KEYS = ("last_stage", "last_response", "outcome", "preferred_label", "current_node")
HIDDEN_PREFIXES = ("graph.", "internal.")


@dataclass(frozen=True)
class Digest:
    stages: int  # the latest stages shown, with their outcomes
    value_chars: int  # each context value cut to this (0: no context values)
    notes: bool  # each stage's notes (its final message), first line


SUMMARIES: Mapping[str, Digest] = {
    "summary:low": Digest(3, 0, False),
    "summary:medium": Digest(10, 600, False),
    "summary:high": Digest(30, 1500, True),
}


@dataclass(frozen=True)
class Stage:
    """A node that finished: what a summary says of it."""

    node: str
    status: str
    notes: str = ""


def resolve_fidelity(
    edge_attrs: Mapping[str, str] | None,
    node_attrs: Mapping[str, str],
    graph_attrs: Mapping[str, str],
) -> str:
    for attrs, key in ((edge_attrs or {}, "fidelity"), (node_attrs, "fidelity")):
        if attrs.get(key, "").strip():
            return attrs[key].strip()
    return graph_attrs.get("default_fidelity", "").strip() or DEFAULT


def resolve_thread(
    node_id: str,
    fidelity: str,
    edge_attrs: Mapping[str, str] | None,
    node_attrs: Mapping[str, str],
    graph_attrs: Mapping[str, str],
    previous_thread: str | None,
) -> str:
    """The visit's thread key: a node that is not `full` starts a thread of its own (its id),
    which a later `full` node may continue."""
    if fidelity != "full":
        return node_id
    for attrs in (node_attrs, edge_attrs or {}, graph_attrs):
        if attrs.get("thread_id", "").strip():
            return attrs["thread_id"].strip()
    return previous_thread or node_id


def _values(context: Mapping[str, Any], limit: int) -> list[str]:
    return [
        f"- {k}: {str(v)[:limit]}"
        for k, v in context.items()
        if k not in HIDDEN_KEYS and not k.startswith(HIDDEN_PREFIXES)
    ]


def _stages(stages: Sequence[Stage], digest: Digest) -> list[str]:
    shown = stages[-digest.stages :] if digest.stages else []
    lines = [f"{len(stages)} stage(s) finished; the latest {len(shown)}:"]
    for s in shown:
        note = s.notes.strip().splitlines()[0][:200] if digest.notes and s.notes.strip() else ""
        lines.append(f"- {s.node}: {s.status}" + (f" ({note})" if note else ""))
    return lines


def compose(
    prompt: str,
    fidelity: str,
    goal: str,
    run_id: str,
    context: Mapping[str, Any],
    stages: Sequence[Stage],
) -> str:
    """The prompt a codergen node's conversation begins with, at its fidelity."""
    if fidelity == "truncate":
        return f"{prompt}\n\nPipeline goal: {goal}\nRun: {run_id}"
    if fidelity == "full":
        return prompt  # the thread's conversation carries what came before
    if fidelity in SUMMARIES:
        digest = SUMMARIES[fidelity]
        lines = _stages(stages, digest)
        if digest.value_chars:
            lines += ["Context values:", *_values(context, digest.value_chars)]
        return prompt + "\n\nSummary of the earlier steps of the pipeline:\n" + "\n".join(lines)
    earlier = _values(context, COMPACT_VALUE_CHARS)
    if not earlier:
        return prompt
    return prompt + "\n\nContext from earlier steps of the pipeline:\n" + "\n".join(earlier)
