"""Human gates (wait.human, attractor spec §4.6): a hexagon's outgoing edges are its choices.

Each choice has a one-character key: the accelerator written in its label (`[A] Approve`,
`A) Approve`, `A - Approve`), else the first character of the label not already taken. Keys
written in labels are reserved first, so a derived key never takes one a label asked for, and
two labels asking for the same key are an error (`build_options` in the protocol would quietly
give the second one another key: fine for an agent's question, not for a graph someone wrote).

An answer is a key or a label (any case, accelerator prefix optional). Anything else is no
choice at all — the caller refuses it as a misfit answer; there is never a fallback to the first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from deltad.protocol.models import MAX_APPROVALS, Option, respondent_problem
from deltad.protocol.questions import parse_accelerator

from .model import Edge, Graph, Node
from .outcome import Outcome, Status
from .problems import Code, Problem

FALLBACK_KEYS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
SELECTED = "human.gate.selected"  # context keys a gate sets
LABEL = "human.gate.label"
NO_EDGES = "No outgoing edges for human gate"


@dataclass(frozen=True)
class Choice:
    key: str
    label: str
    edge: Edge

    @property
    def target(self) -> str:
        return self.edge.target


def one_line(text: str) -> str:
    """Runs of whitespace (newlines too) as one space: a choice is shown and typed on a line."""
    return " ".join(text.split())


def _fold(text: str) -> str:
    return one_line(text).casefold()


def _free_key(label: str, taken: set[str]) -> str | None:
    letters = [c.upper() for c in label if c.isalnum()] + list(FALLBACK_KEYS)
    return next((c for c in letters if len(c) == 1 and c.casefold() not in taken), None)


def _written(edges: Sequence[Edge]) -> list[tuple[str | None, str, Edge]]:
    """(the key a label asks for, the label without it, the edge); a missing label is the
    target's id."""
    out = []
    for e in edges:
        key, label = parse_accelerator(one_line(e.label) or e.target)
        out.append((key, label or e.target, e))
    return out


def derive_choices(edges: Sequence[Edge]) -> tuple[list[Choice], list[Problem]]:
    """The gate's choices in edge order, and what is wrong with their keys and labels."""
    written = _written(edges)
    problems: list[Problem] = []
    owner: dict[str, Edge] = {}
    for key, _, e in written:
        if key is None:
            continue
        if len(key) != 1:
            problems.append(
                Problem(
                    f"key {key!r} is not one character", e.where("label"), e.subject, code=Code.GATE
                )
            )
        elif (other := owner.get(key.casefold())) is not None:
            problems.append(
                Problem(
                    f"key {key} is also the key of the edge to {other.target} (line "
                    f"{other.pos.line}): keys must differ within a gate (case does not count)",
                    e.where("label"),
                    e.subject,
                    code=Code.GATE,
                )
            )
        else:
            owner[key.casefold()] = e
    taken = set(owner)
    choices: list[Choice] = []
    for key, label, e in written:
        if key is None or len(key) != 1:
            key = _free_key(label, taken)
            if key is None:
                problems.append(
                    Problem("no key left for this choice", e.pos, e.subject, code=Code.GATE)
                )
                continue
            taken.add(key.casefold())
        choices.append(Choice(key, label, e))
    return choices, problems + _ambiguous(choices)


def _ambiguous(choices: list[Choice]) -> list[Problem]:
    """Two choices with one label, or a one-letter label that is another choice's key, would
    make an answer mean two things. Each choice is checked against the earlier ones through two
    lookups (a gate may have thousands of edges)."""
    problems: list[Problem] = []
    by_label: dict[str, Choice] = {}
    by_key: dict[str, Choice] = {}
    for c in choices:
        label, key = _fold(c.label), _fold(c.key)
        if (other := by_label.get(label)) is not None:
            why = f"label {c.label!r} is also the label of the edge to {other.target}"
        elif (other := by_key.get(label) or by_label.get(key)) is not None:
            why = f"label {c.label!r} and key {c.key} overlap with the edge to {other.target}"
        if other is not None:
            problems.append(Problem(why, c.edge.where("label"), c.edge.subject, code=Code.GATE))
        by_label.setdefault(label, c)
        by_key.setdefault(key, c)
    return problems


