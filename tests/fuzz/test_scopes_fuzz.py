"""The workspace glob matcher (deltad/inbox/scopes.py) against the regex translation it replaced,
on inputs small enough for a regex (the tables and the adversarial patterns are in
tests/unit/test_scopes.py)."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from deltad.inbox import scopes
from tests.fuzz import fuzz_settings


def _old_regex(glob: str) -> re.Pattern[str]:
    """The translation the matcher replaced: right, but exponential on runs of `**`."""
    out = []
    i = 0
    while i < len(glob):
        if glob.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        out.append({"*": "[^/]*", "?": "[^/]"}.get(glob[i], re.escape(glob[i])))
        i += 1
    return re.compile("".join(out) + "(?:/.*)?", re.DOTALL)


def _reference(glob: str, path: str) -> bool:
    if glob in ("/", scopes.ALL):
        return True
    return _old_regex(glob.rstrip("/") or "/").fullmatch(path) is not None


@fuzz_settings(600)
@given(
    glob=st.text(alphabet="/ab*?\udcff", min_size=1, max_size=9).map(lambda s: "/" + s),
    path=st.text(alphabet="/ab\udcff", max_size=10).map(lambda s: "/" + s),
)
def test_the_matcher_agrees_with_the_regex_it_replaced(glob: str, path: str) -> None:
    assert scopes.matches(glob, path) is _reference(glob, path)
