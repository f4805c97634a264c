"""Podman for the tests that run deltad's image (tests/e2e/test_image.py, test_kube_play.py): the
image's name, podman with the project's settings, and the one rule for a missing podman or image
(required with CI=true, where `.ci/run` builds the image first; skipped elsewhere).

Podman runs with runc and cgroupfs (deploy/image/containers.conf), which also work inside an
unprivileged container where crun and systemd's cgroups do not.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tomllib
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
CONTAINERS_CONF = REPO / "deploy" / "image" / "containers.conf"


def _version() -> str:
    with (REPO / "pyproject.toml").open("rb") as f:
        version: str = tomllib.load(f)["project"]["version"]
    return version


VERSION = _version()
IMAGE = os.environ.get("DELTAD_IMAGE", f"localhost/deltad:{VERSION}")


def missing(what: str, why: str) -> None:
    """Fail under CI=true (`what` must run there), else skip."""
    if os.environ.get("CI"):
        pytest.fail(f"{what} must run in CI: {why}")
    pytest.skip(why)


def env() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}


def podman(*args: str, check: bool = True, timeout: float = 120) -> str:
    out = subprocess.run(
        ["podman", *args],
        env=env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and out.returncode != 0:
        raise AssertionError(f"podman {' '.join(args[:2])} failed: {out.stderr.strip()}")
    return out.stdout + out.stderr


def the_image(what: str) -> str:
    """The image CI built, or a skip (a failure under CI) saying how to build it."""
    if shutil.which("podman") is None:
        missing(what, "podman is not installed (apt-get install podman runc mmdebstrap)")
    if subprocess.run(["podman", "image", "exists", IMAGE], env=env(), check=False).returncode:
        missing(what, f"no image {IMAGE}: build it with deploy/image/build.sh")
    return IMAGE


def events(text: str, event: str) -> list[dict[str, Any]]:
    """The JSON log lines of `event` in a container's log."""
    found = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            doc = json.loads(line)
            if isinstance(doc, dict) and doc.get("event") == event:
                found.append(doc)
    return found


# No proxy from the environment: the addresses asked are 127.0.0.1 or a pod's on this host.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def status(url: str, timeout: float = 5) -> int:
    """The HTTP status of a GET, 0 when nothing answered (refused, timed out)."""
    try:
        with _DIRECT.open(url, timeout=timeout) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0


def call(method: str, url: str, token: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    """An API call with a bearer token: its status and its JSON body."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with _DIRECT.open(req, timeout=10) as r:
            return int(r.status), json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return int(e.code), json.loads(e.read() or b"null")
