"""The daemon's role (deltad/core/role.py): one named state, moved by one pure rule, from a
table; and the lifecycle that looks, takes the role it is given and says each change."""

from __future__ import annotations

from pathlib import Path

import pytest
from structlog.testing import capture_logs

from deltad.core.role import Role, Seen, next_role

STOP = Seen(stop=True)
LOST = Seen(lost=True)
STALE = Seen(may_act=False)  # the lease's last renewal is too old to act on
READY = Seen(ready=True)
R = Role


@pytest.mark.parametrize(
    ("role", "seen", "expected"),
    [
        # a standby waits for the lease, and stops when told, before or instead of taking it
        (R.STANDBY, Seen(held=False), R.STANDBY),
        (R.STANDBY, Seen(held=True), R.STARTING),
        (R.STANDBY, Seen(held=False, stop=True), R.STOPPED),
        (R.STANDBY, Seen(held=True, stop=True), R.STOPPED),  # no start once asked to stop
        # starting: the startup reconcile runs to its end, whatever happens meanwhile
        (R.STARTING, Seen(), R.STARTING),
        (R.STARTING, STOP, R.STARTING),
        (R.STARTING, LOST, R.STARTING),
        (R.STARTING, READY, R.ACTIVE),
        (R.STARTING, Seen(ready=True, stop=True), R.STOPPING),  # READY, then the shutdown
        (R.STARTING, Seen(ready=True, lost=True), R.LOST),
        (R.STARTING, Seen(ready=True, may_act=False), R.FENCED),
        # active: acts while its lease's renewal is recent
        (R.ACTIVE, READY, R.ACTIVE),
        (R.ACTIVE, STALE, R.FENCED),
        (R.ACTIVE, STOP, R.STOPPING),
        (R.ACTIVE, LOST, R.LOST),
        # fenced: acts on nothing until a renewal says whose the lease is
        (R.FENCED, STALE, R.FENCED),
        (R.FENCED, Seen(), R.ACTIVE),  # renewed: its own
        (R.FENCED, Seen(may_act=False, lost=True), R.LOST),  # renewed: another's
        (R.FENCED, Seen(may_act=False, stop=True), R.STOPPING),
        # a lost lease outranks a stop, which outranks the fence
        (R.ACTIVE, Seen(stop=True, lost=True, may_act=False), R.LOST),
        (R.ACTIVE, Seen(stop=True, may_act=False), R.STOPPING),
        # stopping: the shutdown runs to its end, unless the lease is another's meanwhile
        (R.STOPPING, STOP, R.STOPPING),
        (R.STOPPING, Seen(stopped=True), R.STOPPED),
        (R.STOPPING, LOST, R.LOST),
        (R.STOPPING, Seen(stopped=True, lost=True), R.LOST),  # exit 1, not 0
        # the ends stay
        (R.STOPPED, Seen(held=True, ready=True), R.STOPPED),
        (R.LOST, Seen(), R.LOST),
    ],
)
def test_the_next_role(role: Role, seen: Seen, expected: Role) -> None:
    assert next_role(role, seen) is expected


@pytest.mark.parametrize("role", list(Role))
def test_every_role_answers_every_sight(role: Role) -> None:
    """No role is left without a rule: whatever is seen, some role comes out."""
    flags = ("stop", "held", "ready", "may_act", "lost", "stopped")
    for bits in range(1 << len(flags)):
        seen = Seen(**{f: bool(bits >> i & 1) for i, f in enumerate(flags)})
        assert isinstance(next_role(role, seen), Role)


def test_what_each_role_means_for_readyz_and_the_loop() -> None:
    assert {r for r in Role if r.ready} == {R.ACTIVE, R.FENCED, R.STOPPING}
    assert {r for r in Role if r.ended} == {R.STOPPING, R.STOPPED, R.LOST}


@pytest.mark.linux_only  # as test_operating's vitals test: the glance's read lease
def test_the_lifecycle_says_each_change_of_role_and_the_lease_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fleet's daemon, started with its lease held: ACTIVE; a renewal too old fences it
    (`lease_unconfirmed`), a renewal brings it back (`lease_confirmed`), another daemon in the
    record ends it (`lease_lost`). Each change is one `role_changed` line."""
    from deltad.clock import ManualClock
    from deltad.core.config import HaConfig, load_config
    from deltad.core.lease import Lease
    from deltad.core.service import Service

    from .test_daemon_sweep import RecordingResumer

    monkeypatch.delenv("DELTAD_CONFIG", raising=False)
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    (tmp_path / "root").mkdir()
    config = load_config(None, (str(tmp_path / "root"),))
    config.state_dir = tmp_path / "state"
    config.executor = "fresh"
    config.ha = HaConfig(lease=tmp_path / "lease", lease_seconds=10.0)
    clock = ManualClock(wall=1.7e9)
    svc = Service(config, None, (), clock=clock, resumer=RecordingResumer(config))
    life = svc.life
    assert life.role is R.STANDBY and not svc.vitals.health().ready
    life.lease = lease = Lease(config.ha.lease, config.ha.lease_seconds)
    assert lease.try_take(clock.monotonic())
    try:
        with capture_logs() as logs:
            life.start()
            assert life.role is R.ACTIVE and svc.vitals.health().ready and life.may_act()
            clock.advance(6.0)  # more than half a lease since the last renewal began
            assert not life.may_act() and life.role is R.FENCED
            assert not life.may_act()  # said once
            assert lease.renew(clock.monotonic())
            assert life.may_act() and life.role is R.ACTIVE
            lease.lost = True  # a renewal found another daemon's epoch
            assert not life.may_act() and life.role is R.LOST and life.stopping
            assert not svc.vitals.health().ready
        said = [
            (e["event"], e.get("from"), e.get("to"))
            for e in logs
            if e["event"] == "role_changed" or e["event"].startswith("lease_")
        ]
        assert said == [
            ("role_changed", "standby", "starting"),
            ("role_changed", "starting", "active"),
            ("role_changed", "active", "fenced"),
            ("lease_unconfirmed", None, None),
            ("role_changed", "fenced", "active"),
            ("lease_confirmed", None, None),
            ("role_changed", "active", "lost"),
            ("lease_lost", None, None),
        ]
    finally:
        life.close_backends()
        lease.release()
