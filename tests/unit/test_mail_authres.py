"""Authentication-Results (RFC 8601) as the email channel reads it (deltad/outbound/authres.py):
the header's syntax from a table, and which reply's From it authenticates."""

from __future__ import annotations

import pytest

from deltad.outbound import authres
from deltad.outbound.authres import Result

MX = "mx.example.test"


@pytest.mark.parametrize(
    ("value", "authserv_id", "results"),
    [
        (
            "mx.example.test; dkim=pass header.d=people.example.test header.s=sel",
            MX,
            [Result("dkim", "pass", {"header.d": "people.example.test", "header.s": "sel"})],
        ),
        (  # several results, case-insensitive method and result, a version after the id
            'MX.Example.Test 1; SPF=Pass smtp.mailfrom=a@b.test; DKIM=FAIL reason="bad sig"'
            " header.d=b.test; dmarc=pass (p=reject dis=none) header.from=b.test",
            MX,
            [
                Result("spf", "pass", {"smtp.mailfrom": "a@b.test"}),
                Result("dkim", "fail", {"reason": "bad sig", "header.d": "b.test"}),
                Result("dmarc", "pass", {"header.from": "b.test"}),
            ],
        ),
        (  # comments anywhere, nested and with a ';' and a '=' inside; a quoted value
            "mx.example.test (mta (v1; x=y)); dkim=pass (2048-bit key; unprotected)"
            ' header.d="people.example.test" header.b=AbCd',
            MX,
            [Result("dkim", "pass", {"header.d": "people.example.test", "header.b": "AbCd"})],
        ),
        ("mx.example.test; none", MX, []),  # nothing was checked
        (
            "mx.example.test; dkim = pass header.d = x.test",
            MX,
            [  # CFWS around '='
                Result("dkim", "pass", {"header.d": "x.test"})
            ],
        ),
        (
            "mx.example.test; dkim/1=pass header.d=x.test",
            MX,
            [  # a method's version dropped
                Result("dkim", "pass", {"header.d": "x.test"})
            ],
        ),
        # A result that cannot be read is left out, never read as a pass.
        (
            "mx.example.test; dkim=pass header.d; dmarc=fail header.from=x.test",
            MX,
            [Result("dmarc", "fail", {"header.from": "x.test"})],
        ),
        ("mx.example.test; dkim=pass junk=x", MX, []),  # a property without ptype.property
        ("mx.example.test; dkim=pass header.d=x.test (open", None, None),  # an open comment
        ('mx.example.test; dkim=pass header.d="x.test', None, None),  # an open quote
        ("; dkim=pass", None, None),  # no authserv-id
        ("", None, None),
    ],
)
def test_the_header_is_read_as_rfc_8601_writes_it(
    value: str, authserv_id: str | None, results: list[Result] | None
) -> None:
    got = authres.parse(value)
    if authserv_id is None:
        assert got is None
    else:
        assert got is not None and got.authserv_id == authserv_id and got.results == results


OURS_PASS = f"{MX}; dkim=pass header.d=people.example.test"


@pytest.mark.parametrize(
    ("headers", "sender", "ok", "shown"),
    [
        ([OURS_PASS], "alice@people.example.test", True, "dkim=pass header.d=people.example.test"),
        # Relaxed alignment: the From in a subdomain of the signer; never the other way round.
        ([OURS_PASS], "a@eu.people.example.test", True, "dkim=pass header.d=people.example.test"),
        (
            [f"{MX}; dkim=pass header.d=eu.people.example.test"],
            "a@people.example.test",
            False,
            "dkim=pass header.d=eu.people.example.test",
        ),
        # Signed by another domain (the forger's own), or by one that only ends the same way.
        (
            [f"{MX}; dkim=pass header.d=evil.test"],
            "alice@people.example.test",
            False,
            "dkim=pass header.d=evil.test",
        ),
        (
            [f"{MX}; dkim=pass header.d=example.test"],
            "a@badexample.test",
            False,
            "dkim=pass header.d=example.test",
        ),
        ([f"{MX}; dkim=pass header.d=test"], "a@x.test", False, "dkim=pass header.d=test"),
        (
            [f"{MX}; dkim=fail header.d=people.example.test"],
            "alice@people.example.test",
            False,
            "dkim=fail header.d=people.example.test",
        ),
        ([f"{MX}; dkim=pass"], "alice@people.example.test", False, "dkim=pass"),
        # An aligned DMARC pass, and one about another From domain.
        (
            [f"{MX}; spf=pass smtp.mailfrom=x.test; dmarc=pass header.from=people.example.test"],
            "alice@people.example.test",
            True,
            "dmarc=pass header.from=people.example.test",
        ),
        (
            [f"{MX}; dmarc=pass header.from=evil.test"],
            "alice@people.example.test",
            False,
            "dmarc=pass header.from=evil.test",
        ),
        ([f"{MX}; dmarc=pass"], "alice@people.example.test", False, "dmarc=pass"),
        # SPF alone authenticates no From.
        (
            [f"{MX}; spf=pass smtp.mailfrom=people.example.test"],
            "alice@people.example.test",
            False,
            "no DKIM or DMARC result",
        ),
        # Only the topmost header of the configured id counts: a forged pass further down (the
        # sender's own) is not read, nor one by another id.
        ([f"{MX}; dkim=none", OURS_PASS], "alice@people.example.test", False, "dkim=none"),
        (
            ["other.test; dkim=pass header.d=people.example.test", f"{MX}; none", OURS_PASS],
            "alice@people.example.test",
            False,
            "no DKIM or DMARC result",
        ),
        (
            ["other.test; dkim=pass header.d=people.example.test"],
            "alice@people.example.test",
            False,
            f"no Authentication-Results by {MX}",
        ),
        (
            ["MX.EXAMPLE.TEST; dkim=PASS header.d=People.Example.Test"],
            "alice@people.example.test",
            True,
            "dkim=pass header.d=People.Example.Test",
        ),
        ([], "alice@people.example.test", False, f"no Authentication-Results by {MX}"),
        ([OURS_PASS], "", False, "dkim=pass header.d=people.example.test"),
    ],
)
def test_only_the_trusted_mtas_aligned_pass_authenticates_the_from(
    headers: list[str], sender: str, ok: bool, shown: str
) -> None:
    got = authres.verdict(headers, MX, sender)
    assert (got.ok, got.shown) == (ok, shown)
