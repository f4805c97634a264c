"""Approvals bound to the call (protocol/calldigest.py) and the receipts' hash chain
(daemon/audit.py), from tables: canonical digests, binding, and each kind of tampering."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from deltad.core import reconcile
from deltad.core.facts import Action
from deltad.core.tenancy import Policy
from deltad.inbox import audit, receipts
from deltad.inbox.receipts import what_of
from deltad.protocol import InteractionRequest
from deltad.protocol.calldigest import DigestMismatch, bind, call_digest, shown_arguments
from deltad.protocol.models import GatedCall
from deltad.protocol.replies import CallDecision, Decision
from deltad.testing.stub import paused_workspace
from deltad.watch.hints import Why

# -- the digest -----------------------------------------------------------------------------
SAME = [
    # (call a, call b): the same call, written differently
    (("deploy", {"env": "prod", "n": 1}), ("deploy", {"n": 1, "env": "prod"})),
    (("deploy", {"a": {"y": 1, "x": [1, 2]}}), ("deploy", {"a": {"x": [1, 2], "y": 1}})),
    (("t", {"s": "é"}), ("t", {"s": "\u00e9"})),
]
DIFFERENT = [
    (("deploy", {"env": "prod"}), ("deploy", {"env": "staging"})),
    (("deploy", {"env": "prod"}), ("deploy_db", {"env": "prod"})),
    (("deploy", {"n": 1}), ("deploy", {"n": "1"})),
    (("deploy", {"a": [1, 2]}), ("deploy", {"a": [2, 1]})),
    (("deploy", {}), ("deploy", {"extra": None})),
    (("t", {"s": "e\u0301"}), ("t", {"s": "\u00e9"})),  # no Unicode normalisation: bytes
]


@pytest.mark.parametrize(("a", "b"), SAME)
def test_the_same_call_has_one_digest(a: tuple[str, Any], b: tuple[str, Any]) -> None:
    assert call_digest(*a) == call_digest(*b)


@pytest.mark.parametrize(("a", "b"), DIFFERENT)
def test_a_different_call_has_another_digest(a: tuple[str, Any], b: tuple[str, Any]) -> None:
    assert call_digest(*a) != call_digest(*b)


def test_the_digest_is_sha256_over_sorted_compact_ascii_json() -> None:
    import hashlib

    raw = b'{"arguments":{"a":"\\u00e9","b":[1,2.5]},"tool_name":"t"}'
    assert call_digest("t", {"b": [1, 2.5], "a": "é"}) == (
        "sha256:" + hashlib.sha256(raw).hexdigest()
    )
    assert call_digest("t", {"s": "\ud800"}).startswith("sha256:")  # a lone surrogate: escaped


@pytest.mark.parametrize(
    ("raw", "shown"),
    [('{"a": 1}', {"a": 1}), ("", {}), ("[1]", {"_raw": [1]}), ("{oops", {"_raw": "{oops"})],
)
def test_arguments_as_an_approval_shows_them(raw: str, shown: dict[str, Any]) -> None:
    assert shown_arguments(raw) == shown


def _req(*calls: tuple[str, str, dict[str, Any]]) -> InteractionRequest:
    return InteractionRequest(
        prompt="?",
        input_type="approval",
        run_id="r",
        action_id=calls[0][0],
        calls=[GatedCall(action_id=a, tool_name=t, arguments=args) for a, t, args in calls],
    )


REQ = _req(("c1", "deploy", {"env": "prod"}), ("c2", "wipe", {"disk": "sda"}))
BINDS = [
    # (decision, the digest bound: None for none)
    (
        CallDecision(action_id="c1", decision=Decision.APPROVE),
        call_digest("deploy", {"env": "prod"}),
    ),
    (
        CallDecision(action_id="c1", decision=Decision.EDIT, arguments={"env": "dev"}),
        call_digest("deploy", {"env": "dev"}),
    ),
    (CallDecision(action_id="c2", decision=Decision.REJECT, reason="no"), None),
    (CallDecision(action_id="c2", decision=Decision.CANCEL), None),
    (  # a digest the answerer sent that is the call's: kept
        CallDecision(
            action_id="c2", decision=Decision.APPROVE, digest=call_digest("wipe", {"disk": "sda"})
        ),
        call_digest("wipe", {"disk": "sda"}),
    ),
    (  # a digest on a rejection means nothing: dropped
        CallDecision(action_id="c2", decision=Decision.REJECT, digest="sha256:x"),
        None,
    ),
]


@pytest.mark.parametrize(("decision", "bound"), BINDS)
def test_an_approving_decision_binds_the_call_after_edits(
    decision: CallDecision, bound: str | None
) -> None:
    [d] = bind(REQ, [decision])
    assert d.digest == bound and d.decision == decision.decision


def test_a_digest_of_another_call_is_refused_at_answering() -> None:
    stale = call_digest("wipe", {"disk": "sdb"})  # what the answerer saw, no longer asked
    with pytest.raises(DigestMismatch, match=r"c2.*changed since it was shown"):
        bind(REQ, [CallDecision(action_id="c2", decision=Decision.APPROVE, digest=stale)])


# -- what a receipt records -------------------------------------------------------------------
def test_a_receipt_records_each_decision_with_its_digest() -> None:
    body = {
        "request_id": REQ.request_id,
        "decisions": [
            {"action_id": "c1", "decision": "edit", "arguments": {"env": "dev"}},
            {"action_id": "c2", "decision": "reject", "reason": "not today"},
        ],
    }
    what, reply = what_of(REQ, "response.json", json.dumps(body))
    assert reply is not None
    assert what == {
        "decisions": [
            {
                "action_id": "c1",
                "tool_name": "deploy",
                "decision": "edit",
                "digest": call_digest("deploy", {"env": "dev"}),
                "arguments": {"env": "dev"},
            },
            {"action_id": "c2", "tool_name": "wipe", "decision": "reject", "reason": "not today"},
        ]
    }
    what, _ = what_of(REQ, "response.txt", "approve")  # plain text: bound to the calls asked
    assert [d["digest"] for d in what["decisions"]] == [
        call_digest("deploy", {"env": "prod"}),
        call_digest("wipe", {"disk": "sda"}),
    ]


def test_a_receipt_never_holds_a_secret() -> None:
    req = InteractionRequest(prompt="key?", input_type="password", run_id="r", action_id="a")
    what, reply = what_of(req, "response.txt", "hunter2")
    assert "hunter2" not in json.dumps(what) and reply is None and "secret" in what


def test_a_misfit_answer_is_recorded_as_such() -> None:
    what, reply = what_of(REQ, "response.txt", "perhaps")
    assert reply is None and "not approve" in what["misfit"]


# -- the chain ----------------------------------------------------------------------------------
def _log(n: int) -> list[bytes]:
    out, prev = [], audit.GENESIS
    for i in range(1, n + 1):
        e = audit.chained(
            {"kind": "decision", "request_id": f"q{i}", "what": {"answer": i}}, i, prev
        )
        out.append(audit.canonical(e) + b"\n")
        prev = e["hash"]
    return out


def _edit(lines: list[bytes], i: int, rehash: bool) -> list[bytes]:
    doc = json.loads(lines[i])
    doc["what"] = {"answer": "forged"}
    if rehash:
        doc["hash"] = audit.entry_hash(doc)
    return [*lines[:i], audit.canonical(doc) + b"\n", *lines[i + 1 :]]


def _forged(lines: list[bytes], seq: int) -> bytes:
    """Another entry numbered `seq`, chained where that seq was: its own hash holds."""
    prev = json.loads(lines[seq - 2])["hash"] if seq > 1 else audit.GENESIS
    e = audit.chained({"kind": "decision", "request_id": "forged"}, seq, prev)
    return audit.canonical(e) + b"\n"


TAMPERING = [
    # (name, tampering, a whole log?, seq named, what it found, words of the reason)
    ("edited", lambda ls: _edit(ls, 2, False), True, 3, "edited", "hash does not match"),
    ("edited and rehashed", lambda ls: _edit(ls, 2, True), True, 4, "edited", "prev is not"),
    ("dropped", lambda ls: ls[:2] + ls[3:], True, 4, "dropped",
     "where 3 was expected (an entry was dropped: seq 3 is nowhere in the log)"),
    ("two dropped", lambda ls: ls[:1] + ls[3:], True, 4, "dropped",
     "where 2 was expected (entries were dropped: seq 2 to 3 is nowhere"),
    ("dropped first", lambda ls: ls[1:], True, 2, "dropped",
     "where 1 was expected (the log starts mid-chain"),
    ("swapped", lambda ls: [ls[0], ls[2], ls[1], *ls[3:]], True, 3, "moved",
     "where 2 was expected (an entry was moved: seq 2 is at line 3)"),
    ("first two swapped", lambda ls: [ls[1], ls[0], *ls[2:]], True, 2, "moved",
     "where 1 was expected (an entry was moved: seq 1 is at line 2)"),
    ("moved to the end", lambda ls: [ls[0], *ls[2:], ls[1]], True, 3, "moved",
     "seq 2 is at line 5"),
    ("repeated", lambda ls: [*ls[:3], ls[2], *ls[3:]], True, 3, "repeated",
     "where 4 was expected (an entry was repeated: the same entry is at line 3)"),
    ("inserted", lambda ls: [*ls[:3], _forged(ls, 2), *ls[3:]], True, 2, "inserted",
     "where 4 was expected (an entry was inserted"),
    ("reformatted", lambda ls: [*ls[:1], ls[1].replace(b":", b": ", 1), *ls[2:]], True, 2,
     "rewritten", "canonical"),
    ("a piece, swapped", lambda ls: [ls[2], ls[4], ls[3]], False, 5, "moved",
     "where 4 was expected (an entry was moved: seq 4 is at line 3)"),
    ("a piece, one before it moved in", lambda ls: [ls[2], ls[3], ls[1], ls[4]], False, 2,
     "moved", "where 5 was expected (an entry was moved: it belongs before line 1)"),
    ("a piece, dropped", lambda ls: [ls[2], ls[4]], False, 5, "dropped", "an entry was dropped"),
    ("a piece, its anchor edited", lambda ls: _edit(ls, 2, False)[2:], False, 3, "edited",
     "hash does not match"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "tamper", "whole", "seq", "found", "why"), TAMPERING, ids=[t[0] for t in TAMPERING]
)
def test_each_kind_of_tampering_is_named(
    name: str, tamper: Any, whole: bool, seq: int, found: str, why: str
) -> None:
    good = _log(5)
    assert audit.verify(good).entries == 5
    assert audit.verify(good[2:], from_start=False).entries == 3  # a piece, anchored
    with pytest.raises(audit.Broken) as e:
        audit.verify(tamper(good), from_start=whole)
    assert (e.value.seq, e.value.found) == (seq, found), str(e.value)
    assert why in str(e.value), str(e.value)


PIECES = [
    # (lines of a 5-entry log, a whole log?) -> (entries, first seq) or what it found
    (slice(0, 5), True, (5, 1)),
    (slice(2, 5), False, (3, 3)),  # an export --since: its first entry's prev is the start
    (slice(4, 5), False, (1, 5)),
    (slice(0, 3), False, (3, 1)),  # a piece may be the whole log
    (slice(2, 5), True, "dropped"),  # the daemon's own log must start at seq 1
    (slice(0, 0), True, (0, None)),
]


@pytest.mark.parametrize(("part", "whole", "verdict"), PIECES)
def test_a_piece_of_the_chain_verifies_from_its_first_entry(
    part: slice, whole: bool, verdict: Any
) -> None:
    lines = _log(5)[part]
    if isinstance(verdict, str):
        with pytest.raises(audit.Broken) as e:
            audit.verify(lines, from_start=whole)
        assert e.value.found == verdict and "--partial" in str(e.value)
        return
    v = audit.verify(lines, from_start=whole)
    assert (v.entries, v.first_seq) == verdict


def test_a_garbage_line_is_named_by_its_line() -> None:
    with pytest.raises(audit.Broken, match="line 2: not a JSON entry"):
        audit.verify([_log(1)[0], b"{oops\n"])


def test_a_dropped_tail_shows_against_a_recorded_head() -> None:
    good = _log(5)
    head = audit.verify(good).head
    assert audit.verify(good, head=head).head == head
    assert audit.verify(good + _log(6)[5:], head=head).entries == 6  # grown since: fine
    with pytest.raises(audit.Broken, match="recorded head"):
        audit.verify(good[:4], head=head)


def test_an_export_since_verifies_from_its_first_entry() -> None:
    tail = _log(5)[2:]
    with pytest.raises(audit.Broken, match="where 1 was expected"):
        audit.verify(tail)
    v = audit.verify(tail, from_start=False)
    assert (v.entries, v.first_seq) == (3, 3)
    with pytest.raises(audit.Broken):
        audit.verify([tail[0], tail[2]], from_start=False)


def test_appends_chain_through_the_file(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    for i in range(3):
        audit.append(path, {"kind": "decision", "i": i})
    lines = path.read_bytes().splitlines(keepends=True)
    v = audit.verify(lines)
    assert (v.entries, v.head) == (3, json.loads(lines[-1])["hash"])
    assert (path.stat().st_mode & 0o777) == 0o600


def test_an_append_left_unsynced_is_fsynced_later_by_the_files_descriptor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon's receipts: written before their resumes, fsynced after they started.
    What is synced is the file appended to, even when a rotation moved it aside meanwhile."""
    path = tmp_path / "audit.jsonl"
    synced: list[int] = []
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(os.fstat(fd).st_ino))
    unsynced: list[int] = []
    audit.append(path, {"kind": "decision", "i": 0}, unsynced)
    audit.append(path, {"kind": "decision", "i": 1}, unsynced)
    assert synced == [] and len(unsynced) == 2
    assert audit.verify(path.read_bytes().splitlines(keepends=True)).entries == 2  # readable
    ino = path.stat().st_ino
    path.rename(tmp_path / "audit.jsonl.000001")  # as a rotation moves it aside
    audit.sync(unsynced)
    assert synced == [ino, ino] and unsynced == []


