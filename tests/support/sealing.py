"""The daemon's signing key in a test process that plays the core (protocol/seal.py): the
answering path seals with it, and the engine run in the same process trusts it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from deltad.inbox import answering
from deltad.inbox.sealing import Sealer
from deltad.protocol import seal

KEY = Sealer.of(Ed25519PrivateKey.generate())  # one per test process: generated once


@pytest.fixture(autouse=True)
def decision_key(monkeypatch: pytest.MonkeyPatch) -> Iterator[Sealer]:
    monkeypatch.setattr(answering, "sealer", KEY)
    monkeypatch.setenv(seal.ENV, KEY.public_text)
    yield KEY
