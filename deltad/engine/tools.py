"""Running one tool: its own process group, a timeout, bounded capture, redacted records.

Output is captured in memory (bounded) rather than streamed to disk, because a secret must be
redacted before any byte of it reaches the run's io records.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from deltad.agent import Invocation, fd_token
from deltad.protocol import ProtocolError, atomic_write_json, atomic_write_text, current_owner
from deltad.protocol.fsio import lstat_or_none, read_regular
from deltad.protocol.process import owner_alive, proc_start_ticks
from deltad.protocol.safefs import DELTA_DIR, tool_umask

from .sandbox import Plan

CAPTURE_LIMIT = 1024 * 1024  # per stream, kept in the record
OBSERVATION_LIMIT = 8000  # per stream, shown to the model
KILL_GRACE_SECONDS = 3.0


@dataclass
class ToolOutcome:
    exit_code: int | None
    stdout: str
    stderr: str
    duration_ms: int
    timed_out: bool = False
    error: str | None = None  # could not start

    def observation(self) -> str:
        if self.error:
            return f"Error: {self.error}"
        parts = []
        for label, text in (("STDOUT", self.stdout), ("STDERR", self.stderr)):
            if text:
                if len(text) > OBSERVATION_LIMIT:
                    text = text[:OBSERVATION_LIMIT] + f"\n[output truncated: {len(text)} chars]"
                parts.append(f"=== {label} ===\n{text}")
        if self.timed_out:
            parts.append(f"=== TIMED OUT after {self.duration_ms} ms; process group killed ===")
        else:
            parts.append(f"=== EXIT CODE: {self.exit_code} ===")
        return "\n".join(parts)


class _Capture(threading.Thread):
    def __init__(self, stream: object) -> None:
        super().__init__(daemon=True)
        self.stream = stream
        self.buf = bytearray()
        self.dropped = 0

    def run(self) -> None:
        read = self.stream.read  # type: ignore[attr-defined]
        while chunk := read(65536):
            room = CAPTURE_LIMIT - len(self.buf)
            self.buf += chunk[:room]
            self.dropped += max(0, len(chunk) - room)

    def text(self) -> str:
        out = self.buf.decode("utf-8", errors="replace")
        return out + (f"\n[{self.dropped} more bytes not kept]" if self.dropped else "")


def _feed(stdin: object, data: str | None) -> None:
    with contextlib.suppress(BrokenPipeError, OSError):
        if data is not None:
            stdin.write(data.encode())  # type: ignore[attr-defined]
        stdin.close()  # type: ignore[attr-defined]


def kill_group(pgid: int, reap: Callable[[], object] | None = None) -> None:
    """SIGTERM the group, then SIGKILL what is left after a grace period.

    `reap` collects the leader when it is our own child: until it is reaped its zombie keeps
    the group "alive" to killpg(pgid, 0), and every kill would wait out the whole grace."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + KILL_GRACE_SECONDS
        while time.monotonic() < deadline:
            if reap is not None:
                reap()
            os.killpg(pgid, 0)
            time.sleep(0.05)
        os.killpg(pgid, signal.SIGKILL)


# Never handed to a tool: the model endpoint's settings (its key above all) and the client's
# own switches. A tool gets what its definition gives it (AGENT_HOME, its parameters).
WITHHELD_PREFIXES = ("OPENAI_", "DELTA_")


def tool_environment(parent: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in parent.items() if not k.startswith(WITHHELD_PREFIXES)}


def _with_fds(arg: str, fds: dict[str, int]) -> str:
    for name, fd in fds.items():
        arg = arg.replace(fd_token(name), f"/dev/fd/{fd}")
    return arg


def _umask(workspace: Path) -> int:
    """For Popen: the workspace's rule (safefs.tool_umask), -1 to keep `delta`'s own."""
    found = tool_umask(lstat_or_none(workspace / DELTA_DIR))
    return -1 if found is None else found


