"""A person signed in through an OpenID provider (`http.oidc`), as deltad names them: pure.

The provider's claims (an ID token's at the page's sign-in, a bearer JWT's at the API), once
the inbox process has checked them (deltad/http/oidc.py), become a `Person`: their name
`oidc:<email>` (when the provider gives an email it does not call unverified) else
`oidc:<sub>`, `oidc:<sub>` as another name they answer to, and their groups from the
configured claim. The core makes the `Identity` (role, scopes) from its own configuration,
never from what the inbox says: only the name and groups travel.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from deltad.inbox.config import OidcConfig
from deltad.inbox.tokens import Identity
from deltad.protocol.stamps import RESPONDENT_NAME

PREFIX = "oidc:"  # never a token's name: those have no colon (tokens.NAME)
NAME_MAX = 64  # a name crosses the privsep wire as a token's name does (ops.Name)
GROUP = re.compile(RESPONDENT_NAME)  # a group deltad can name as `group:NAME`
GROUPS_MAX = 32  # groups kept of one person (they travel in the session cookie)
# A sub or email as a name: what a respondent may name, within the wire's 64 with `oidc:`.
TEXT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,58}")


@dataclass(frozen=True)
class Person:
    name: str
    also: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()


def person(claims: Mapping[str, Any], groups_claim: str) -> Person | str:
    """Who the claims are, or why they name nobody deltad can name."""
    sub = claims.get("sub")
    if not isinstance(sub, str) or not TEXT.fullmatch(sub):
        return (
            "its sub is missing, or not a name deltad keeps (letters, digits, . _ @ -; 59 at most)"
        )
    by_sub = PREFIX + sub
    email = claims.get("email")
    use_email = (
        isinstance(email, str)
        and TEXT.fullmatch(email)
        and claims.get("email_verified") is not False
    )
    name = PREFIX + email if use_email and isinstance(email, str) else by_sub
    return Person(name, (by_sub,) if name != by_sub else (), groups_of(claims.get(groups_claim)))


def groups_of(value: object) -> tuple[str, ...]:
    """The groups a claim lists (a list of strings, or one string), those deltad can name,
    at most GROUPS_MAX; a Keycloak-style path (`/org/ops`) counts by its last part."""
    listed = [value] if isinstance(value, str) else value if isinstance(value, list) else []
    out: list[str] = []
    for g in listed:
        if not isinstance(g, str):
            continue
        for name in (g.rsplit("/", 1)[-1],) if "/" in g else (g,):
            if GROUP.fullmatch(name) and name not in out:
                out.append(name)
    return tuple(out[:GROUPS_MAX])


def identity(p: Person, config: OidcConfig) -> Identity:
    """The person as a caller: role and scopes from the configuration."""
    return Identity(
        p.name, config.role, tuple(config.workspaces), p.groups, person=p.name, also=p.also
    )


def is_person(name: str) -> bool:
    return name.startswith(PREFIX)
