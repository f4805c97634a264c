"""A real Prometheus (Debian's `prometheus` package) on loopback, for the scrape test.

Skipped only where it cannot run: the binary missing outside CI. With `CI=true` (`.ci/run`
installs the package) a missing binary fails instead, as the Slurm tests do (tests/slurm.py).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.daemon import wait_for

DEADLINE = 60.0


def binary() -> str:
    found = shutil.which("prometheus")
    if found is None:
        why = "Prometheus is not installed: apt-get install prometheus (.ci/run does)"
        if os.environ.get("CI"):
            pytest.fail(f"the Prometheus test must run in CI: {why}")
        pytest.skip(why)
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Prometheus:
    """`prometheus` scraping the given targets every second with a bearer token from a file
    (its `authorization.credentials_file`), answering queries on 127.0.0.1."""

    def __init__(self, tmp: Path, targets: list[str], token_file: Path, rules: list[Path]) -> None:
        self.tmp = tmp
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = tmp / "prometheus.yml"
        self.log_path = tmp / "prometheus.log"
        doc: dict[str, Any] = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(r) for r in rules],
            "scrape_configs": [
                {
                    "job_name": "deltad",
                    "scrape_interval": "1s",
                    "scrape_timeout": "1s",
                    "authorization": {"credentials_file": str(token_file)},
                    "static_configs": [{"targets": targets}],
                }
            ],
        }
        self.config.write_text(yaml.safe_dump(doc))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Prometheus:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [
                binary(),
                f"--config.file={self.config}",
                f"--storage.tsdb.path={self.tmp / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=info",
            ],
            stdout=self._log,
            stderr=self._log,
        )
        wait_for(self._ready, f"Prometheus ready on {self.url} ({self.log_path})", DEADLINE)
        return self

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited: {self.log_path.read_text()[-2000:]}")
        try:
            return httpx.get(f"{self.url}/-/ready", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector `expr` evaluates to now (Prometheus' HTTP query API)."""
        r = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        r.raise_for_status()
        doc = r.json()
        assert doc["status"] == "success", doc
        result: list[dict[str, Any]] = doc["data"]["result"]
        return result

    def value(self, expr: str) -> float | None:
        """The single value of `expr` now, None while it has none."""
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._log.close()


@contextlib.contextmanager
def running(
    tmp: Path, targets: list[str], token_file: Path, rules: list[Path]
) -> Iterator[Prometheus]:
    p = Prometheus(tmp, targets, token_file, rules)
    try:
        yield p.start()
    finally:
        p.stop()