def _missing(command: str, cwd: Path, env: Mapping[str, str]) -> str | None:
    """Why `command` cannot be executed, as Popen would have said it, before a sandbox starts
    it (inside one, a missing command would be bwrap's exit 1 instead of "cannot run")."""
    if "/" in command:
        path = cwd / command
        if not path.exists():
            return os.strerror(errno.ENOENT)
        ok = os.access(path, os.X_OK) and not path.is_dir()
        return None if ok else os.strerror(errno.EACCES)
    found = shutil.which(command, path=env.get("PATH", os.defpath))
    return None if found is not None else os.strerror(errno.ENOENT)


def run_tool(
    inv: Invocation,
    cwd: Path,
    timeout: float,
    record: Path,
    interruptible: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext,
    *,
    sandbox: Plan,
) -> ToolOutcome:
    """Run `inv` (inside `sandbox`, engine/sandbox.py); writes `record/process.json` while it
    runs so a later resume can find an orphan left by a crashed client. `interruptible` (the
    engine's signal window) is opened only around the wait, inside the try that kills the
    group: a signal landing between the spawn and the wait would otherwise leave the group
    running."""
    if sandbox.refused is not None:
        return ToolOutcome(None, "", "", 0, error=f"not run: {sandbox.refused}")
    env = tool_environment(os.environ) | inv.env
    if sandbox.prefix and (why := _missing(inv.argv[0], cwd, env)):
        return ToolOutcome(None, "", "", 0, error=f"cannot run {inv.argv[0]!r}: {why}")
    pipes = {name: os.pipe() for name in inv.fds}  # the tool reads each value from /dev/fd/N
    argv = [_with_fds(a, {n: r for n, (r, _) in pipes.items()}) for a in inv.argv]
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            [*sandbox.prefix, *argv],
            cwd=cwd,
            env=env,
            start_new_session=True,
            umask=_umask(cwd),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=[r for r, _ in pipes.values()],
        )
    except OSError as e:
        for r, w in pipes.values():
            os.close(r)
            os.close(w)
        return ToolOutcome(None, "", "", 0, error=f"cannot run {argv[0]!r}: {e.strerror}")
    for name, (r, w) in pipes.items():
        os.close(r)
        pipe = os.fdopen(w, "wb")
        threading.Thread(target=_feed, args=(pipe, inv.fds[name]), daemon=True).start()
    atomic_write_json(
        record / "process.json", {"pid": proc.pid, "start_ticks": proc_start_ticks(proc.pid)}
    )
    out, err = _Capture(proc.stdout), _Capture(proc.stderr)
    feeder = threading.Thread(target=_feed, args=(proc.stdin, inv.stdin), daemon=True)
    for t in (out, err, feeder):
        t.start()
    timed_out = False
    try:
        with interruptible():
            proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        # Also reached on SIGINT/SIGTERM (raised into this frame): never leave the group behind.
        if proc.poll() is None or timed_out:
            kill_group(proc.pid, reap=proc.poll)
            proc.wait()
        out.join(5)
        err.join(5)
    return ToolOutcome(
        proc.returncode, out.text(), err.text(), int((time.monotonic() - start) * 1000), timed_out
    )


def kill_orphan(record: Path) -> bool:
    """Kill the process group a crashed client left running, if it is still the same process."""
    try:
        info = json.loads(read_regular(record / "process.json", 4096))
        pid, ticks = int(info["pid"]), info.get("start_ticks")
    except (OSError, ValueError, TypeError, KeyError, ProtocolError):
        return False
    me = current_owner()
    ghost = me.model_copy(update={"pid": pid, "start_ticks": ticks})
    if owner_alive(ghost):
        kill_group(pid)
        return True
    return False


def write_record(
    record: Path, display: str, outcome: ToolOutcome, redact: Callable[[str], str]
) -> None:
    atomic_write_text(record / "command.txt", display + "\n")
    atomic_write_text(record / "stdout.log", redact(outcome.stdout))
    atomic_write_text(record / "stderr.log", redact(outcome.stderr))
    code = "timeout" if outcome.timed_out else str(outcome.exit_code)
    atomic_write_text(record / "exit_code.txt", (outcome.error or code) + "\n")
    atomic_write_text(record / "duration_ms.txt", f"{outcome.duration_ms}\n")