def test_a_failing_fsync_of_unsynced_appends_closes_every_descriptor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "audit.jsonl"
    unsynced: list[int] = []
    for i in range(2):
        audit.append(path, {"kind": "decision", "i": i}, unsynced)
    fds = list(unsynced)

    def failing(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(OSError, match="Input/output"):
        audit.sync(unsynced)
    assert unsynced == []
    for fd in fds:
        with pytest.raises(OSError):
            os.fstat(fd)  # closed


def test_a_torn_tail_stops_appends_without_writing(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    audit.append(path, {"kind": "decision"})
    path.write_bytes(path.read_bytes() + b'{"seq":2,')
    before = path.read_bytes()
    with pytest.raises(audit.AuditError, match="torn"):
        audit.append(path, {"kind": "decision"})
    assert path.read_bytes() == before


def test_an_entry_is_bounded() -> None:
    huge = {"kind": "decision", "what": {"answer": "x" * 100_000}}
    e = audit.chained(huge, 1, audit.GENESIS)
    assert len(audit.canonical(e)) <= audit.MAX_ENTRY_BYTES and "100000 chars" in json.dumps(e)
    many = {"kind": "decision", "what": {"decisions": [{"action_id": str(i)} for i in range(500)]}}
    e = audit.chained(many, 1, audit.GENESIS)
    assert len(audit.canonical(e)) <= audit.MAX_ENTRY_BYTES
    assert e["what"]["more_decisions"] == 500 and len(e["what"]["decisions"]) == 50


def test_an_export_since_is_a_piece_of_the_chain_and_verify_says_it_is_one(
    tmp_path: Path,
) -> None:
    """From the first entry at or after --since to the end, even one stamped earlier by a
    clock that stepped back (no hole in the piece); verify of a LOG that starts mid-chain says
    it is partial and what it did not check; the daemon's own log must start at seq 1."""
    from click.testing import CliRunner

    from deltad.core.cli import main

    log, prev = tmp_path / "audit.jsonl", audit.GENESIS
    for i, at in enumerate(["10:00", "10:05", "10:03", "10:06"], 1):  # seq 3's clock stepped back
        e = audit.chained({"kind": "decision", "at": f"2030-01-01T{at}:00+00:00"}, i, prev)
        with log.open("ab") as f:
            f.write(audit.canonical(e) + b"\n")
        prev = e["hash"]
    runner = CliRunner()
    export = runner.invoke(
        main, ["audit", "export", "--file", str(log), "--since", "2030-01-01T10:04:00+00:00"]
    )
    assert [json.loads(x)["seq"] for x in export.output.splitlines()] == [2, 3, 4]
    piece = runner.invoke(main, ["audit", "verify", "-"], input=export.output)
    assert piece.exit_code == 0, piece.output
    assert piece.output.startswith(
        "audit: ok, partial: it starts at seq 2 (an export --since): the entry before it is "
        f"not checked; 3 entries (seq 2..4), head {prev}"
    )
    # The daemon's own log (no LOG: from its state dir) must start at seq 1.
    state = tmp_path / "state"
    state.mkdir()
    (state / "audit.jsonl").write_text(export.output)
    own = runner.invoke(main, ["audit", "verify", "--state-dir", str(state)])
    assert own.exit_code == 2 and "seq 2 where 1 was expected" in own.output
    own = runner.invoke(main, ["audit", "verify", "--partial", "--state-dir", str(state)])
    assert own.exit_code == 0 and "partial: it starts at seq 2" in own.output


def _grow(path: Path, entries: int) -> None:
    for i in range(entries):
        audit.append(path, {"kind": "decision", "what": {"answer": "x" * 200}, "i": i})


def test_a_rotated_log_chains_on_across_its_files(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    _grow(path, 10)
    assert audit.rotate(path, 10**9, 0, "t") is None  # under the size: left as it is
    aside = audit.rotate(path, 1024, 0, "t1")
    assert aside == "audit.jsonl.000000000010"
    _grow(path, 10)
    assert audit.rotate(path, 1024, 0, "t2") == "audit.jsonl.000000000021"
    _grow(path, 3)
    files = [p.name for p in audit.rotated(path)]
    assert files == ["audit.jsonl.000000000010", "audit.jsonl.000000000021"]
    first = json.loads(path.read_bytes().splitlines()[0])
    assert (first["kind"], first["seq"], first["moved_aside"]) == ("log_rotated", 22, files[1])
    v = audit.verify(list(audit.chain_lines(path)))  # from seq 1, across the three files
    assert (v.entries, v.first_seq) == (25, 1)
    assert (path.stat().st_mode & 0o777) == 0o600


def test_retention_removes_the_oldest_files_and_what_is_kept_verifies_as_a_piece(
    tmp_path: Path,
) -> None:
    from click.testing import CliRunner

    from deltad.core.cli import main

    path = tmp_path / "audit.jsonl"
    for at in ("t1", "t2", "t3"):
        _grow(path, 10)
        audit.rotate(path, 1024, 2, at)
    kept = [p.name for p in audit.rotated(path)]
    assert kept == ["audit.jsonl.000000000021", "audit.jsonl.000000000032"]
    last = json.loads(path.read_bytes().splitlines()[0])
    assert last["removed"] == ["audit.jsonl.000000000010"]
    out = CliRunner().invoke(main, ["audit", "verify", "--state-dir", str(tmp_path)])
    assert out.exit_code == 0, out.output
    assert "partial: it starts at seq 11 (older files removed by keep_files)" in out.output
    # An edit in a kept file is found through the files.
    older = audit.rotated(path)[0]
    older.write_bytes(older.read_bytes().replace(b'"i":3', b'"i":4'))
    out = CliRunner().invoke(main, ["audit", "verify", "--state-dir", str(tmp_path)])
    assert out.exit_code == 2 and "edited" in out.output


def test_a_rotation_cut_short_goes_on_from_the_file_moved_aside(tmp_path: Path) -> None:
    """The daemon stopped between moving the log aside and beginning the next file: the next
    append chains on from the file moved aside, never from GENESIS (a forked chain)."""
    path = tmp_path / "audit.jsonl"
    _grow(path, 4)
    path.rename(path.with_name("audit.jsonl.000000000004"))
    entry = audit.append(path, {"kind": "decision"})
    assert entry["seq"] == 5
    assert audit.verify(list(audit.chain_lines(path))).entries == 5


def _chain(n: int) -> list[bytes]:
    out, prev = [], audit.GENESIS
    for i in range(1, n + 1):
        e = audit.chained({"kind": "decision", "i": i}, i, prev)
        out.append(audit.canonical(e) + b"\n")
        prev = e["hash"]
    return out


def _anchor(lines: list[bytes], seq: int) -> audit.Anchor:
    return audit.Anchor(f"t{seq}", seq, json.loads(lines[seq - 1])["hash"])


def test_anchors_hold_while_the_chain_is_as_anchored() -> None:
    lines = _chain(5)
    marks = [_anchor(lines, 2), _anchor(lines, 5)]
    assert audit.check_anchors(lines, marks) == audit.Anchored(2, 0)
    # A piece of the chain (an export --since, or what retention kept): older anchors unchecked.
    assert audit.check_anchors(lines[3:], marks) == audit.Anchored(1, 1)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda lines: lines[:4], "the log ends at seq 4 (entries were cut off its end)"),
        # Every hash recomputed after an edit: the chain verifies, its anchors do not.
        (
            lambda lines: [
                audit.canonical(e) + b"\n"
                for e in _rechained([json.loads(x) for x in lines], 2, {"i": 99})
            ],
            "entry seq 2 is not the one anchored then (the chain was rewritten)",
        ),
    ],
)
def test_anchors_find_a_cut_end_and_a_rewritten_chain(change: Any, says: str) -> None:
    lines = _chain(5)
    marks = [_anchor(lines, 2), _anchor(lines, 5)]
    changed = change(lines)
    audit.verify(changed)  # the chain alone still verifies
    with pytest.raises(audit.Broken, match=re.escape(says)):
        audit.check_anchors(changed, marks)


