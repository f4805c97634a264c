"""The Authentication-Results header (RFC 8601) an MTA adds to a mail it received, and whether
it authenticates a reply's From: pure functions of text.

A header reads `authserv-id [version]; method=result [reason=...] ptype.property=value ...;
method=result ...` (or `authserv-id; none`), with comments in parentheses and quoted values
anywhere. Only the header of the configured, trusted MTA counts: the first one (the topmost:
an MTA prepends its own) whose authserv-id is the configured one. Headers a sender wrote are
below the MTA's own; that the MTA always adds one is the operator's part (docs/inbox.md,
"Email": a milter whose failure defers the mail, e.g. Postfix's `milter_default_action =
tempfail`), as RFC 8601 section 5 asks it to remove any with its own id it did not write.

A reply is authenticated by an aligned DMARC pass (its header.from the From domain) or a DKIM
pass whose signing domain (header.d) is the From domain or a parent of it (relaxed alignment
within what needs no public suffix list: a domain without a dot is never a signer here).
"""

from __future__ import annotations

from dataclasses import dataclass, field

SHOWN_MAX = 200  # characters of the verdict kept in a receipt


@dataclass(frozen=True)
class Result:
    method: str  # lower case, its version dropped ("dkim", "spf", "dmarc")
    result: str  # lower case ("pass", "fail", "none", ...)
    props: dict[str, str] = field(default_factory=dict)  # "header.d" -> value (keys lower case)

    def shown(self) -> str:
        keep = {"dkim": ("header.d",), "dmarc": ("header.from",), "spf": ("smtp.mailfrom",)}
        props = [f"{k}={self.props[k]}" for k in keep.get(self.method, ()) if k in self.props]
        return " ".join([f"{self.method}={self.result}", *props])


@dataclass(frozen=True)
class Header:
    authserv_id: str  # lower case
    results: list[Result]


@dataclass(frozen=True)
class Verdict:
    ok: bool
    shown: str  # what was found, for the log and the receipt ("dkim=pass header.d=x.test")


def _tokens(value: str) -> list[str] | None:
    """Words, quoted strings (kept with a leading '"'), ';' and '=', comments dropped; None
    when a quote or a comment is left open."""
    out: list[str] = []
    word: list[str] = []
    i, n = 0, len(value)

    def flush() -> None:
        if word:
            out.append("".join(word))
            word.clear()

    while i < n:
        c = value[i]
        if c == "(":  # a comment, nested, with quoted-pairs
            flush()
            depth = 0
            while i < n:
                c = value[i]
                if c == "\\":
                    i += 1
                elif c == "(":
                    depth += 1
                elif c == ")":
                    depth -= 1
                    if depth == 0:
                        break
                i += 1
            if depth != 0:
                return None
        elif c == '"':
            flush()
            quoted = ['"']
            i += 1
            while i < n and value[i] != '"':
                if value[i] == "\\" and i + 1 < n:
                    i += 1
                quoted.append(value[i])
                i += 1
            if i >= n:
                return None
            out.append("".join(quoted))
        elif c in ";=":
            flush()
            out.append(c)
        elif c.isspace():
            flush()
        else:
            word.append(c)
        i += 1
    flush()
    return out


def _plain(token: str) -> str:
    return token[1:] if token.startswith('"') else token


def parse(value: str) -> Header | None:
    """One Authentication-Results header's value; None when it has no authserv-id. A result
    that cannot be read is left out (never read as a pass)."""
    tokens = _tokens(value)
    if not tokens or tokens[0] in (";", "="):
        return None
    groups: list[list[str]] = [[]]
    for t in tokens:
        if t == ";":
            groups.append([])
        else:
            groups[-1].append(t)
    head = groups[0]
    if not 1 <= len(head) <= 2 or "=" in head:  # authserv-id [version]
        return None
    results = []
    for group in groups[1:]:
        if (
            len(group) < 3
            or len(group) % 3
            or any(group[k] != "=" for k in range(1, len(group), 3))
        ):
            continue  # "none", or not method=result [key=value ...]
        method, result = group[0].partition("/")[0].lower(), _plain(group[2]).lower()
        if method.startswith('"') or not method:
            continue
        props = {}
        for k in range(3, len(group), 3):
            key = group[k].lower()
            if (key != "reason" and "." not in key) or key.startswith('"'):
                break
            props[key] = _plain(group[k + 2])
        else:
            results.append(Result(method, result, props))
    return Header(_plain(head[0]).lower(), results)


def ours(values: list[str], authserv_id: str) -> Header | None:
    """The first (topmost) header whose authserv-id is `authserv_id`, or None."""
    for v in values:
        h = parse(v)
        if h is not None and h.authserv_id == authserv_id.lower():
            return h
    return None


def aligned(from_domain: str, signer: str) -> bool:
    """`signer` (a DKIM header.d) is the From domain or a parent domain of it."""
    d, s = from_domain.lower().rstrip("."), signer.lower().strip().rstrip(".")
    return "." in s and (d == s or d.endswith("." + s))


def verdict(values: list[str], authserv_id: str, sender: str) -> Verdict:
    """Whether the configured MTA's header authenticates `sender` (the From address)."""
    header = ours(values, authserv_id)
    if header is None:
        return Verdict(False, f"no Authentication-Results by {authserv_id}")
    domain = sender.rpartition("@")[2].lower()
    for r in header.results:  # DMARC first: it names the From domain it checked
        signed_from = r.props.get("header.from", "").lower().rstrip(".")
        if r.method == "dmarc" and r.result == "pass" and domain and signed_from == domain:
            return Verdict(True, r.shown()[:SHOWN_MAX])
    for r in header.results:
        if (
            r.method == "dkim"
            and r.result == "pass"
            and aligned(domain, r.props.get("header.d", ""))
        ):
            return Verdict(True, r.shown()[:SHOWN_MAX])
    found = [r.shown() for r in header.results if r.method in ("dkim", "dmarc")]
    return Verdict(False, ("; ".join(found) or "no DKIM or DMARC result")[:SHOWN_MAX])
