"""A Kubernetes API server for tests: kmock's in-memory emulator, over real HTTP on 127.0.0.1.

It stores objects, answers 409 to a second create of a name, lists, patches and deletes — and
runs no controllers: a test plays the Job controller and the kubelet by writing the pod objects
and statuses they would (`play_pod`, `set_job_status`). Two things it does not do that a real
server does, both covered by the executor: it ignores `labelSelector` (the executor filters
what it lists again) and it assigns no `metadata.uid` (the handle then carries the Job's name).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

if os.environ.get("CI"):  # CI installs the dev extras: a missing emulator fails, never skips
    import kmock
    from kubernetes import client as k8s
else:
    kmock = pytest.importorskip("kmock")
    k8s = pytest.importorskip("kubernetes.client")

# kmock's action for a request, as an RBAC verb.
VERBS = {
    "FETCH": "get",
    "LIST": "list",
    "WATCH": "watch",
    "CREATE": "create",
    "DELETE": "delete",
    "UPDATE": "patch",
}


@dataclass
class Emulator:
    url: str
    kubeconfig: Path
    handler: Any
    api: Any = field(init=False)

    def __post_init__(self) -> None:
        cfg = k8s.Configuration()
        cfg.host = self.url
        self.api = k8s.ApiClient(cfg)

    @property
    def batch(self) -> Any:
        return k8s.BatchV1Api(self.api)

    @property
    def core(self) -> Any:
        return k8s.CoreV1Api(self.api)

    def jobs(self, namespace: str = "default") -> list[Any]:
        return list(self.batch.list_namespaced_job(namespace).items)

    def calls(self) -> set[tuple[str, str]]:
        """(resource as RBAC names it, verb) of every request the server saw."""
        seen = set()
        for r in list(self.handler):
            if r.resource is None:
                continue
            res = f"{r.resource.group}/{r.resource.plural}"
            if r.subresource:
                res += f"/{r.subresource}"
            seen.add((res, VERBS[r.action.name]))
        return seen

    def set_job_status(self, name: str, status: dict[str, Any], ns: str = "default") -> None:
        self.batch.patch_namespaced_job_status(name, ns, {"status": status})

    def play_pod(
        self, job: str, exit_code: int | None, reason: str = "Error", ns: str = "default"
    ) -> str:
        """The pod the Job controller would make for `job`, ended with `exit_code` (None: still
        running) as the kubelet would report it."""
        pod = f"{job}-x7k2p"
        state: dict[str, Any] = {"running": {"startedAt": "2026-11-24T00:00:00Z"}}
        if exit_code is not None:
            state = {"terminated": {"exitCode": exit_code, "reason": reason}}
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod, "namespace": ns, "labels": {"job-name": job}},
            "spec": {"containers": [{"name": "resume", "image": "i"}]},
            "status": {
                "containerStatuses": [
                    {
                        "name": "resume",
                        "image": "i",
                        "imageID": "",
                        "ready": exit_code is None,
                        "restartCount": 0,
                        "state": state,
                    }
                ]
            },
        }
        self.core.create_namespaced_pod(ns, body)
        return pod


def _kubeconfig(path: Path, url: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "kmock", "cluster": {"server": url}}],
                "users": [{"name": "test", "user": {"token": "not-a-secret"}}],
                "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "test"}}],
                "current-context": "kmock",
            }
        )
    )
    return path


@contextlib.contextmanager
def emulator(tmp: Path) -> Iterator[Emulator]:
    """The emulator on a loopback port, in its own thread and event loop, for one test."""
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def serve() -> None:
        async with kmock.KubernetesEmulator() as handler, kmock.Server(handler) as server:
            # A real server knows these kinds before any object of them exists.
            handler.resources["batch/v1/jobs"] = {}
            handler.resources["v1/pods"] = {}
            stop = asyncio.Event()
            box.update(handler=handler, url=str(server.url).rstrip("/"), stop=stop)
            box["loop"] = asyncio.get_running_loop()
            ready.set()
            await stop.wait()

    thread = threading.Thread(target=lambda: asyncio.run(serve()), daemon=True)
    thread.start()
    if not ready.wait(60):
        raise RuntimeError("the Kubernetes emulator did not start within 60 s")
    emu = Emulator(box["url"], _kubeconfig(tmp / "kubeconfig", box["url"]), box["handler"])
    try:
        yield emu
    finally:
        emu.api.close()
        box["loop"].call_soon_threadsafe(box["stop"].set)
        thread.join(60)
