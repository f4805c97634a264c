"""A real `deltad serve` subprocess for tests and benchmarks: its JSON log, signals, and waiting
for conditions (never for fixed times: the deadlines are generous, the checks exact)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import yaml

from deltad.testing.stub import paused_workspace

if TYPE_CHECKING:
    from deltad.executors import Exit, JobExecutor

BIN = Path(sys.executable).parent
DELTAD = str(BIN / "deltad")
DEADLINE = 30.0
T = TypeVar("T")
# The backend given to roots passed as plain paths (None: the config's default, auto). Tests
# set it to run the same scenarios under another backend.
ROOT_BACKEND: str | None = None
# The executor every daemon here uses unless a test names one: `DELTAD_TEST_EXECUTOR=fresh`
# (or fork, command) runs the whole daemon suite against it; unset: the config's default.
EXECUTOR: str | None = os.environ.get("DELTAD_TEST_EXECUTOR") or None

__all__ = ["DELTAD", "Daemon", "next_exit", "paused_workspace", "records", "wait_for"]


def wait_for(cond: Callable[[], T], what: str, timeout: float = DEADLINE) -> T:
    end = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def next_exit(ex: JobExecutor) -> Exit:
    """The next job `ex` reports ended (exactly one: the tests start one at a time)."""

    from deltad.executors.seam import Exit

    def exits() -> list[Exit]:
        return [e for e in ex.poll(time.monotonic()) if isinstance(e, Exit)]

    [end] = wait_for(exits, "a resume job to end")
    return end


def stub_command(record: Path, mode: str = "consume") -> list[str]:
    return [
        sys.executable,
        "-m",
        "deltad.testing.stub",
        "stub",
        "{workspace}",
        "--record",
        str(record),
        "--mode",
        mode,
    ]


def records(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _root_entry(root: Any) -> Any:
    if not isinstance(root, str | Path):
        return root  # already a mapping: as given
    return {"path": str(root), "backend": ROOT_BACKEND} if ROOT_BACKEND else str(root)


class Daemon:
    """`deltad serve` on a config written from keyword arguments, logging JSON to a file."""

    def __init__(
        self, tmp: Path, roots: list[Any], *, wrapper: list[str] | None = None, **settings: Any
    ) -> None:
        self.tmp = tmp
        self.wrapper = wrapper or []  # e.g. setpriv, to run the daemon with fewer privileges
        self.record = tmp / "resumes.jsonl"
        self.state_dir = tmp / "state"
        self.log_path = tmp / f"deltad-{id(self)}.log"
        self.config_path = tmp / "deltad.yaml"
        self.settings: dict[str, Any] = {
            "roots": [_root_entry(r) for r in roots],
            "state_dir": str(self.state_dir),
            "log_format": "json",
            "log_level": "debug",
            "settle_seconds": 0.3,
            "backoff_initial_seconds": 0.3,
            "backoff_max_seconds": 2,
            "shutdown_grace_seconds": 10,
            "resume_command": stub_command(self.record, settings.pop("mode", "consume")),
            **({"executor": EXECUTOR} if EXECUTOR else {}),
            **settings,
        }
        self.write_config()
        self.proc: subprocess.Popen[bytes] | None = None

    def write_config(self, **changes: Any) -> None:
        self.settings.update(changes)
        self.config_path.write_text(yaml.safe_dump(self.settings))

    def start(self, env: dict[str, str] | None = None, wait: bool = True) -> Daemon:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [*self.wrapper, DELTAD, "serve", "--config", str(self.config_path)],
            stdout=self._log,
            stderr=self._log,
            env={**os.environ, **(env or {})},
        )
        if wait:
            self.wait_event("daemon_ready")
        return self

    # -- logs -------------------------------------------------------------------------------
    def lines(self) -> list[dict[str, Any]]:
        out = []
        for raw in self.log_path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                obj = json.loads(raw)
                if isinstance(obj, dict):
                    out.append(obj)
        return out

    def events(self, name: str, **match: Any) -> list[dict[str, Any]]:
        return [
            e
            for e in self.lines()
            if e.get("event") == name and all(e.get(k) == v for k, v in match.items())
        ]

    def wait_event(
        self, name: str, count: int = 1, timeout: float = DEADLINE, **match: Any
    ) -> list[dict[str, Any]]:
        def found() -> list[dict[str, Any]] | None:
            self._check_alive(name)
            hits = self.events(name, **match)
            return hits if len(hits) >= count else None

        hits = wait_for(found, f"{count}x {name} {match or ''} in {self.log_path}", timeout)
        assert hits is not None
        return hits

    def _check_alive(self, waiting_for: str) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is not None and waiting_for != "daemon_stopped":
            tail = self.log_path.read_text(errors="replace")[-3000:]
            raise AssertionError(
                f"deltad exited ({proc.returncode}) while waiting for {waiting_for}:\n{tail}"
            )

    def resumed(self, ws: Path) -> list[dict[str, Any]]:
        return [r for r in records(self.record) if r.get("workspace") == str(ws)]

    def wait_resumed(self, ws: Path, count: int = 1) -> list[dict[str, Any]]:
        def found() -> list[dict[str, Any]] | None:
            r = self.resumed(ws)
            return r if len(r) >= count else None

        hits = wait_for(found, f"{ws} resumed {count}x")
        assert hits is not None
        return hits

    # -- signals / stop ---------------------------------------------------------------------
    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def reload(self, timeout: float = DEADLINE) -> None:
        """SIGHUP, then wait for the reload's full reconcile (`timeout`: a bench at 100,000
        workspaces passes one that grows with them)."""
        n = len(self.events("reconcile_full", reason="reload"))
        self.signal(signal.SIGHUP)
        self.wait_event("reconcile_full", count=n + 1, timeout=timeout, reason="reload")

    def stop(self, timeout: float = DEADLINE) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._log.close()
        return rc

    def kill_children(self) -> None:
        """Resume children run in their own session: end any still alive after a test."""
        for e in self.events("resume_spawned"):
            if not isinstance(e.get("pid"), int) or e["pid"] <= 0:
                continue  # a job, not a local process (killpg(0) would be our own group)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(e["pid"], signal.SIGKILL)


@contextlib.contextmanager
def running(tmp: Path, roots: list[Any], **settings: Any) -> Iterator[Daemon]:
    d = Daemon(tmp, roots, **settings).start()
    try:
        yield d
    finally:
        with contextlib.suppress(Exception):
            d.stop()
        d.kill_children()


def answer(ws: Path, text: str = "yes") -> None:
    """Write an answer the way `delta respond` does (atomic rename)."""
    tmp = ws / ".delta" / "interaction" / ".response.tmp"
    tmp.write_text(text)
    os.replace(tmp, ws / ".delta" / "interaction" / "response.txt")


def metadata_status(ws: Path) -> str:
    from deltad.protocol import Workspace, load_metadata

    w = Workspace.at(ws)
    run_id = w.latest_run_id()
    assert run_id
    return str(load_metadata(w.run(run_id).metadata).status)
