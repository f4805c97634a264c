"""The tool sandbox's decisions (deltad/engine/sandbox.py): whether bwrap can run here, what a
call's bwrap command line is for an agent's config, and what happens when there is none."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from deltad.agent import Invocation, SandboxPolicy, load_agent
from deltad.engine import sandbox
from deltad.engine.sandbox import Confinement, Host, Plan, bwrap_argv, decide, unavailable
from deltad.engine.tools import run_tool
from deltad.errors import ConfigError, UsageError

from ..conftest import write_agent

BW = "/usr/bin/bwrap"
NOT_INSTALLED = "bwrap is not installed (install bubblewrap (Debian: apt-get install bubblewrap))"


@pytest.mark.parametrize(
    ("host", "why"),
    [
        (Host(None, 0), NOT_INSTALLED),
        (Host(None, 1000, max_user_namespaces=100), NOT_INSTALLED),
        (Host(BW, 0, max_user_namespaces=0), None),  # root needs no user namespace
        (Host(BW, 1000, max_user_namespaces=100), None),
        (Host(BW, 1000), None),  # the knobs unreadable: bwrap says at the call if it fails
        (Host(BW, 1000, max_user_namespaces=100, unprivileged_userns_clone=1), None),
        (
            Host(BW, 1000, max_user_namespaces=0),
            "user namespaces are disabled (sysctl user.max_user_namespaces = 0)",
        ),
        (
            Host(BW, 1000, max_user_namespaces=100, unprivileged_userns_clone=0),
            "unprivileged user namespaces are disabled "
            "(sysctl kernel.unprivileged_userns_clone = 0)",
        ),
        (Host(BW, 1000, setuid=True, max_user_namespaces=0), None),  # a setuid bwrap
    ],
)
def test_whether_bwrap_can_run_here(host: Host, why: str | None) -> None:
    assert unavailable(host) == why


@pytest.mark.parametrize(
    ("choice", "why", "refused"),
    [
        ("refuse", None, False),
        ("unsandboxed", None, False),
        ("refuse", "bwrap is not installed", True),
        ("unsandboxed", "bwrap is not installed", False),
    ],
)
def test_without_a_sandbox_the_operator_chooses(
    choice: str, why: str | None, refused: bool
) -> None:
    got = decide(SandboxPolicy.model_validate({"unavailable": choice}), why)
    assert (got is not None) == refused
    if refused:
        assert got is not None and got.startswith(f"tools cannot be sandboxed here: {why}.")
        assert "sandbox: {unavailable: unsandboxed}" in got


WS = Path("/srv/ws")
HOME = Path("/srv/agents/a")
BASE = [BW, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
NS = ["--unshare-pid", "--unshare-ipc", "--die-with-parent"]
TAIL = ["--bind", "/srv/ws", "/srv/ws", "--ro-bind", "/srv/ws/.delta", "/srv/ws/.delta"]
END = ["--chdir", "/srv/ws", "--"]


@pytest.mark.parametrize(
    ("c", "argv"),
    [
        (  # the default: a private /tmp, network, .delta/ laid read-only over the workspace
            Confinement(WS, (WS / ".delta",)),
            [*BASE, "--tmpfs", "/tmp", *NS, *TAIL, *END],
        ),
        (
            Confinement(WS, (WS / ".delta",), network=False),
            [*BASE, "--tmpfs", "/tmp", *NS, "--unshare-net", *TAIL, *END],
        ),
        (  # as root: no capability (it could remount .delta/ writable)
            Confinement(WS, (WS / ".delta",), root=True),
            [*BASE, "--tmpfs", "/tmp", *NS, "--cap-drop", "ALL", *TAIL, *END],
        ),
        (  # granted paths before the workspace; read-only ones last, so they win
            Confinement(WS, (WS / ".delta", HOME), (Path("/var/cache/x"), Path("/srv"))),
            [
                *BASE,
                "--tmpfs",
                "/tmp",
                *NS,
                "--bind",
                "/var/cache/x",
                "/var/cache/x",
                "--bind",
                "/srv",
                "/srv",
                *TAIL,
                "--ro-bind",
                str(HOME),
                str(HOME),
                *END,
            ],
        ),
        (  # /tmp granted: the machine's own, shared
            Confinement(WS, (WS / ".delta",), (Path("/tmp"),)),
            [*BASE, *NS, "--bind", "/tmp", "/tmp", *TAIL, *END],
        ),
    ],
)
def test_the_bwrap_command_line(c: Confinement, argv: list[str]) -> None:
    assert bwrap_argv(BW, c) == argv


def _agent(tmp_path: Path, extra: str, tools: str = "") -> Path:
    return write_agent(tmp_path, tools or '\n  - name: t\n    exec: "true"\n', extra)


@pytest.mark.parametrize(
    ("extra", "tool", "network", "writable"),
    [
        ("", "", True, ()),
        ("sandbox:\n  network: false\n", "", False, ()),
        ("sandbox:\n  network: false\n", "    network: true\n", True, ()),
        ("", "    network: false\n", False, ()),
        ("sandbox:\n  writable: [/var/cache/x]\n", "", True, (Path("/var/cache/x"),)),
    ],
)
def test_a_calls_confinement_comes_from_the_agents_config(
    tmp_path: Path, extra: str, tool: str, network: bool, writable: tuple[Path, ...]
) -> None:
    tools = f'\n  - name: t\n    exec: "true"\n{tool}'
    agent = load_agent(_agent(tmp_path, extra, tools))
    ws = tmp_path / "ws"
    c = sandbox.confinement(agent, ws, agent.tools["t"].network, euid=1000)
    assert c == Confinement(
        ws.resolve(), (ws.resolve() / ".delta", agent.home.resolve()), writable, network, False
    )


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        ("sandbox:\n  writable: [relative/dir]\n", "sandbox.writable: 'relative/dir' is not"),
        ("sandbox:\n  unavailable: maybe\n", "sandbox.unavailable: Input should be"),
        ("sandbox:\n  mode: off\n", "sandbox.mode: Extra inputs are not permitted"),
    ],
)
def test_sandbox_config_errors(tmp_path: Path, extra: str, error: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(error)):
        load_agent(_agent(tmp_path, extra))


@pytest.mark.parametrize(
    ("host", "choice", "plan"),
    [
        (Host(None, 1000), "refuse", "refused"),
        (Host(None, 1000), "unsandboxed", "unconfined"),
        (Host(BW, 1000), "refuse", "bwrap"),
        (Host(BW, 1000), "unsandboxed", "bwrap"),  # available: always used
    ],
)
def test_a_calls_plan(tmp_path: Path, host: Host, choice: str, plan: str) -> None:
    agent = load_agent(_agent(tmp_path, f"sandbox:\n  unavailable: {choice}\n"))
    got = sandbox.plan(agent, tmp_path / "ws", None, host)
    match plan:
        case "refused":
            assert got.refused is not None and not got.prefix
        case "unconfined":
            assert got == sandbox.UNCONFINED
        case _:
            assert got.refused is None and got.prefix[0] == BW and got.prefix[-1] == "--"


def test_a_refused_call_is_not_started(tmp_path: Path) -> None:
    """No process: the call's outcome is the refusal (the unit layer's guard would fail a spawn)."""
    out = run_tool(
        Invocation(["touch", "x"], None, {}), tmp_path, 5, tmp_path, sandbox=Plan(refused="why")
    )
    assert out.error == "not run: why" and out.exit_code is None
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    ("host", "choice", "has_tools", "said"),
    [
        (Host(BW, 1000), "refuse", True, None),
        (Host(None, 1000), "refuse", True, "refused"),
        (Host(None, 1000), "unsandboxed", True, "warned"),
        (Host(None, 1000), "refuse", False, None),  # no tools: nothing to confine
    ],
)
def test_the_run_says_so_once_as_it_starts(
    tmp_path: Path, host: Host, choice: str, has_tools: bool, said: str | None
) -> None:
    extra = f"sandbox:\n  unavailable: {choice}\n"
    agent = load_agent(_agent(tmp_path, extra) if has_tools else write_agent(tmp_path, "[]", extra))
    lines: list[str] = []
    if said == "refused":
        with pytest.raises(UsageError, match="tools cannot be sandboxed here"):
            sandbox.announce(agent, lines.append, host)
        return
    sandbox.announce(agent, lines.append, host)
    if said == "warned":
        assert len(lines) == 1 and "run unsandboxed (bwrap is not installed" in lines[0]
    else:
        assert lines == []


def test_the_runs_own_agent_is_protected_too(tmp_path: Path) -> None:
    """A pipeline node working with another agent: the run's agent (read again by a resume)
    stays read-only as well; a path that is not a directory is left out (nothing to mount)."""
    node = load_agent(_agent(tmp_path / "node", ""))
    run_agent = _agent(tmp_path / "run", "")
    ws = tmp_path / "ws"
    c = sandbox.confinement(
        node, ws, None, 1000, protect=(run_agent, node.home, tmp_path / "gone", Path("rel"))
    )
    assert c.read_only == (ws.resolve() / ".delta", node.home.resolve(), run_agent.resolve())
