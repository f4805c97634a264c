"""What the daemon currently believes about each workspace, and the log lines for changes.

Beliefs only serve logging, `deltad status` and the liveness sweep; every decision to act is
taken from disk by `reconcile.inspect`.
"""

from __future__ import annotations

import itertools
import logging
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import structlog

from deltad.core.facts import State, Verdict
from deltad.inbox.feed import Feed, View
from deltad.protocol import RunStatus
from deltad.protocol.printable import show, show_path

log = structlog.get_logger("deltad.registry")
_stdlib = logging.getLogger("deltad.registry")  # its level check is cached by logging


def _say(quiet: bool) -> Callable[..., Any] | None:
    """info, or debug when `quiet`; None if that would be filtered out anyway (a full
    reconcile of 10,000 workspaces must not pay for 20,000 discarded debug lines)."""
    if not quiet:
        say: Callable[..., Any] = log.info
        return say
    # Before touching `log`: each attribute of structlog's lazy proxy binds a new logger.
    return log.debug if _stdlib.isEnabledFor(logging.DEBUG) else None


def _interned(name: str | None) -> str | None:
    """A handful of input types shared by 100,000 workspaces: one string each."""
    return sys.intern(name) if name is not None else None


def view_of(ws: Path, v: Verdict) -> View:
    """What the index and the registry keep of a verdict. The state's and status's values are
    the enums' own strings (`str()` of a member copies it: ~70 bytes per workspace)."""
    status = v.status.value if v.status is not None else None
    return View(
        ws,
        v.state.value,
        v.run_id,
        status,
        v.request_id,
        _interned(v.input_type),
        v.created,
        v.deadline,
    )


# States whose workspaces are listed (status.json) or walked (the liveness sweep) by state.
INDEXED = (State.WAITING, State.RUNNING, State.INTERRUPTED)


