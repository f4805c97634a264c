"""status.json's heartbeat (core/status.py): an unchanged status is touched, not rewritten, and
`deltad status` reads the touch as the status's time."""

from __future__ import annotations

import json
import os
from pathlib import Path

from deltad.core.status import STATUS_NAME, read_status, touch_status, write_status


def test_a_touch_moves_the_status_time_and_nothing_else(tmp_path: Path) -> None:
    write_status(tmp_path, {"pid": 1, "updated_at": "2000-01-01T00:00:00.000001Z"})
    path = tmp_path / STATUS_NAME
    before = path.read_bytes()
    os.utime(path, (631152000, 631152000))  # 1990-01-01: older than written
    assert read_status(tmp_path) == {"pid": 1, "updated_at": "2000-01-01T00:00:00.000001Z"}
    touch_status(tmp_path)  # now: later than written
    assert path.read_bytes() == before
    doc = read_status(tmp_path)
    assert doc is not None and doc["pid"] == 1
    assert doc["updated_at"] > "2000-01-01T00:00:00.000001Z"


def test_a_status_time_that_is_not_a_time_is_left_as_it_is(tmp_path: Path) -> None:
    (tmp_path / STATUS_NAME).write_text(json.dumps({"pid": 1, "updated_at": 7}))
    assert read_status(tmp_path) == {"pid": 1, "updated_at": 7}
