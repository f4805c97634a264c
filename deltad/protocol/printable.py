"""Names are bytes: one way to show a string that came from a file or a file name.

A Linux file name is any bytes but `/` and NUL; Python hands them over as `str` with each
byte that is not UTF-8 turned into a lone surrogate (U+DC80..U+DCFF, "surrogateescape"). Such
a string cannot be encoded as UTF-8 (a status file, an HTTP answer and a terminal all crash on
it), and a prompt or request id with a newline or ESC in it can print a line of its choosing.

`show` escapes, reversibly, so two different names never look the same:
    \\  a backslash              \\n \\r \\t  those controls
    \\xNN  a byte that is not UTF-8 (NN >= 80), or another control below U+0080
    \\uNNNN  a control or line separator at or above U+0080, a bidi override, a lone surrogate
Everything else (any printable text, non-ASCII included) is shown as it is. `unshow` is the
inverse, for a name that comes back (e.g. an API query naming a workspace).
"""

from __future__ import annotations

import os
import re
import shlex
from typing import Any

_NAMED = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
# Besides controls and lone surrogates: what reorders or splits the line a terminal shows (line
# and paragraph separators, bidi marks, embeddings, overrides and isolates).
_NEEDS = re.compile(r"[\\\x00-\x1f\x7f-\x9f\u2028-\u202e\u2066-\u2069\u200e\u200f\ud800-\udfff]")
_ESCAPE = re.compile(r"\\(?:x([0-9a-f]{2})|u([0-9a-f]{4})|(.|$))", re.DOTALL)
_UNNAMED = {"\\": "\\", "n": "\n", "r": "\r", "t": "\t"}
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def _escape(c: str) -> str:
    o = ord(c)
    if c in _NAMED:
        return _NAMED[c]
    if 0xDC80 <= o <= 0xDCFF:
        return f"\\x{o - 0xDC00:02x}"  # the byte surrogateescape stood in for
    if o < 0x80:
        return f"\\x{o:02x}"
    return f"\\u{o:04x}"  # C1 controls, separators, bidi, other lone surrogates


def show(text: str) -> str:
    """`text` safe for a terminal, a log line or UTF-8 JSON, and distinct for distinct input."""
    if not _NEEDS.search(text):
        return text  # the common case, without building a new string
    return _NEEDS.sub(lambda m: _escape(m.group()), text)


def show_path(path: str | os.PathLike[str] | bytes) -> str:
    """A path (or file name) as `show` renders it; bytes are taken as the file system has them."""
    return show(os.fsdecode(path))


def shell_quote(text: str) -> str:
    """`text` for a command a person pastes: `shlex.quote`, or bash's `$'...'` (which reads
    `show`'s escapes back) when it holds a byte or character a terminal must not be given."""
    shown = show(text)
    if shown == text:
        return shlex.quote(text)
    return "$'" + shown.replace("'", "\\'") + "'"


def unshow(shown: str) -> str:
    """The string `show` was given (for a path: the surrogateescape `str`, as os.fsdecode)."""

    def one(m: re.Match[str]) -> str:
        byte, code, other = m.groups()
        if byte is not None:
            n = int(byte, 16)
            return chr(0xDC00 + n) if n >= 0x80 else chr(n)
        if code is not None:
            return chr(int(code, 16))
        if other in _UNNAMED:
            return _UNNAMED[other]
        raise ValueError(f"not an escape: \\{other!r}")

    return _ESCAPE.sub(one, shown)


def json_safe(value: Any) -> Any:
    """`value` with every string that UTF-8 cannot encode (a lone surrogate) shown: for JSON
    written as UTF-8, which would otherwise fail on the first undecodable file name."""
    if isinstance(value, str):
        return show(value) if _SURROGATE.search(value) else value
    if isinstance(value, dict):
        return {json_safe(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value