def _rechained(docs: list[dict[str, Any]], seq: int, edit: dict[str, Any]) -> list[dict[str, Any]]:
    out, prev = [], audit.GENESIS
    for d in docs:
        fields = {k: v for k, v in d.items() if k not in ("seq", "prev", "hash")}
        if d["seq"] == seq:
            fields |= edit
        e = audit.chained(fields, d["seq"], prev)
        out.append(e)
        prev = e["hash"]
    return out


@pytest.mark.spawns  # the anchor command
def test_the_daemon_anchors_the_head_to_a_file_and_a_command(tmp_path: Path) -> None:
    from deltad.core.anchoring import Anchoring
    from deltad.core.config import DaemonConfig

    filed = tmp_path / "filed.jsonl"
    config = DaemonConfig(
        state_dir=tmp_path / "state",
        audit={
            "anchor_file": tmp_path / "anchors.jsonl",
            "anchor_command": ["sh", "-c", f"cat >> {filed}"],
            "anchor_every_seconds": 60,
        },
    )
    config.state_dir.mkdir()
    log = config.state_dir / "audit.jsonl"
    anchoring = Anchoring(config)
    anchoring._anchor()  # nothing recorded yet: nothing anchored
    assert not (tmp_path / "anchors.jsonl").exists()
    _grow(log, 3)
    anchoring._anchor()
    anchoring._anchor()  # the head did not move: no second line
    _grow(log, 1)
    anchoring._anchor()
    kept = (tmp_path / "anchors.jsonl").read_bytes().splitlines()
    assert [json.loads(x)["seq"] for x in kept] == [3, 4]
    assert filed.read_bytes().splitlines() == kept
    assert ((tmp_path / "anchors.jsonl").stat().st_mode & 0o777) == 0o600
    marks = [audit.read_anchor(x, n) for n, x in enumerate(kept, 1)]
    assert audit.check_anchors(list(audit.chain_lines(log)), marks).checked == 2