class Registry:
    """Beliefs by workspace, indexed by state and problem as they change: the status file,
    written every second while anything changes, costs what it shows, not a walk over 50,000
    workspaces (a tenth of a second of the loop's time, each second).

    A belief is the workspace's `View`, the one the inbox index keeps: the registry's table
    is the index's, written through the feed's hook (by this loop only), so an idle workspace
    costs one entry and one object, not a copy in each (issue 20: ~250 bytes per workspace).
    The rare fields live beside it: a problem, a live owner's pid."""

    def __init__(self, feed: Feed | None = None) -> None:
        self.feed = Feed() if feed is None else feed  # a quiet one of its own, in tests
        self.workspaces: dict[Path, View] = self.feed.index.table
        self._counts = dict.fromkeys(State, 0)
        # Workspaces by state, in the order they reached it, for the states whose members are
        # shown or walked; a waiting one with a question is found in the index's questions
        # (a table entry per idle workspace cost ~60 bytes).
        self._by_state: dict[State, dict[Path, None]] = {s: {} for s in INDEXED}
        self._problems: dict[Path, str] = {}
        self._pids: dict[Path, int] = {}  # RUNNING with a local owner

    def problem(self, ws: Path) -> str | None:
        return self._problems.get(ws)

    def settled_waiting(self, ws: Path) -> bool:
        """Read before and found waiting, without a problem, for a named question: a later
        glance that still shows that question unanswered needs no read (its deadline has its
        timer)."""
        view = self.workspaces[ws]
        return view.state == State.WAITING and ws not in self._problems and bool(view.request_id)

    def _unfile(self, ws: Path, view: View) -> None:
        state = State(view.state)
        self._counts[state] -= 1
        if (members := self._members(view)) is not None:
            members.pop(ws, None)
        self._problems.pop(ws, None)

    def _file(self, ws: Path, view: View, problem: str | None) -> None:
        self._counts[State(view.state)] += 1
        if (members := self._members(view)) is not None:
            members[ws] = None
        if problem:
            self._problems[ws] = problem

    def _members(self, view: View) -> dict[Path, None] | None:
        """The table that lists `view`'s workspace by its state, if one does."""
        if view.state == State.WAITING and view.request_id:
            return None  # the index's questions list it
        return self._by_state.get(State(view.state))

    def _set(self, ws: Path, before: View | None, after: View | None) -> None:
        """Tell the feed, which keeps `after` in the table (None: forgets the workspace)."""
        if before != after:
            self.feed.changed(ws, before, after)

    def __contains__(self, ws: Path) -> bool:
        return ws in self.workspaces

    def __len__(self) -> int:
        return len(self.workspaces)

    def add(self, ws: Path, *, quiet: bool = False) -> None:
        if ws not in self.workspaces:
            view = View(ws, State.IDLE.value)
            self._set(ws, None, view)
            self._file(ws, view, None)
            if say := _say(quiet):
                say("workspace_discovered", workspace=str(ws))

    def drop(self, ws: Path) -> None:
        if (view := self.workspaces.get(ws)) is not None:
            self._unfile(ws, view)
            self._pids.pop(ws, None)
            log.info("workspace_removed", workspace=str(ws))
            self._set(ws, view, None)

    def observe(self, ws: Path, v: Verdict, *, quiet: bool = False) -> bool:
        """Record what reconcile saw; log observed transitions and new/cleared problems once.
        Returns True if anything changed."""
        seen = self.workspaces[ws]
        problem, pid = self._problems.get(ws), self._pids.get(ws)
        before = (seen.state, seen.run_id, seen.status, problem, pid)
        self._log_status(ws, seen, v, quiet)
        self._log_problem(ws, problem, v)
        self._unfile(ws, seen)
        after = view_of(ws, v)
        if after == seen:
            after = seen  # the same belief: keep the object the index holds
        if v.owner_pid is None:
            self._pids.pop(ws, None)
        else:
            self._pids[ws] = v.owner_pid
        self._set(ws, seen, after)
        self._file(ws, after, v.problem)
        return before != (after.state, after.run_id, after.status, v.problem, v.owner_pid)

    def interrupted(self, ws: Path) -> None:
        """The daemon marked the run INTERRUPTED itself (the protocol layer logged it)."""
        if (seen := self.workspaces.get(ws)) is not None:
            problem = self._problems.get(ws)
            self._unfile(ws, seen)
            self._pids.pop(ws, None)
            after = replace(seen, state=State.INTERRUPTED.value, status=RunStatus.INTERRUPTED.value)
            self._set(ws, seen, after)
            self._file(ws, after, problem)

    @staticmethod
    def _log_status(ws: Path, seen: View, v: Verdict, quiet: bool) -> None:
        if v.status is None:
            return
        if v.run_id == seen.run_id and seen.status is not None and v.status != seen.status:
            log.info(
                "status_transition",
                workspace=str(ws),
                run_id=v.run_id,
                observed=True,
                **{"from": seen.status, "to": str(v.status)},
            )
        elif v.run_id != seen.run_id and (say := _say(quiet)):
            say("run_observed", workspace=str(ws), run_id=v.run_id, status=str(v.status))

    @staticmethod
    def _log_problem(ws: Path, problem: str | None, v: Verdict) -> None:
        if v.problem and v.problem != problem:
            log.warning("workspace_problem", workspace=str(ws), run_id=v.run_id, problem=v.problem)
        elif problem and not v.problem:
            log.info("workspace_problem_cleared", workspace=str(ws), run_id=v.run_id)

    def running(self) -> list[Path]:
        return list(self._by_state[State.RUNNING])

    def in_state(self, state: State) -> Iterator[Path]:
        """Take what you need: it is not copied. Running and interrupted ones in the order
        they reached it; waiting ones without a question so, then those with one oldest
        question first; other states by a walk over every workspace (nothing shows them)."""
        if state is State.WAITING:
            asking = (v.workspace for v in self.feed.index.asking())
            return itertools.chain(self._by_state[state], asking)
        if state in self._by_state:
            return iter(self._by_state[state])
        return (ws for ws, v in self.workspaces.items() if v.state == state)

    def counts(self) -> dict[str, int]:
        return {s.value: self._counts[s] for s in State if s is not State.GONE}

    def problems(self) -> Iterator[dict[str, Any]]:
        """For status.json: names and reasons shown escaped (a reason may quote a file)."""
        return (
            {"workspace": show_path(ws), "problem": show(problem)}
            for ws, problem in self._problems.items()
        )
