"""What the daemon currently believes about each workspace, and the log lines for changes.

Beliefs only serve logging, `deltad status` and the liveness sweep; every decision to act is
taken from disk by `reconcile.inspect`.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from deltad.protocol import RunStatus
from deltad.protocol.printable import show, show_path

from .feed import View
from .reconcile import State, Verdict

log = structlog.get_logger("deltad.registry")


def _say(quiet: bool) -> Callable[..., Any] | None:
    """info, or debug when `quiet`; None if that would be filtered out anyway (a full
    reconcile of 10,000 workspaces must not pay for 20,000 discarded debug lines)."""
    say: Callable[..., Any] | None = log.info
    if quiet:
        debug = logging.getLogger("deltad.registry").isEnabledFor(logging.DEBUG)
        say = log.debug if debug else None
    return say


@dataclass(slots=True)  # one per workspace: no per-instance dict
class WsInfo:
    state: State = State.IDLE
    run_id: str | None = None
    status: RunStatus | None = None
    problem: str | None = None
    owner_pid: int | None = None
    request_id: str | None = None
    input_type: str | None = None
    created: float | None = None

    def view(self, ws: Path) -> View:
        status = str(self.status) if self.status is not None else None
        return View(
            ws,
            self.state.value,
            self.run_id,
            status,
            self.request_id,
            self.input_type,
            self.created,
        )


def _interned(name: str | None) -> str | None:
    """A handful of input types shared by 100,000 workspaces: one string each."""
    return sys.intern(name) if name is not None else None


def settled_waiting(info: WsInfo) -> bool:
    """Read before and found waiting, without a problem, for a named question: a later glance
    that still shows that question unanswered needs no read (its deadline has its timer)."""
    return info.state is State.WAITING and info.problem is None and info.request_id is not None


Changed = Callable[[Path, View | None, View | None], None]


class Registry:
    """Beliefs by workspace, indexed by state and problem as they change: the status file,
    written every second while anything changes, costs what it shows, not a walk over 50,000
    workspaces (a tenth of a second of the loop's time, each second)."""

    def __init__(self, on_change: Changed | None = None) -> None:
        self.workspaces: dict[Path, WsInfo] = {}
        self.on_change = on_change  # the feed: the HTTP index and the event stream
        self._by_state: dict[State, dict[Path, None]] = {s: {} for s in State}
        self._problems: dict[Path, None] = {}

    def _unfile(self, ws: Path, info: WsInfo) -> None:
        self._by_state[info.state].pop(ws, None)
        self._problems.pop(ws, None)

    def _file(self, ws: Path, info: WsInfo) -> None:
        self._by_state[info.state][ws] = None
        if info.problem:
            self._problems[ws] = None

    def _changed(self, ws: Path, before: View | None, after: View | None) -> None:
        if self.on_change is not None and before != after:
            self.on_change(ws, before, after)

    def __contains__(self, ws: Path) -> bool:
        return ws in self.workspaces

    def __len__(self) -> int:
        return len(self.workspaces)

    def add(self, ws: Path, *, quiet: bool = False) -> None:
        if ws not in self.workspaces:
            self.workspaces[ws] = WsInfo()
            self._file(ws, self.workspaces[ws])
            self._changed(ws, None, self.workspaces[ws].view(ws))
            if say := _say(quiet):
                say("workspace_discovered", workspace=str(ws))

    def drop(self, ws: Path) -> None:
        if (info := self.workspaces.pop(ws, None)) is not None:
            self._unfile(ws, info)
            log.info("workspace_removed", workspace=str(ws))
            self._changed(ws, info.view(ws), None)

    def observe(self, ws: Path, v: Verdict, *, quiet: bool = False) -> bool:
        """Record what reconcile saw; log observed transitions and new/cleared problems once.
        Returns True if anything changed."""
        info = self.workspaces[ws]
        seen = info.view(ws)
        before = (info.state, info.run_id, info.status, info.problem, info.owner_pid)
        self._log_status(ws, info, v, quiet)
        self._log_problem(ws, info, v)
        self._unfile(ws, info)
        info.state, info.run_id, info.status = v.state, v.run_id, v.status
        info.problem, info.owner_pid = v.problem, v.owner_pid
        info.request_id, info.input_type = v.request_id, _interned(v.input_type)
        info.created = v.created
        self._file(ws, info)
        self._changed(ws, seen, info.view(ws))
        return before != (info.state, info.run_id, info.status, info.problem, info.owner_pid)

    def interrupted(self, ws: Path) -> None:
        """The daemon marked the run INTERRUPTED itself (the protocol layer logged it)."""
        if info := self.workspaces.get(ws):
            seen = info.view(ws)
            self._unfile(ws, info)
            info.status, info.state, info.owner_pid = RunStatus.INTERRUPTED, State.INTERRUPTED, None
            self._file(ws, info)
            self._changed(ws, seen, info.view(ws))

    @staticmethod
    def _log_status(ws: Path, info: WsInfo, v: Verdict, quiet: bool) -> None:
        if v.status is None:
            return
        if v.run_id == info.run_id and info.status is not None and v.status != info.status:
            log.info(
                "status_transition",
                workspace=str(ws),
                run_id=v.run_id,
                observed=True,
                **{"from": str(info.status), "to": str(v.status)},
            )
        elif v.run_id != info.run_id and (say := _say(quiet)):
            say("run_observed", workspace=str(ws), run_id=v.run_id, status=str(v.status))

    @staticmethod
    def _log_problem(ws: Path, info: WsInfo, v: Verdict) -> None:
        if v.problem and v.problem != info.problem:
            log.warning("workspace_problem", workspace=str(ws), run_id=v.run_id, problem=v.problem)
        elif info.problem and not v.problem:
            log.info("workspace_problem_cleared", workspace=str(ws), run_id=v.run_id)

    def running(self) -> list[Path]:
        return list(self._by_state[State.RUNNING])

    def in_state(self, state: State) -> Iterator[Path]:
        """In the order they reached it (take what you need: it is not copied)."""
        return iter(self._by_state[state])

    def counts(self) -> dict[str, int]:
        return {s.value: len(self._by_state[s]) for s in State if s is not State.GONE}

    def problems(self) -> Iterator[dict[str, Any]]:
        """For status.json: names and reasons shown escaped (a reason may quote a file)."""
        return (
            {"workspace": show_path(ws), "problem": show(self.workspaces[ws].problem or "")}
            for ws in self._problems
        )
