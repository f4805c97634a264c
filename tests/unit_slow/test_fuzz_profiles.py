"""The fuzz tests draw the same cases in CI and fresh ones only when asked (tests/fuzz/)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHOW = (
    "from tests.fuzz import fuzz_settings; from hypothesis import settings; "
    "print(settings.default.derandomize, settings.default.database, fuzz_settings(10).max_examples)"
)


def _profile(env: dict[str, str]) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in ("CI", "HYPOTHESIS_PROFILE")}
    done = subprocess.run(
        [sys.executable, "-c", SHOW],
        cwd=ROOT,
        env=clean | env,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


@pytest.mark.parametrize(
    ("env", "shown"),
    [
        ({"CI": "true"}, "True None 10"),  # CI: a fixed draw, no example database
        ({"CI": "true", "HYPOTHESIS_PROFILE": "fuzz"}, "False"),  # on purpose: fresh seeds
    ],
)
def test_ci_fuzzes_the_same_cases_and_the_fuzz_profile_fresh_ones(
    env: dict[str, str], shown: str
) -> None:
    assert _profile(env).startswith(shown)


def test_the_fuzz_profile_fuzzes_longer() -> None:
    assert _profile({"HYPOTHESIS_PROFILE": "fuzz"}).endswith(" 250")
