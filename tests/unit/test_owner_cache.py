"""Owner lookups (deltad/core/tenancy.py): a read of each of 100,000 workspaces asked
/etc/passwd and /etc/group for its owner; now a lookup is kept a few seconds, no longer
(accounts and group memberships change)."""

from __future__ import annotations

import os
import pwd

import pytest

from deltad.core import tenancy
from deltad.core.tenancy import OwnerCache


@pytest.fixture
def lookups(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The uids asked of the account database."""
    asked: list[int] = []
    real = pwd.getpwuid

    def getpwuid(uid: int) -> pwd.struct_passwd:
        asked.append(uid)
        return real(uid)

    monkeypatch.setattr(tenancy.pwd, "getpwuid", getpwuid)
    return asked


@pytest.mark.parametrize(
    ("at", "asked"),
    [
        ((0.0, 0.0), 1),
        ((0.0, 9.9), 1),  # within the ttl: kept
        ((0.0, 10.0), 2),  # the ttl over: asked again
        ((0.0, 5.0, 10.0, 15.0), 2),  # a hit does not extend it
    ],
)
def test_an_owner_is_asked_once_per_ttl(
    lookups: list[int], at: tuple[float, ...], asked: int
) -> None:
    cache = OwnerCache(ttl=10.0)
    uid = os.geteuid()
    owners = {cache.get(uid, now=t) for t in at}
    assert owners == {tenancy.owner_of(uid)}
    assert len(lookups) == asked + 1  # the line above asked once more


def test_many_owners_start_the_cache_over(lookups: list[int]) -> None:
    cache = OwnerCache(ttl=10.0, size=2)
    for uid in (0, 1, 2, 0):  # 2 fills it: 0 is asked again
        cache.get(uid, now=0.0)
    assert lookups == [0, 1, 2, 0]


def test_a_uid_with_no_account_is_named_by_its_number() -> None:
    uid = 2**31 - 7
    assert OwnerCache().get(uid).name == f"uid {uid}"
