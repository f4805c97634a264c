"""A Kubernetes API server for tests: kmock's in-memory emulator, over real HTTP on 127.0.0.1.

It stores objects, answers 409 to a second create of a name, lists, patches and deletes — and
runs no controllers: a test plays the Job controller and the kubelet by writing the pod objects
and statuses they would (`play_pod`, `set_job_status`). Two things it does not do that a real
server does, both covered by the executor: it ignores `labelSelector` (the executor filters
what it lists again) and it assigns no `metadata.uid` (the handle then carries the Job's name).
`Kubelet` plays the node for a real `deltad` process: it runs each Job's command as the pod's
user and reports its exit (tests/e2e/test_kube_daemon.py).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import math
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
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


def _now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class _Pod:
    """One Job's process, as the kubelet runs it."""

    job: str
    proc: subprocess.Popen[bytes]
    uid: int
    kill_at: float | None = None  # monotonic: SIGKILL then (a delete's grace period)
    ended: int | None = None  # the process's return code once reaped


@dataclass
class Kubelet:
    """The node, for a real `deltad` talking to the emulator: each new Job's command runs as
    its pod's `runAsUser`/`runAsGroup`/`supplementalGroups`, in its `workingDir` (the claim is
    mounted at the same path as on the daemon's host), with the Job's environment and its
    `envFrom` Secret; the Job's status says it runs; at the process's exit the pod is written
    with the container's terminated exit code (128+n for a signal, as a container runtime
    reports it) and the Job gets its Complete/Failed condition. A Job deleted while its process
    runs gets SIGTERM, then SIGKILL after the delete's `gracePeriodSeconds`. A loop in its own
    thread, as a node's agent is; the tests wait on what it reports."""

    emu: Emulator
    log: Path  # every process's stdout and stderr, appended
    ns: str = "default"
    pods: dict[str, _Pod] = field(default_factory=dict)
    graces: dict[str, int] = field(default_factory=dict)  # a deleted Job's grace period
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    error: BaseException | None = None

    def __enter__(self) -> Kubelet:
        self._thread = threading.Thread(target=self._loop, name="kubelet", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)
        for pod in self.pods.values():
            if pod.proc.poll() is None:
                os.killpg(pod.proc.pid, signal.SIGKILL)
                pod.proc.wait(60)

    def running(self, job: str) -> bool:
        pod = self.pods.get(job)
        return pod is not None and pod.ended is None

    def _loop(self) -> None:
        while not self._stop.wait(0.05):
            try:
                self._turn()
            except Exception as e:  # an emulator hiccup: said by `error`, tried again
                self.error = e

    def _turn(self) -> None:
        jobs = {j.metadata.name: j for j in self.emu.batch.list_namespaced_job(self.ns).items}
        for name, job in jobs.items():
            if name not in self.pods and not (job.status and job.status.conditions):
                self._start(job)
        for name, pod in list(self.pods.items()):
            if pod.ended is not None:
                continue
            if name not in jobs and pod.kill_at is None:
                self._delete(name, pod)
            if pod.kill_at is not None and time.monotonic() >= pod.kill_at:
                os.killpg(pod.proc.pid, signal.SIGKILL)
                pod.kill_at = math.inf
            if (rc := pod.proc.poll()) is not None:
                pod.ended = rc
                if name in jobs:
                    self._report(name, rc)

    def _start(self, job: Any) -> None:
        pod = job.spec.template.spec
        [c] = pod.containers
        ctx = pod.security_context
        env = {e.name: e.value for e in c.env or []}
        for source in c.env_from or []:
            secret = self.emu.core.read_namespaced_secret(source.secret_ref.name, self.ns)
            env.update({k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()})
        with open(self.log, "ab") as out:
            proc = subprocess.Popen(
                c.command,
                cwd=c.working_dir,
                env=env,
                user=ctx.run_as_user,
                group=ctx.run_as_group,
                extra_groups=ctx.supplemental_groups or [],
                umask=0o022,
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.pods[job.metadata.name] = _Pod(job.metadata.name, proc, ctx.run_as_user)
        status = {"startTime": _now_iso(), "active": 1, "ready": 1}
        self.emu.set_job_status(job.metadata.name, status, self.ns)

    def _delete(self, name: str, pod: _Pod) -> None:
        """The Job is gone (deleted): stop its process as a kubelet stops a pod's container."""
        deletes = [
            r
            for r in list(self.emu.handler)
            if r.method.name == "DELETE" and r.url.path.endswith(f"/jobs/{name}")
        ]
        grace = int(dict(deletes[-1].params).get("gracePeriodSeconds", 30)) if deletes else 30
        self.graces[name] = grace
        os.killpg(pod.proc.pid, signal.SIGTERM)
        pod.kill_at = time.monotonic() + grace

    def _report(self, name: str, rc: int) -> None:
        code, reason = (rc, "Completed" if rc == 0 else "Error") if rc >= 0 else (128 - rc, "Error")
        self.emu.play_pod(name, code, reason, self.ns)
        condition = (
            {"type": "Complete", "status": "True", "reason": "CompletionsReached"}
            if rc == 0
            else {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}
        )
        done = {"succeeded": 1} if rc == 0 else {"failed": 1}
        status = {"active": 0, "ready": 0, **done, "conditions": [condition]}
        self.emu.set_job_status(name, status, self.ns)


class HangingProxy:
    """A TCP proxy to the emulator that can hang: while `hung()` is open it takes connections
    and bytes and answers nothing (an API server stopped mid-flight, as with SIGSTOP), then
    passes everything on again. `kubeconfig` points a client at it."""

    def __init__(self, emu: Emulator, tmp: Path) -> None:
        host, _, port = emu.url.removeprefix("http://").partition(":")
        self.upstream = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.kubeconfig = _kubeconfig(tmp / "kubeconfig-proxy", url)
        self.open = threading.Event()
        self.open.set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @contextlib.contextmanager
    def hung(self) -> Iterator[None]:
        self.open.clear()
        try:
            yield
        finally:
            self.open.set()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            upstream = socket.create_connection(self.upstream)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        src.settimeout(0.2)
        try:
            while not self._stop.is_set():
                self.open.wait()
                try:
                    data = src.recv(65536)
                except TimeoutError:
                    continue
                if not data:
                    break
                while not self.open.is_set():  # hung: hold what came in, answer nothing
                    self.open.wait(0.2)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._stop.set()
        self.open.set()
        self.listener.close()
        self._thread.join()
