"""The daemon's role: what it may do now, one named state, moved by one pure rule.

    STANDBY ──lease taken──► STARTING ──startup reconcile done──► ACTIVE ⇄ FENCED
       │ stop                                       stop │  (lease renewed / too old)
       ▼                                                 ▼
    STOPPED ◄─────────────── shutdown done ─────── STOPPING
    LOST ◄── the lease's record names another daemon (once started; stopping too)

`next_role(role, seen)` reads the role and what was seen since the last look (`Seen`: the
signals, the lease's state, the daemon's own milestones) and returns the next role; the
lifecycle (`lifecycle.py`) looks, takes the role it is given and logs each change
(`role_changed`). Tested from a table (tests/unit/test_daemon_role.py). Without `ha:` the lease
is always held and never lost: the daemon starts in STARTING.

A lost lease outranks a stop, which outranks the fence: a daemon whose lease is another's stops
at once, without a shutdown (its resumes are the new active's), whatever else it was asked.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Role(StrEnum):
    STANDBY = "standby"  # `ha:`: waiting for the lease, holding nothing else
    STARTING = "starting"  # the state dir's lock, the inbox, the startup reconcile
    ACTIVE = "active"  # READY: events, reconciles, resumes
    FENCED = "fenced"  # the lease's last renewal is too old to act on: acts on nothing
    STOPPING = "stopping"  # asked to stop: the shutdown (resumes get their grace)
    STOPPED = "stopped"  # exit 0
    LOST = "lost"  # another daemon holds the lease now: exit 1, for systemd to restart it

    @property
    def ready(self) -> bool:
        """The startup reconcile is done (READY=1 said, /readyz's `ready`) and the daemon is
        still the active one: until its shutdown is done, fenced or not."""
        return self in (Role.ACTIVE, Role.FENCED, Role.STOPPING)

    @property
    def ended(self) -> bool:
        """The loop is over: no more turns, no more resumes started."""
        return self in (Role.STOPPING, Role.STOPPED, Role.LOST)


@dataclass(frozen=True)
class Seen:
    """What the role moves on, looked at once (each loop turn, each standby poll)."""

    stop: bool = False  # SIGTERM or SIGINT was received
    held: bool = True  # the lease is this daemon's (always, without `ha:`)
    ready: bool = False  # the startup reconcile is done
    may_act: bool = True  # the lease's last renewal began recently enough to act on
    lost: bool = False  # a renewal found another daemon in the lease's record
    stopped: bool = False  # the shutdown is done


def next_role(role: Role, seen: Seen) -> Role:
    match role:
        case Role.STANDBY:
            if seen.stop:
                return Role.STOPPED
            return Role.STARTING if seen.held else Role.STANDBY
        case Role.STARTING:
            return _acting(seen) if seen.ready else Role.STARTING
        case Role.ACTIVE | Role.FENCED:
            return _acting(seen)
        case Role.STOPPING:
            if seen.lost:
                return Role.LOST
            return Role.STOPPED if seen.stopped else Role.STOPPING
        case Role.STOPPED | Role.LOST:
            return role


def _acting(seen: Seen) -> Role:
    if seen.lost:
        return Role.LOST
    if seen.stop:
        return Role.STOPPING
    return Role.ACTIVE if seen.may_act else Role.FENCED
