"""The slow part of the unit layer (marker `slowunit`): in-process like tests/unit, but each
test here costs seconds: memory budgets over thousands of entries, the benchmark's tree
builder, the unit layer again in a subprocess without Linux, scale tests, and the HTTP
contract checked route by route against the OpenAPI document. `pytest tests/unit` leaves them
out; CI runs them (`.ci/run`: the whole suite, and this layer without Linux too)."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = __file__.rpartition("/")[0] + "/"
    for item in items:
        if str(item.path).startswith(here):
            item.add_marker(pytest.mark.slowunit)


from tests.support.sealing import decision_key  # noqa: E402,F401  (autouse: the core's key)
