"""The web sessions' logouts at the scale of the finding (10,000 login/logout pairs by one token
holder): in tests/unit_slow, beside tests/unit/test_inbox_exhaust.py's smaller cases."""

from __future__ import annotations

import hashlib
from pathlib import Path

from deltad.http import sessions
from deltad.http.sessions import Sessions
from tests.unit.test_inbox_exhaust import pairs


def test_ten_thousand_logouts_do_not_bring_a_logged_out_session_back(tmp_path: Path) -> None:
    s = Sessions(sessions.load_key(tmp_path), 3600, None)  # in memory: 10,000 fsyncs are slow
    digest = hashlib.sha256(b"token").hexdigest()
    stolen, _ = s.open("alice", digest, now=1000)
    s.close(stolen, now=1000)
    other, _ = s.open("bob", digest, now=1000)  # another token's session is not touched
    # The finding: 10,000 login/logout pairs by a token holder made it valid again.
    pairs(s, "alice", 10_000, 1001)
    assert s.get(stolen, now=1200) is None
    assert s.get(other, now=1200) is not None
    fresh, _ = s.open("alice", digest, now=1200)  # opened after the cut-off: it lives
    assert s.get(fresh, now=1201) is not None
