"""OIDC sign-in's pure pieces: a person from checked claims (deltad/inbox/oidc.py), the claim
and callback checks and the PKCE challenge (deltad/http/oidc.py), the session cookie carrying
a person, respondents naming `oidc:` people, the core making a person's identity from its own
config, and the provider's key set fetched again for an unknown key id at most so often."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from joserfc import jwt
from joserfc.jwk import RSAKey

from deltad import keys, wire
from deltad.http import mcp_gate, oidc
from deltad.http.sessions import Claims, seal, unseal
from deltad.inbox import oidc as people
from deltad.inbox.config import HttpConfig, OidcConfig
from deltad.inbox.ops import ApiError
from deltad.inbox.respondents import Answerer, may_answer
from deltad.inbox.tokens import TokenStore
from deltad.protocol.stamps import respondent_problem

ISS = "https://idp.example.org"
NOW = 1_800_000_000
KEY = b"k" * 32


def _claims(**over: Any) -> dict[str, Any]:
    return {"iss": ISS, "aud": "deltad", "sub": "u1", "exp": NOW + 300, "iat": NOW, **over}


# -- who the claims are -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("claims", "name", "also"),
    [
        ({"sub": "u1", "email": "a@x.org"}, "oidc:a@x.org", ("oidc:u1",)),
        ({"sub": "u1", "email": "a@x.org", "email_verified": True}, "oidc:a@x.org", ("oidc:u1",)),
        ({"sub": "u1", "email": "a@x.org", "email_verified": False}, "oidc:u1", ()),
        ({"sub": "u1"}, "oidc:u1", ()),
        ({"sub": "u1", "email": "a+b@x.org"}, "oidc:u1", ()),  # not a name deltad keeps
    ],
)
def test_a_person_is_named_by_email_else_by_subject(
    claims: dict[str, Any], name: str, also: tuple[str, ...]
) -> None:
    p = people.person(claims, "groups")
    assert isinstance(p, people.Person) and (p.name, p.also) == (name, also)


@pytest.mark.parametrize("sub", [None, "", "x" * 60, "a|b", 5])
def test_a_subject_deltad_cannot_name_names_nobody(sub: object) -> None:
    assert isinstance(people.person({"sub": sub}, "groups"), str)


def test_groups_from_the_claim() -> None:
    assert people.groups_of(["ops", "/org/dev", 5, "bad name", "ops"]) == ("ops", "dev")
    assert people.groups_of("ops") == ("ops",)
    assert people.groups_of(None) == ()
    assert len(people.groups_of([f"g{i}" for i in range(100)])) == people.GROUPS_MAX
    p = people.person({"sub": "u1", "roles": ["ops"]}, "roles")
    assert isinstance(p, people.Person) and p.groups == ("ops",)


def test_respondents_name_people_by_email_or_subject_and_groups_by_the_claim() -> None:
    alice = Answerer("oidc:a@x.org", ("ops",), also=("oidc:u1",))
    assert may_answer(["oidc:a@x.org"], alice)
    assert may_answer(["oidc:u1"], alice)
    assert may_answer(["group:ops"], alice)
    assert not may_answer(["group:dev", "oidc:b@x.org", "a@x.org"], alice)
    assert respondent_problem("oidc:a@x.org") is None
    assert respondent_problem("oidc:") is not None


# -- the claim checks ---------------------------------------------------------------------------
def test_claims_that_check_out() -> None:
    assert oidc.claims_refusal(_claims(), ISS, "deltad", NOW) is None
    assert oidc.claims_refusal(_claims(aud=["deltad"]), ISS, "deltad", NOW) is None
    assert oidc.claims_refusal(_claims(nonce="n"), ISS, "deltad", NOW, nonce="n") is None
    two = _claims(aud=["deltad", "api"], azp="deltad")
    assert oidc.claims_refusal(two, ISS, "deltad", NOW) is None


@pytest.mark.parametrize(
    ("claims", "nonce", "says"),
    [
        (_claims(iss="https://evil.example.org"), None, "iss"),
        (_claims(aud="someone-else"), None, "aud"),
        (_claims(aud=["someone-else"]), None, "aud"),
        (_claims(exp=NOW - 61), None, "exp"),
        ({k: v for k, v in _claims().items() if k != "exp"}, None, "exp"),
        ({k: v for k, v in _claims().items() if k != "sub"}, None, "sub"),
        (_claims(nbf=NOW + 120), None, "nbf"),
        (_claims(nonce="other"), "n", "nonce"),
        (_claims(), "n", "nonce"),
        (_claims(aud=["deltad", "api"], azp="api"), None, "azp"),
    ],
)
def test_claims_that_do_not(claims: dict[str, Any], nonce: str | None, says: str) -> None:
    why = oidc.claims_refusal(claims, ISS, "deltad", NOW, nonce)
    assert why is not None and says in why, why


# -- the callback -------------------------------------------------------------------------------
PENDING = oidc.Pending("st", "no", "ve", NOW + 600)
GOOD = {"code": "c", "state": "st"}


@pytest.mark.parametrize(
    ("pending", "params", "required", "says"),
    [
        (None, GOOD, False, "no sign-in"),
        (oidc.Pending("st", "no", "ve", NOW), GOOD, False, "no sign-in"),
        (PENDING, {**GOOD, "error": "access_denied"}, False, "refused"),
        (PENDING, {**GOOD, "state": "other"}, False, "state"),
        (PENDING, {"code": "c"}, False, "state"),
        (PENDING, {**GOOD, "iss": "https://evil.example.org"}, False, "RFC 9207"),
        (PENDING, GOOD, True, "RFC 9207"),  # the provider says it always sends iss
        (PENDING, {"state": "st"}, False, "no code"),
    ],
)
def test_a_callback_that_is_not_this_browsers(
    pending: oidc.Pending | None, params: dict[str, str], required: bool, says: str
) -> None:
    why = oidc.callback_refusal(pending, params, ISS, required, NOW)
    assert why is not None and says in why, why


def test_a_callback_that_is() -> None:
    assert oidc.callback_refusal(PENDING, GOOD, ISS, False, NOW) is None
    assert oidc.callback_refusal(PENDING, {**GOOD, "iss": ISS}, ISS, True, NOW) is None


def test_the_pkce_challenge_is_rfc_7636s() -> None:
    # RFC 7636, appendix B.
    verifier = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"
    assert oidc.challenge(verifier) == "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"


def test_the_pending_cookie_is_sealed() -> None:
    sealed = oidc.seal_pending(KEY, PENDING)
    assert oidc.unseal_pending(KEY, sealed) == PENDING
    assert oidc.unseal_pending(b"x" * 32, sealed) is None
    body, mac = sealed.split(".")
    assert oidc.unseal_pending(KEY, body[:-2] + "AA." + mac) is None
    assert oidc.unseal_pending(KEY, None) is None


# -- the session cookie -------------------------------------------------------------------------
def test_a_session_carries_a_persons_names_and_groups() -> None:
    c = Claims("oidc:a@x.org", "", NOW, NOW + 60, "sid", ("oidc:u1",), ("ops", "dev"))
    assert unseal(KEY, seal(KEY, c), NOW) == c
    token = Claims("alice", "0123456789abcdef", NOW, NOW + 60, "sid")
    cookie = seal(KEY, token)
    assert unseal(KEY, cookie, NOW) == token
    assert len(json.loads(keys.unb64(cookie.split(".")[0]))) == 5  # a token's: as before


# -- the core's identity of a person ------------------------------------------------------------
def test_the_core_gives_a_person_the_role_and_scopes_of_its_own_config() -> None:
    from deltad.privsep.monitor import identity

    class Ctx:
        config = HttpConfig.model_validate(
            {"oidc": {"issuer": ISS, "client_id": "d", "role": "reader", "workspaces": ["/srv/**"]}}
        )

    person = wire.Person(also=["oidc:u1"], groups=["ops"])
    who = identity(Ctx(), "oidc:a@x.org", person)  # type: ignore[arg-type]
    assert (who.name, who.role, who.scopes, who.groups, who.also, who.voter) == (
        "oidc:a@x.org",
        "reader",
        ("/srv/**",),
        ("ops",),
        ("oidc:u1",),
        "oidc:a@x.org",
    )
    Ctx.config = HttpConfig()
    with pytest.raises(ApiError) as e:
        identity(Ctx(), "oidc:a@x.org", person)  # type: ignore[arg-type]
    assert e.value.http == 401


# -- the provider's keys ------------------------------------------------------------------------
def test_an_unknown_key_id_fetches_the_keys_again_at_most_so_often() -> None:
    key = RSAKey.generate_key(2048, parameters={"kid": "k1"})
    fetched: list[str] = []
    published = {"keys": [key.as_dict(private=False)]}

    def answer(request: httpx.Request) -> httpx.Response:
        fetched.append(request.url.path)
        if request.url.path.endswith("openid-configuration"):
            doc = {
                "issuer": ISS,
                "authorization_endpoint": ISS + "/auth",
                "token_endpoint": ISS + "/token",
                "jwks_uri": ISS + "/jwks",
            }
            return httpx.Response(200, json=doc)
        return httpx.Response(200, json=published)

    now = [float(NOW)]
    config = OidcConfig(issuer=ISS, client_id="deltad", jwks_refetch_seconds=60)
    p = oidc.Provider(
        config, None, "http://127.0.0.1:1", httpx.Client(transport=httpx.MockTransport(answer)),
        clock=lambda: now[0],
    )  # fmt: skip
    token = jwt.encode({"alg": "RS256", "kid": "k1"}, _claims(), key)
    assert p.verify(token)["sub"] == "u1"
    assert fetched == ["/.well-known/openid-configuration", "/jwks"]
    p.verify(token)
    assert len(fetched) == 2  # cached
    stranger = RSAKey.generate_key(2048, parameters={"kid": "k2"})
    forged = jwt.encode({"alg": "RS256", "kid": "k2"}, _claims(), stranger)
    with pytest.raises(oidc.Refused):
        p.verify(forged)
    assert fetched.count("/jwks") == 1  # the keys were fetched just now: not again yet
    now[0] += 61
    for _ in range(3):
        with pytest.raises(oidc.Refused):
            p.verify(forged)
    assert fetched.count("/jwks") == 2  # one fetch for the unknown kid, not one per token
    # A rotation: the new key is published; after the pause its token checks out.
    rotated = RSAKey.generate_key(2048, parameters={"kid": "k3"})
    published["keys"].append(rotated.as_dict(private=False))
    now[0] += 61
    assert p.verify(jwt.encode({"alg": "RS256", "kid": "k3"}, _claims(), rotated))
    assert fetched.count("/jwks") == 3
    # "none" and a shared-secret algorithm never pass, whatever the key set.
    unsigned = jwt.encode({"alg": "none"}, _claims(), None, algorithms=["none"])
    with pytest.raises(oidc.Refused):
        p.verify(unsigned)


def test_the_mcp_gate_takes_the_providers_jwts_through_the_apis_check(tmp_path: Path) -> None:
    key = RSAKey.generate_key(2048, parameters={"kid": "k1"})

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("openid-configuration"):
            doc = {
                "issuer": ISS,
                "authorization_endpoint": ISS + "/auth",
                "token_endpoint": ISS + "/token",
                "jwks_uri": ISS + "/jwks",
            }
            return httpx.Response(200, json=doc)
        return httpx.Response(200, json={"keys": [key.as_dict(private=False)]})

    config = OidcConfig(issuer=ISS, client_id="deltad", role="reader", workspaces=["/srv/*"])
    client = httpx.Client(transport=httpx.MockTransport(answer))
    p = oidc.Provider(config, None, "http://127.0.0.1:1", client, clock=lambda: NOW)
    tokens = TokenStore(tmp_path)
    robot = tokens.add("robot", ["/srv/*"], "answerer")
    claims = _claims(email="a@x.org", groups=["ops"])
    good = jwt.encode({"alg": "RS256", "kid": "k1"}, claims, key)
    who = mcp_gate.identify(tokens, f"Bearer {good}", p)
    assert who == p.caller(good)  # one check: the API's
    assert (who.name, who.role, who.scopes, who.groups) == (
        "oidc:a@x.org", "reader", ("/srv/*",), ("ops",),
    )  # fmt: skip
    assert who.also == ("oidc:u1",)
    assert mcp_gate.identify(tokens, f"Bearer {robot}", p).name == "robot"  # tokens still do
    stranger = RSAKey.generate_key(2048, parameters={"kid": "k1"})
    for bad in (
        jwt.encode({"alg": "RS256", "kid": "k1"}, claims, stranger),
        jwt.encode({"alg": "RS256", "kid": "k1"}, _claims(aud="else"), key),
        jwt.encode({"alg": "RS256", "kid": "k1"}, _claims(sub="a b"), key),
    ):
        with pytest.raises(mcp_gate.Unauthorized) as e:
            mcp_gate.identify(tokens, f"Bearer {bad}", p)
        assert e.value.http == 401 and "this JWT is not accepted" in str(e.value)
    with pytest.raises(mcp_gate.Unauthorized):  # without OIDC configured, a JWT is no token
        mcp_gate.identify(tokens, f"Bearer {good}", None)


def test_the_documented_oidc_block_is_valid_and_names_every_key() -> None:
    """config/deltad.yaml's commented `http.oidc` block, uncommented, is a valid config."""
    import itertools
    from pathlib import Path

    import yaml

    text = (Path(__file__).resolve().parents[2] / "config" / "deltad.yaml").read_text()
    lines = text[text.index("#   oidc:") :].splitlines()
    block = [lines[0], *itertools.takewhile(lambda x: x.startswith("#     "), lines[1:])]
    doc = yaml.safe_load("\n".join(x.removeprefix("#   ") for x in block))
    OidcConfig.model_validate(doc["oidc"])
    assert set(doc["oidc"]) == set(OidcConfig.model_fields)


def test_the_sign_in_routes_take_no_credential_from_their_headers() -> None:
    from deltad.http.limits import rule_for

    for path in ("/v1/oidc/login", "/v1/oidc/callback"):
        assert rule_for("GET", path).credential == "none"
    assert rule_for("POST", "/v1/oidc/callback").credential == "token"  # GET only
    assert not oidc.looks_like_jwt("dlt_abc.def.ghi") and oidc.looks_like_jwt("eyJa.b.c")
