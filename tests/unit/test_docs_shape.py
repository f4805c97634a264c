"""The docs stay readable: the README is a front page (what it is, setup, run, test, where to
read on), and no page logs dated measurements (they belong in bench/results/, with the
command that reproduces them; a page keeps the current figure, its goal and that command)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README_MAX = 15 * 1024
# What a measuring occasion looks like in prose: a load average, a session, a dated run.
LOGGED = re.compile(
    r"load average|\bload of \d|\b(this|last|earlier|previous|first|second|third) session\b|"
    r"\b(measured|run|runs) (on|of) 20\d\d-\d\d-\d\d"
)


def test_the_readme_is_a_front_page() -> None:
    text = (REPO / "README.md").read_text()
    assert len(text.encode()) <= README_MAX, f"README.md is over {README_MAX // 1024} KB"
    for heading in ("## Setup", "## Run", "## Test"):
        assert heading in text


def test_no_page_logs_a_dated_measurement() -> None:
    found = [
        f"{page.relative_to(REPO)}:{n}: {line.strip()[:100]}"
        for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
        for n, line in enumerate(page.read_text().splitlines(), 1)
        if LOGGED.search(line)
    ]
    assert not found, "move these to bench/results/*.md:\n" + "\n".join(found)


def test_the_check_sees_a_logged_measurement() -> None:
    assert LOGGED.search("measured at a load average of 4") and LOGGED.search("the third session")
    assert not LOGGED.search("READY in 5.7 s warm (`bench/daemon_bench.py`)")
