"""Health as plain data: what `/livez`, `/readyz` and `deltad status` decide from, and the seam
through which the HTTP layer reaches it (and the core's metrics) without touching the loop.

The seam is `Vitals`: two calls returning plain data, `health()` (a `Health` snapshot) and
`core_metrics()` (the core's Prometheus exposition, bytes in the text format). In one process
the loop's side implements it (`deltad.core.service.CoreVitals`); an HTTP layer in another process
gets the same two answers over its socket, next to the feed's replica. The decisions below are
pure functions of a snapshot and a monotonic `now`, tested from tables.

Readiness (Kubernetes' convention: callers go by the status code):
- `ready`: the startup reconcile ended (READY=1 was sent);
- `index`: every workspace that walk found has been read into the index (a waiting question is
  only glanced at by the walk and read after READY, a slice per loop turn: until then the
  inbox's lists miss it, and `GET /v1/requests` answering `[]` would be a lie);
- `lease` (under `ha:` only): this daemon holds the lease. A standby does not listen at all
  (it holds neither the state dir nor the port), so a load balancer sees it as not ready.

Liveness: the loop turned within `LIVE_WITHIN` seconds (it wakes at least every
`HEARTBEAT_SECONDS`, and the startup walk counts its slices as turns).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

LIVE_WITHIN = 10.0  # seconds without a loop turn before /livez says 503
HEARTBEAT_SECONDS = 2.0  # the loop wakes at least this often, even with nothing to do


@dataclass(frozen=True)
class Health:
    """What the loop knows about itself, copied out (no references into its state)."""

    ready: bool  # the startup reconcile ended (READY=1)
    index_complete: bool  # every workspace found has been read into the index
    unread: int  # workspaces found and not read yet (while index_complete is False)
    last_turn: float | None  # monotonic, when the loop last turned (None: not yet)
    lease_held: bool | None = None  # None: no `ha:` configured
    workspaces: int = 0


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


def live_checks(h: Health, now: float, within: float = LIVE_WITHIN) -> list[Check]:
    if h.last_turn is None:
        return [Check("loop", False, "the loop has not turned yet")]
    ago = max(0.0, now - h.last_turn)
    return [Check("loop", ago <= within, f"last turn {ago:.1f}s ago (limit {within:g}s)")]


def ready_checks(h: Health) -> list[Check]:
    checks = [
        Check("ready", h.ready, "startup reconcile done" if h.ready else "startup reconcile"),
        Check(
            "index",
            h.index_complete,
            f"{h.workspaces} workspaces indexed"
            if h.index_complete
            else f"{h.unread} of {h.workspaces} workspaces still to read",
        ),
    ]
    if h.lease_held is not None:
        checks.append(Check("lease", h.lease_held, "held" if h.lease_held else "not held"))
    return checks


def passing(checks: list[Check]) -> bool:
    return all(c.ok for c in checks)


def document(checks: list[Check]) -> dict[str, object]:
    """The body of /livez and /readyz: the status, and with `?verbose` each check."""
    return {
        "status": "ok" if passing(checks) else "failing",
        "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in checks],
    }


class Vitals(Protocol):
    """What the HTTP layer is handed next to the feed (see the module docstring)."""

    def health(self) -> Health: ...

    def core_metrics(self) -> bytes: ...


@dataclass(frozen=True)
class Fixed:
    """A `Vitals` that always says the same (tests, and an app built without a daemon)."""

    snapshot: Health
    exposition: bytes = b""

    def health(self) -> Health:
        return self.snapshot

    def core_metrics(self) -> bytes:
        return self.exposition


class Standalone:
    """The `Vitals` of an HTTP app with no daemon's loop behind it (built in-process by tests
    and tools): it is what it serves, so always live and ready, with no core metrics."""

    def health(self) -> Health:
        return Health(True, True, 0, time.monotonic())

    def core_metrics(self) -> bytes:
        return b""
