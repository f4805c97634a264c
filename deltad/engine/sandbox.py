"""Tools run sandboxed: they cannot touch the run's control plane.

A tool runs as the workspace's owner, and without this it could write `.delta/` (answer its own
question, append to the journal) or leave a process behind that does so after `delta` exits
101: an approval, four eyes included, satisfied by the very agent it gates. So every tool
process `delta` starts runs under bubblewrap (`bwrap`, Debian's `bubblewrap`):

- the root filesystem read-only, the workspace writable, and over it `.delta/` and the agent's
  own directory (which a resume reads again) read-only; paths the agent's config grants
  (`sandbox.writable`) writable too; a private /tmp and a minimal /dev;
- its own PID namespace with `--die-with-parent`: when the tool's command ends, its namespace
  ends, and every process in it (a `setsid` or double-forked one too) is killed; a crash of
  `delta` takes the sandbox with it;
- `network: false` (a tool's own, or `sandbox.network`): its own network namespace, nothing
  but a loopback of its own (Unix sockets named in the filesystem stay reachable);
- as root (only outside deltad), every capability dropped: root could remount otherwise.

The environment, the working directory, stdin/stdout/stderr, inherited `fd` pipes, the umask
and the process group (so a timeout's kill reaches it) are what they were without the sandbox.
Where bwrap cannot run, the agent's `sandbox.unavailable` decides: `refuse` (the default; the
run does not start, exit 2) or `unsandboxed` (tools run as before, and the run says so once).
The decisions below are pure (tests/unit/test_sandbox.py); `host()` reads the machine.
"""

from __future__ import annotations

import functools
import os
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from deltad.agent import Agent, SandboxPolicy
from deltad.errors import UsageError
from deltad.protocol.safefs import DELTA_DIR

INSTALL_HINT = "install bubblewrap (Debian: apt-get install bubblewrap)"


@dataclass(frozen=True)
class Host:
    """What decides whether bwrap can confine a tool on this machine."""

    bwrap: str | None  # its path, None when it is not on PATH
    euid: int
    setuid: bool = False  # a setuid-root bwrap needs no user namespaces
    max_user_namespaces: int | None = None  # /proc/sys/user/max_user_namespaces
    unprivileged_userns_clone: int | None = None  # Debian's older kernel switch, if present


def unavailable(h: Host) -> str | None:
    """Why tools cannot be sandboxed here, or None when they can."""
    if h.bwrap is None:
        return f"bwrap is not installed ({INSTALL_HINT})"
    if h.euid == 0 or h.setuid:
        return None  # namespaces without a user namespace
    if h.max_user_namespaces == 0:
        return "user namespaces are disabled (sysctl user.max_user_namespaces = 0)"
    if h.unprivileged_userns_clone == 0:
        return (
            "unprivileged user namespaces are disabled "
            "(sysctl kernel.unprivileged_userns_clone = 0)"
        )
    return None


def _sysctl(path: str) -> int | None:
    try:
        return int(Path(path).read_text().strip())
    except (OSError, ValueError):
        return None


@functools.cache
def host() -> Host:
    """This machine, looked at once per process (no process is started to find out)."""
    bwrap = shutil.which("bwrap")
    setuid = False
    if bwrap is not None:
        try:
            st = os.stat(bwrap)
            setuid = bool(st.st_mode & stat.S_ISUID) and st.st_uid == 0
        except OSError:
            bwrap = None
    return Host(
        bwrap,
        os.geteuid(),
        setuid,
        _sysctl("/proc/sys/user/max_user_namespaces"),
        _sysctl("/proc/sys/kernel/unprivileged_userns_clone"),
    )


@dataclass(frozen=True)
class Confinement:
    """One tool call's sandbox: what it may write and whether it has a network."""

    workspace: Path
    read_only: tuple[Path, ...]  # laid over the workspace (and the writable paths) last
    writable: tuple[Path, ...] = ()
    network: bool = True
    root: bool = False  # bwrap runs as root: drop every capability


def bwrap_argv(bwrap: str, c: Confinement) -> list[str]:
    """The command line that runs a tool inside `c` (the tool's argv follows it). Order
    matters: a later mount lies over an earlier one, so the read-only ones come last."""
    argv = [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    if Path("/tmp") not in c.writable:
        argv += ["--tmpfs", "/tmp"]
    argv += ["--unshare-pid", "--unshare-ipc", "--die-with-parent"]
    if not c.network:
        argv += ["--unshare-net"]
    if c.root:
        argv += ["--cap-drop", "ALL"]
    for path in (*c.writable, c.workspace):
        argv += ["--bind", str(path), str(path)]
    for path in c.read_only:
        argv += ["--ro-bind", str(path), str(path)]
    return [*argv, "--chdir", str(c.workspace), "--"]


def confinement(
    agent: Agent,
    workspace: Path,
    network: bool | None,
    euid: int,
    protect: tuple[Path, ...] = (),
) -> Confinement:
    """The sandbox of one call of `agent`'s in `workspace` (`network`: the tool's own say;
    `protect`: more paths a resume reads, such as the run's own agent when a pipeline node
    works with another)."""
    policy = agent.config.sandbox
    ws = workspace.resolve()
    more = (p for p in protect if p.is_absolute() and p.is_dir())
    homes = dict.fromkeys(p.resolve() for p in (agent.home, *more))
    return Confinement(
        ws,
        (ws / DELTA_DIR, *homes),
        tuple(Path(p).resolve() for p in policy.writable),
        policy.network if network is None else network,
        euid == 0,
    )


@dataclass(frozen=True)
class Plan:
    """How one call runs: `prefix` before its argv (empty: unconfined), or `refused`."""

    prefix: tuple[str, ...] = ()
    refused: str | None = None


UNCONFINED = Plan()


def refusal(why: str) -> str:
    return (
        f"tools cannot be sandboxed here: {why}. Install it, or let this agent's tools run "
        "unsandboxed (sandbox: {unavailable: unsandboxed} in its config)"
    )


def decide(policy: SandboxPolicy, why: str | None) -> str | None:
    """None: go on (sandboxed, or unsandboxed by the operator's choice); else the refusal."""
    if why is None or policy.unavailable == "unsandboxed":
        return None
    return refusal(why)


def plan(
    agent: Agent,
    workspace: Path,
    network: bool | None,
    h: Host | None = None,
    protect: tuple[Path, ...] = (),
) -> Plan:
    h = h or host()
    why = unavailable(h)
    if why is not None:
        refused = decide(agent.config.sandbox, why)
        return UNCONFINED if refused is None else Plan(refused=refused)
    assert h.bwrap is not None
    c = confinement(agent, workspace, network, h.euid, protect)
    return Plan(tuple(bwrap_argv(h.bwrap, c)))


def announce(agent: Agent, say: Callable[[str], object], h: Host | None = None) -> None:
    """Once per run, as it starts or resumes: refuse (UsageError) or warn when the agent's
    tools cannot be sandboxed. `say` prints a warning line."""
    why = unavailable(h or host())
    if why is None or not agent.tools:
        return
    if (refused := decide(agent.config.sandbox, why)) is not None:
        raise UsageError(refused)
    say(
        f"warning: this agent's tools run unsandboxed ({why}): they can write the run's "
        "control files (.delta/) and answer its questions"
    )