@pytest.mark.parametrize(
    ("now", "next_at", "busy", "starts"),
    [(5.0, 10.0, False, False), (10.0, 10.0, False, True), (11.0, 10.0, True, False)],
)
def test_the_loop_starts_an_anchoring_on_time_one_at_a_time(
    now: float, next_at: float, busy: bool, starts: bool
) -> None:
    from deltad.core.anchoring import due

    assert due(now, next_at, busy) is starts


# -- the receipt from the deciding look -----------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "body", "kind"),
    [
        ("response.txt", "yes", "text"),
        ("response.json", json.dumps({"answer": "yes", "channel": "slack"}), "text"),
        ("response.txt", "hunter2", "password"),
        ("response.txt", "", "text"),  # empty: the look does not resume it
    ],
)
def test_the_receipt_of_the_deciding_look_is_the_one_read_afresh(
    tmp_path: Path, name: str, body: str, kind: str
) -> None:
    """The service makes a resume's receipt of the question and answer the look that decided
    it read (`Verdict.answered`), not reading them again: it must be exactly what reading
    them afresh records, the time of writing aside."""
    ws = tmp_path / "ws"
    paused_workspace(ws, "q?", input_type=kind)
    (ws / ".delta" / "interaction" / name).write_text(body)
    seen = reconcile.inspect(ws, Why.CHECK, 0.0, Policy())
    afresh = receipts.receipt(ws, seen.run_id)
    if seen.action is not Action.RESUME:
        assert seen.answered is None
        return
    assert seen.answered is not None
    from_look = receipts.receipt(ws, seen.run_id, answered=seen.answered)
    assert afresh is not None and from_look is not None
    assert {**from_look, "at": None} == {**afresh, "at": None}
    if kind == "password":
        assert "hunter2" not in json.dumps(from_look)
