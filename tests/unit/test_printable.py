"""Names are bytes: the one escape every terminal line, log line and status file uses."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
from itertools import combinations

import pytest
import structlog

from deltad import logs
from deltad.protocol.printable import json_safe, shell_quote, show, show_path, unshow

pytestmark = pytest.mark.spawns  # bash pastes the quoted bytes back

NAMES: list[tuple[bytes, str]] = [
    (b"plain", "plain"),
    ("caf\u00e9 \u6f22".encode(), "caf\u00e9 \u6f22"),  # printable non-ASCII stays as it is
    (b"y\xfd", "y\\xfd"),  # a byte that is not UTF-8
    (b"y\xfe", "y\\xfe"),
    (b"y\\xfd", "y\\\\xfd"),  # the same four characters, literally: a backslash is doubled
    (b"a\nb", "a\\nb"),
    (b"a\rb\tc", "a\\rb\\tc"),
    (b"\x1b[2J", "\\x1b[2J"),
    (b"\x7f", "\\x7f"),
    ("\u0085".encode(), "\\u0085"),  # C1 NEL, the character, apart from the byte \x85
    (b"\x85", "\\x85"),
    ("\u202e".encode(), "\\u202e"),  # a bidi override
    ("\u2028".encode(), "\\u2028"),  # a line separator
    (b"\xc3", "\\xc3"),  # half a character
    (b"a'b", "a'b"),
]


@pytest.mark.parametrize(("raw", "shown"), NAMES)
def test_a_name_is_shown_escaped_and_comes_back(raw: bytes, shown: str) -> None:
    assert show_path(raw) == shown == show(os.fsdecode(raw))
    assert os.fsencode(unshow(shown)) == raw
    shown.encode("utf-8")  # always encodable: a status file, an HTTP answer, a terminal


def test_distinct_names_stay_distinct() -> None:
    for (a, _), (b, _) in combinations(NAMES, 2):
        assert show_path(a) != show_path(b)


def test_every_single_byte_round_trips() -> None:
    for n in range(1, 256):
        raw = bytes([n])
        assert os.fsencode(unshow(show_path(raw))) == raw


@pytest.mark.parametrize("bad", ["\\q", "\\x1", "a\\"])
def test_unshow_refuses_what_show_never_writes(bad: str) -> None:
    with pytest.raises(ValueError):
        unshow(bad)


@pytest.mark.parametrize("raw", [b"ok", b"it's", b"y\xfd", b"a\nb", b"a'\x1b"])
def test_shell_quote_pastes_back_as_the_same_bytes(raw: bytes) -> None:
    quoted = shell_quote(os.fsdecode(raw))
    out = subprocess.run(["bash", "-c", f"printf %s {quoted}"], capture_output=True, check=True)
    assert out.stdout == raw


def test_json_safe_shows_only_what_utf8_cannot_encode() -> None:
    doc = {"ws": os.fsdecode(b"/r/y\xfd"), "n": [1, "a\nb"], "k": None}
    assert json_safe(doc) == {"ws": "/r/y\\xfd", "n": [1, "a\nb"], "k": None}


@pytest.mark.parametrize("fmt", ["json", "console"])
def test_log_lines_show_names_and_never_crash(fmt: logs.Format) -> None:
    stream = io.StringIO()
    try:
        logs.configure("info", fmt, stream)
        structlog.get_logger("t").info(
            "seen", workspace=os.fsdecode(b"/r/y\xfd"), error=os.fsdecode(b"x\xfe\ny")
        )
    finally:
        logging.getLogger().handlers.clear()
        structlog.reset_defaults()
    line = stream.getvalue()
    assert line.count("\n") == 1, line  # one line: no control character got through
    if fmt == "json":
        doc = json.loads(line)
        assert (doc["workspace"], doc["error"]) == ("/r/y\\xfd", "x\\xfe\\ny")
    else:
        assert "/r/y\\xfd" in line and "x\\xfe\\ny" in line
