"""docs/log-events.md lists exactly the events the code emits, each with its meaning: an event
added, renamed or removed in deltad/ fails here with the command that rewrites the page
(`python -m deltad.logcatalog`). Names are compared, not the level, logger or module columns,
which the command regenerates (a module moved changes no name). It parses the whole package
(~0.5 s), hence the slow part of the unit layer."""

from __future__ import annotations

import pytest

from deltad import logcatalog


def test_the_catalog_lists_every_event_the_code_emits_and_no_other() -> None:
    emits = logcatalog.emitted()
    page = logcatalog.read_page(logcatalog.PAGE.read_text(encoding="utf-8"))
    found = logcatalog.drift(emits, page)
    if found:
        pytest.fail(found.explain(), pytrace=False)
    assert len(page) > 100  # the page was read, not found empty
