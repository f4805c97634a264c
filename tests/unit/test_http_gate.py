"""The connection gate's decisions from tables: which newcomer is let in, refused, or let in by
closing a stranger (and whose), the network an address counts in, how many connections the
descriptor limit leaves after the reserve; the counter's bookkeeping and its rate-limited log."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from deltad.http.gate import Caps, Connection, Gate, Load, admission, connection_cap, network_of

CAPS = Caps(total=4, per_source=2, per_network=3)


@pytest.mark.parametrize(
    ("load", "verdict"),
    [
        (Load(0, 0, 0), (None, None)),
        (Load(3, 1, 2), (None, None)),  # under every cap
        # Over a cap with strangers in its scope: the oldest of them makes room.
        (Load(2, 2, 2, 2, 2, 2), ("max_connections_per_source", "source")),
        (Load(3, 1, 3, 3, 1, 3), ("max_connections_per_network", "network")),
        (Load(4, 0, 0, 4, 0, 0), ("max_connections", "any")),
        # Over a cap whose scope holds only known connections (or probes): refused.
        (Load(2, 2, 2, 2, 0, 2), ("max_connections_per_source", None)),
        (Load(3, 1, 3, 3, 1, 0), ("max_connections_per_network", None)),
        (Load(4, 0, 0, 0, 0, 0), ("max_connections", None)),
        # The narrowest cap first: a stranger of its own address makes room under all three.
        (Load(4, 2, 3, 4, 1, 3), ("max_connections_per_source", "source")),
    ],
)
def test_who_is_let_in_refused_or_makes_room(load: Load, verdict: tuple[object, object]) -> None:
    assert admission(load, CAPS) == verdict


@pytest.mark.parametrize(
    ("source", "network"),
    [
        ("10.1.2.3", "10.1.2.0/24"),
        ("127.0.0.5", "127.0.0.0/24"),
        ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),
        ("::ffff:10.1.2.3", "10.1.2.0/24"),  # IPv4 on a dual-stack socket counts as IPv4
        ("fe80::1%eth0", "fe80::/64"),
        ("?", "?"),  # a Unix socket's peer: its own
    ],
)
def test_the_network_an_address_counts_in(source: str, network: str) -> None:
    assert network_of(source) == network


@pytest.mark.parametrize(
    ("configured", "nofile", "in_use", "reserve", "cap"),
    [
        (512, 65536, 40, 256, 512),  # the descriptor limit does not bind
        (512, 1024, 40, 256, 728),  # 728 left: the configured 512 binds
        (1000, 1024, 40, 256, 728),  # the limit less what is open and the reserve
        (1000, 300, 40, 256, 4),
        (1000, 200, 40, 256, 1),  # never none at all: the reserve stays as large as it can
    ],
)
def test_the_descriptor_reserve(
    configured: int, nofile: int, in_use: int, reserve: int, cap: int
) -> None:
    assert connection_cap(configured, nofile, in_use, reserve) == min(cap, configured)


class Peer:
    """One client connection as the server side holds it: admitted, or told 503 and closed."""

    def __init__(self, gate: Gate, source: str) -> None:
        self.source, self.closed = source, False
        got = gate.admit(source, self.close)
        self.conn: Connection | None = got if isinstance(got, Connection) else None
        self.refused = None if self.conn else got

    def close(self) -> None:
        self.closed = True


def test_strangers_make_room_oldest_first_and_known_ones_are_never_closed() -> None:
    gate = Gate(Caps(total=4, per_source=4, per_network=4))
    alice = Peer(gate, "10.0.0.1")
    assert alice.conn is not None
    alice.conn.prove()  # her token checked out
    flood = [Peer(gate, "10.9.0.1") for _ in range(3)]
    assert gate.open_count() == 4 and gate.stranger_count() == 3
    more = [Peer(gate, "10.9.0.1") for _ in range(3)]
    # Each newcomer closed the oldest stranger; alice stays.
    assert [p.closed for p in flood] == [True, True, True]
    assert all(p.conn is not None and not p.closed for p in more)
    assert not alice.closed and gate.open_count() == 4 and gate.refused["closed_for_room"] == 3
    # A closed one's own close later counts nothing twice.
    for p in flood:
        assert p.conn is not None
        gate.release(p.conn)
    assert gate.open_count() == 4
    # Only known connections left: the next is refused.
    for p in more:
        assert p.conn is not None
        p.conn.prove()
    assert Peer(gate, "10.9.0.1").refused == "max_connections"


def test_a_full_process_closes_a_stranger_of_the_network_holding_the_most() -> None:
    gate = Gate(Caps(total=4, per_source=4, per_network=4))
    bob = Peer(gate, "10.1.0.7")  # a stranger still, but from a quiet network
    flood = [Peer(gate, f"10.9.0.{i}") for i in range(3)]
    newcomer = Peer(gate, "10.2.0.1")
    assert newcomer.conn is not None and not bob.closed
    assert [p.closed for p in flood] == [True, False, False]


def test_a_network_over_its_cap_gives_up_its_own_oldest_and_a_source_its_own() -> None:
    gate = Gate(Caps(total=100, per_source=2, per_network=3))
    a1, a2 = Peer(gate, "10.0.0.1"), Peer(gate, "10.0.0.1")
    b1 = Peer(gate, "10.0.0.2")
    a3 = Peer(gate, "10.0.0.1")  # its source is full: its own oldest goes
    assert (a1.closed, a2.closed, b1.closed, a3.refused) == (True, False, False, None)
    c1 = Peer(gate, "10.0.0.3")  # the /24 is full: the network's oldest goes
    assert (a2.closed, b1.closed, c1.refused) == (True, False, None)
    other = Peer(gate, "10.0.1.1")  # another /24 is not touched
    assert other.refused is None and not b1.closed


def test_a_stranger_sending_its_request_outlives_the_idle_ones() -> None:
    gate = Gate(Caps(total=3, per_source=3, per_network=3))
    alice = Peer(gate, "10.0.0.1")  # the oldest, but her request's bytes are arriving
    assert alice.conn is not None
    gate.talking(alice.conn, True)
    idle = [Peer(gate, "10.0.0.9") for _ in range(2)]
    flood = [Peer(gate, "10.0.0.9") for _ in range(2)]
    assert [p.closed for p in idle] == [True, True] and not alice.closed
    gate.talking(alice.conn, False)  # answered, and idle again: the youngest of them
    assert alice.conn.kind == "idle"
    later = Peer(gate, "10.0.0.9")
    assert flood[0].closed and not alice.closed
    # Only busy strangers left: the one busy longest goes.
    for p in (flood[1], alice, later):
        assert p.conn is not None
        gate.talking(p.conn, True)
    newest = Peer(gate, "10.0.0.9")
    assert flood[1].closed and not alice.closed and not later.closed
    assert newest.conn is not None and gate.stranger_count() == 3


def test_a_health_request_holds_its_connection_while_it_is_answered() -> None:
    gate = Gate(Caps(total=2, per_source=2, per_network=2))
    probe = Peer(gate, "10.0.0.1")
    assert probe.conn is not None
    gate.probe(probe.conn, True)
    other = Peer(gate, "10.0.0.2")
    third = Peer(gate, "10.0.0.3")  # only `other` may make room
    assert other.closed and not probe.closed and third.conn is not None
    gate.probe(probe.conn, False)  # answered: a stranger again, the youngest
    fourth = Peer(gate, "10.0.0.4")
    assert third.closed and not probe.closed and fourth.conn is not None


def test_refusals_are_counted_and_a_flood_is_logged_once() -> None:
    gate = Gate(Caps(total=3, per_source=2, per_network=3))
    with capture_logs() as logs:
        first = [Peer(gate, "10.0.0.1") for _ in range(2)]
        for p in first:
            assert p.conn is not None
            p.conn.prove()
        for _ in range(1000):
            assert Peer(gate, "10.0.0.1").refused == "max_connections_per_source"
        assert Peer(gate, "10.0.1.2").refused is None
    assert gate.open_count() == 3 and gate.open_count("10.0.0.1") == 2
    assert gate.refused == {"max_connections_per_source": 1000}
    assert [e["event"] for e in logs] == ["http_connections_refused"]  # not 1000 lines
    for p in first:
        assert p.conn is not None
        gate.release(p.conn)
    assert gate.open_count() == 1 and gate.open_count("10.0.0.1") == 0
