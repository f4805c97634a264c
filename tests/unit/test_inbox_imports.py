"""The inbox process's import set is an allowlist: what runs as the inbox's user loads the
contract it shares with the core (the operation table and its input models, the wire, the
schemas, the tokens it reads) and its own serving code, never the core's (`deltad.core`), the
executors, or the answering code that reads and writes workspaces. The privilege boundary is
then a property of the code, checked here, not a convention."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import deltad
from tests.support.beside import Beside

ENTRY = "deltad.http.child"  # `python -m deltad.http` and `deltad inbox` run its `main`
# Loaded by name on the first request to the MCP path (deltad/http/app.py, `LazyMcp`).
BY_NAME = ("deltad.http.mcp_adapter",)

ALLOWED = {
    "deltad",
    "deltad.health",
    "deltad.keys",  # the session and link keys' signing (a leaf module)
    "deltad.logs",
    "deltad.metrics",  # the HTTP layer's own registry (requests by route and code)
    "deltad.pacing",
    "deltad.platform",
    "deltad.tracing",  # the traceparent an HTTP request carries to its calls (no SDK: a leaf)
    # the shared contract: the operation table, the answer body, the documents, the wire
    "deltad.inbox",  # the package itself: its answering names load on first use only
    "deltad.inbox.answer_body",
    "deltad.inbox.config",
    "deltad.inbox.context",
    "deltad.inbox.feed",  # the replica feed the event stream is served from
    "deltad.inbox.feedlog",
    "deltad.inbox.idempotency",
    "deltad.inbox.links",  # its key file's name (the sessions' key sits beside it)
    "deltad.inbox.oidc",  # an OIDC person's name and groups from checked claims (pure)
    "deltad.inbox.ops",
    "deltad.inbox.paging",
    "deltad.inbox.schemas",
    "deltad.inbox.scopes",
    "deltad.inbox.tokens",
    "deltad.privsep",
    "deltad.outbound.handoff",
    "deltad.wire",
    # the deliveries this process makes, and the mail it reads
    "deltad.outbound",
    "deltad.outbound.config",
    "deltad.outbound.courier",
    "deltad.outbound.mail",
    "deltad.outbound.maildir",
    "deltad.outbound.notify",
    "deltad.outbound.outbox",
    "deltad.outbound.senders",
    "deltad.outbound.botauth",  # Teams: the Bot Connector's keys, fetched; its JWTs checked
    "deltad.outbound.webhooks",
}
ALLOWED_PACKAGES = ("deltad.protocol", "deltad.http")  # every module of these
# Named apart so a failure says what crossed: the root core, the executors, the answering code.
NEVER = ("deltad.core", "deltad.executors", "deltad.agent", "deltad.engine")
NEVER_INBOX = {
    "answering",
    "ballots",
    "bulk",
    "delegation",
    "handlers",
    "handover",
    "history",
    "outcome",
    "quorum",
    "respondents",
    "trust",
    "views",
}


def imported_by(module: str) -> set[str]:
    """Every deltad module `module`'s file imports, at its top or inside a function (what the
    process loads when it serves: the web stack, the Maildir reader, the senders)."""
    path = Path(deltad.__file__).parent.parent / (module.replace(".", "/") + ".py")
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
    return {n for n in names if n.startswith("deltad.")}


def loading(modules: list[str]) -> Beside:
    """A fresh interpreter that imports `modules` and prints the deltad modules it then holds."""
    code = (
        "import importlib, json, sys\n"
        f"for m in {modules!r}:\n"
        "    try:\n"
        "        importlib.import_module(m)\n"
        "    except ModuleNotFoundError:\n"
        "        pass  # `from package import name`: a name, not a module\n"
        "print(json.dumps(sorted(n for n in sys.modules if n.startswith('deltad'))))\n"
    )
    return Beside(code)


# ~2 s of a fresh interpreter (the web stack, the MCP SDK): it runs beside the layer from the
# moment this module is collected (tests/support/beside.py).
_LOADED = loading([ENTRY, *sorted(imported_by(ENTRY)), *BY_NAME])


def allowed(name: str) -> bool:
    return name in ALLOWED or any(name == p or name.startswith(p + ".") for p in ALLOWED_PACKAGES)


@pytest.mark.spawns  # a fresh interpreter: this process has imported everything already
def test_the_inbox_process_loads_nothing_of_the_core_or_the_answering_code() -> None:
    got = set(_LOADED.result())
    assert ENTRY in got and "deltad.http.app" in got and "deltad.inbox.ops" in got
    crossed = sorted(
        n for n in got if n.startswith(NEVER) or n.removeprefix("deltad.inbox.") in NEVER_INBOX
    )
    assert crossed == [], f"the inbox process loads the core's code: {crossed}"
    assert sorted(n for n in got if not allowed(n)) == []
