"""The job-handle seam's request key: deterministic, distinct, safe as an engine-side name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from deltad.executors.seam import RequestKey

DNS_1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def test_the_same_resume_always_gets_the_same_name() -> None:
    a = RequestKey(Path("/srv/ws/alice/a"), "20261124_010203_abcdef", "r1", 0)
    b = RequestKey(Path("/srv/ws/alice/a"), "20261124_010203_abcdef", "r1", 0)
    assert a.name == b.name and a == b


@pytest.mark.parametrize(
    "other",
    [
        RequestKey(Path("/srv/ws/alice/b"), "run", "r1", 0),
        RequestKey(Path("/srv/ws/alice/a"), "run2", "r1", 0),
        RequestKey(Path("/srv/ws/alice/a"), "run", "r2", 0),
        RequestKey(Path("/srv/ws/alice/a"), "run", "r1", 1),
        # Parts are length-prefixed: moving a character between them is another key.
        RequestKey(Path("/srv/ws/alice/arun"), "", "r1", 0),
        RequestKey(Path("/srv/ws/alice/a\udcfd"), "run", "r1", 0),
    ],
)
def test_another_resume_never_gets_the_same_name(other: RequestKey) -> None:
    assert RequestKey(Path("/srv/ws/alice/a"), "run", "r1", 0).name != other.name


def test_a_name_is_a_valid_kubernetes_and_slurm_name() -> None:
    key = RequestKey(Path("/srv/ws/y\udcfd"), "run", "r\n1", 7)
    assert DNS_1123.match(key.name) and len(key.name) <= 63
    assert len(key.workspace_tag) == 16