@dataclass(frozen=True)
class Gate:
    node: Node
    choices: tuple[Choice, ...]
    problems: tuple[Problem, ...]  # key clashes and ambiguous labels; empty when valid
    respondents: tuple[str, ...] = ()  # who may answer over HTTP (`respondents` attribute)
    approvals_required: int = 1  # four eyes: distinct people who must agree (docs/inbox.md)

    @property
    def question(self) -> str:
        return self.node.label or "Select an option:"

    def options(self) -> list[Option]:
        """The choices as the mailbox's `choice` options."""
        return [Option(key=c.key, label=c.label) for c in self.choices]

    def choice_for(self, answer: str) -> Choice | None:
        """A key or a label, any case, `[K] `/`K) `/`K - ` prefix optional; else None."""
        wanted = _fold(answer)
        by_key = {_fold(c.key): c for c in reversed(self.choices)}  # first wins
        by_label = {_fold(c.label): c for c in reversed(self.choices)}
        if not wanted:
            return None
        if found := by_key.get(wanted) or by_label.get(wanted):
            return found
        key, rest = parse_accelerator(one_line(answer))
        found = by_label.get(_fold(rest))
        if key is not None and found is not None and _fold(found.key) == _fold(key):
            return found
        return None

    def resolve_default(self) -> tuple[Choice | None, str | None]:
        """`human.default_choice` as a key, a label or a target node id: (choice, None), or
        (None, why it matches nothing), or (None, None) when the node has none."""
        value = self.node.default_choice
        if value is None:
            return None, None
        if found := self.choice_for(value):
            return found, None
        by_target = [c for c in self.choices if c.target == value.strip()]
        if len(by_target) == 1:
            return by_target[0], None
        keys = ", ".join(c.key for c in self.choices)
        if by_target:
            return None, (
                f"human.default_choice {value!r} is the target of {len(by_target)} choices: "
                f"give a key ({keys}) or a label instead"
            )
        return None, (
            f"human.default_choice {value[:40]!r} matches no choice: give a key ({keys}), a "
            "label or a target node id"
        )

    def selected(self, choice: Choice, notes: str = "") -> Outcome:
        """Route to the choice's edge and record it (both ways the spec routes a gate)."""
        return Outcome(
            Status.SUCCESS,
            preferred_label=choice.label,
            suggested_next_ids=(choice.target,),
            context_updates={SELECTED: choice.key, LABEL: choice.label},
            notes=notes,
        )

    def on_answer(self, answer: str) -> Outcome | None:
        """The outcome of an answer, or None: a misfit the caller must refuse."""
        if not self.choices:
            return Outcome(Status.FAIL, failure_reason=NO_EDGES)
        choice = self.choice_for(answer)
        return self.selected(choice) if choice else None

    def on_timeout(self) -> Outcome:
        """The default choice, else RETRY (the engine's max_retries bounds it)."""
        if not self.choices:
            return Outcome(Status.FAIL, failure_reason=NO_EDGES)
        choice, _ = self.resolve_default()
        if choice is None:
            return Outcome(Status.RETRY, failure_reason="human gate timeout, no default")
        return self.selected(choice, notes="timed out: took human.default_choice")

    def on_skipped(self) -> Outcome:
        """No answer will come (an exhausted scripted queue)."""
        reason = NO_EDGES if not self.choices else "human skipped interaction"
        return Outcome(Status.FAIL, failure_reason=reason)


def respondents_of(node: Node) -> tuple[tuple[str, ...], list[Problem]]:
    """The `respondents` attribute ("alice, group:ops"): the names, and what is wrong with
    them (a gate must never quietly become answerable by anyone)."""
    names = tuple(n.strip() for n in node.attrs.get("respondents", "").split(",") if n.strip())
    problems = [
        Problem(why, node.where("respondents"), node.subject, code=Code.GATE)
        for n in names
        if (why := respondent_problem(n)) is not None
    ]
    if "respondents" in node.attrs and not names:
        problems.append(
            Problem(
                "respondents is empty: name who may answer, or leave it out",
                node.where("respondents"),
                node.subject,
                code=Code.GATE,
            )
        )
    return names, problems


def approvals_of(node: Node) -> tuple[int, list[Problem]]:
    """The `approvals_required` attribute (four eyes: "2" asks two people to agree on the
    choice), and what is wrong with it."""
    raw = node.attrs.get("approvals_required")
    if raw is None:
        return 1, []
    text = str(raw).strip()
    if text.isdigit() and 1 <= int(text) <= MAX_APPROVALS:
        return int(text), []
    why = f"approvals_required must be a whole number from 1 to {MAX_APPROVALS}, not {text!r}"
    return 1, [Problem(why, node.where("approvals_required"), node.subject, code=Code.GATE)]


def gate(graph: Graph, node_id: str) -> Gate:
    """The gate at `node_id`, from its outgoing edges in declaration order."""
    node = graph.nodes[node_id]
    choices, problems = derive_choices(graph.outgoing(node_id))
    respondents, wrong = respondents_of(node)
    quorum, bad = approvals_of(node)
    return Gate(node, tuple(choices), tuple(problems + wrong + bad), respondents, quorum)
