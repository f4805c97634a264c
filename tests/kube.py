"""A Kubernetes API server for tests: kmock's in-memory emulator, over real HTTP on 127.0.0.1.

It stores objects, answers 409 to a second create of a name, lists, patches and deletes, and
serves watches as an API server does (`WatchingEmulator`: a resourceVersion per change, a
watch from a list's resourceVersion, bookmarks, 410 Gone once a version is expired, a stream a
test can drop) — and runs no controllers: a test plays the Job controller and the kubelet by
writing the pod objects and statuses they would (`play_pod`, `set_job_status`). Two things it
does not do that a real server does, both covered by the executor: it ignores `labelSelector`
(the executor filters what it lists again) and it assigns no `metadata.uid` (the handle then
carries the Job's name).
`Kubelet` plays the node for a real `deltad` process: it runs each Job's command as the pod's
user and reports its exit (tests/e2e/test_kube_daemon.py).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import math
import os
import signal
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import attrs
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


@attrs.frozen
class _Gone(kmock.KubernetesError):
    status: int = 410
    reason: str = "Expired"
    message: str = "too old resource version"


class _Journal:
    """What kmock's emulator takes for a resource's event bus: each change it puts is a change
    of the server's, stamped with the next resourceVersion and kept for the watches."""

    def __init__(self, server: WatchingEmulator, resource: Any) -> None:
        self.server, self.resource = server, resource

    async def put(self, event: dict[str, Any]) -> None:
        self.server.record(self.resource, event)


class _Journals(dict[Any, _Journal]):
    def __init__(self, server: WatchingEmulator) -> None:
        super().__init__()
        self.server = server

    def __missing__(self, resource: Any) -> _Journal:
        journal = self[resource] = _Journal(self.server, resource)
        return journal


@attrs.define(kw_only=True)
class WatchingEmulator(kmock.KubernetesEmulator):
    """kmock's emulator with an API server's watch semantics (kmock's own watch replays every
    object and has no versions): one counter of resourceVersions across the server; a list
    says the version it is as of; a watch from version N streams every change after N (only
    the watched resource and namespace), a BOOKMARK with the current version when nothing
    happened for `bookmark_every` seconds (if asked with allowWatchBookmarks), and ends after
    timeoutSeconds. `expire()` compacts the history: a watch from an older version gets an
    ERROR event with code 410 (as the watch cache answers), as do the streams open then.
    `drop()` breaks every open stream (the connection reset, no clean end). The label selector
    is ignored, as kmock does for lists (the executor checks what it is sent)."""

    bookmark_every: float = 0.5
    gone_as_http: bool = False  # a watch from an expired version: HTTP 410, not an ERROR event
    rv: int = attrs.field(default=0, init=False)
    floor: int = attrs.field(default=0, init=False)  # versions below it are expired
    history: list[tuple[int, Any, dict[str, Any]]] = attrs.field(factory=list, init=False)
    versions: dict[tuple[Any, Any, str], int] = attrs.field(factory=dict, init=False)
    streams: int = attrs.field(default=0, init=False)  # watch streams open now
    closing: bool = attrs.field(default=False, init=False)
    _tick: asyncio.Event | None = attrs.field(default=None, init=False)
    _drops: int = attrs.field(default=0, init=False)
    _expiries: int = attrs.field(default=0, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._buses = _Journals(self)

    def _changed(self) -> None:
        if self._tick is not None:
            self._tick.set()
        self._tick = asyncio.Event()

    def record(self, resource: Any, event: dict[str, Any]) -> None:
        """A change (under kmock's lock): the next version, kept for the watches."""
        self.rv += 1
        event = copy.deepcopy(event)
        meta = event["object"].setdefault("metadata", {})
        meta["resourceVersion"] = str(self.rv)
        name = meta.get("name", "")
        if not meta.get("namespace"):  # made with the namespace in the URL only
            found = [ns for res, ns, n in self._objects if res == resource and n == name]
            meta["namespace"] = found[0] if found else None
        key = (resource, meta["namespace"], name)
        self.versions[key] = self.rv
        self.history.append((self.rv, resource, event))
        self._changed()

    def expire(self, streams: bool = True) -> None:
        """Compact: every version so far is too old to watch from; the open streams get an
        ERROR 410 unless `streams` is False (they go on, and break at a `drop()`)."""
        self.rv += 1
        self.floor = self.rv
        self._expiries += streams
        self.history.clear()
        self._changed()

    def drop(self) -> None:
        """Break every open watch stream."""
        self._drops += 1
        self._changed()

    def shut(self) -> None:
        """Break every stream, now and to come (the server's shutdown waits for open ones)."""
        self.closing = True
        self.drop()

    def _stamped(self, key: tuple[Any, Any, str], raw: dict[str, Any]) -> dict[str, Any]:
        raw = copy.deepcopy(raw)
        raw.setdefault("metadata", {})["resourceVersion"] = str(self.versions.get(key, self.rv))
        return raw

    def _mine(self, request: Any, resource: Any, ns: str | None) -> bool:
        return bool(resource == request.resource and request.namespace in (None, ns))

    async def _serve_list(self, request: Any) -> Any:
        await super()._serve_list(request)  # (its 404 for an unknown resource)
        async with self._lock:
            items = [
                self._stamped(key, obj.raw)
                for key, obj in self._objects.items()
                if self._mine(request, key[0], key[1]) and not obj.deleted
            ]
            return {"metadata": {"resourceVersion": str(self.rv)}, "items": items}

    def _serve_watch(self, request: Any) -> Any:
        since = request.params.get("resourceVersion") or ""
        if since not in ("", "0") and int(since) < self.floor:
            if self.gone_as_http:  # as a server answers without its watch cache
                raise _Gone(message=f"too old resource version: {since} ({self.floor})")
            return self._gone(since)
        return self._stream(request, since)

    async def _gone(self, since: str) -> Any:
        yield b""
        yield {"type": "ERROR", "object": self._status(since)}

    def _status(self, since: str) -> dict[str, Any]:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": f"too old resource version: {since} ({self.floor})",
            "reason": "Expired",
            "code": 410,
        }

    async def _stream(self, request: Any, since: str) -> Any:
        yield b""  # the headers now: a quiet watch is still open
        params = request.params
        bookmarks = params.get("allowWatchBookmarks") in ("true", "1")
        loop = asyncio.get_running_loop()
        limit = float(params.get("timeoutSeconds") or 0)
        end = loop.time() + limit if limit else math.inf
        drops, expiries = self._drops, self._expiries
        self.streams += 1
        try:
            if since in ("", "0"):
                cursor = self.rv
                for key, obj in list(self._objects.items()):
                    if self._mine(request, key[0], key[1]) and not obj.deleted:
                        yield {"type": "ADDED", "object": self._stamped(key, obj.raw)}
            else:
                cursor = int(since)
            quiet_since = loop.time()
            while True:
                if self._drops != drops or self.closing:
                    request._raw_request.transport.abort()  # a reset, not a clean end
                    return
                if self._expiries != expiries:
                    yield {"type": "ERROR", "object": self._status(str(cursor))}
                    return
                for rv, resource, event in list(self.history):
                    if rv <= cursor:
                        continue
                    cursor = rv
                    ns = event["object"]["metadata"].get("namespace")
                    if self._mine(request, resource, ns):
                        quiet_since = loop.time()
                        yield event
                cursor = max(cursor, self.rv)
                now = loop.time()
                if now >= end:
                    return
                if bookmarks and now - quiet_since >= self.bookmark_every:
                    quiet_since = now
                    kind = {"kind": "Job", "apiVersion": "batch/v1"}
                    yield {
                        "type": "BOOKMARK",
                        "object": {**kind, "metadata": {"resourceVersion": str(cursor)}},
                    }
                    continue
                if self._tick is None:
                    self._tick = asyncio.Event()
                tick = self._tick
                wait = min(end - now, self.bookmark_every - (now - quiet_since))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(tick.wait(), max(0.01, wait))
        finally:
            self.streams -= 1


@dataclass
class Emulator:
    url: str
    kubeconfig: Path
    handler: Any
    loop: Any = None  # the emulator's event loop (its own thread)
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

    def _in_loop(self, fn: Any) -> None:
        """Run `fn` on the emulator's loop (it owns the server's state) and wait for it."""
        done = threading.Event()

        def run() -> None:
            try:
                fn()
            finally:
                done.set()

        self.loop.call_soon_threadsafe(run)
        assert done.wait(60), "the emulator's loop did not run a call within 60 s"

    def expire(self, drop: bool = False) -> None:
        """Every resourceVersion so far expired: watches from them get 410 Gone. The open
        streams get an ERROR 410; with `drop`, they break instead (in the same step: no
        bookmark between can move them past the expiry), and are watched again from there."""

        def step() -> None:
            self.handler.expire(streams=not drop)
            if drop:
                self.handler.drop()

        self._in_loop(step)

    def drop(self) -> None:
        """Every open watch stream broken (its connection reset)."""
        self._in_loop(self.handler.drop)

    def lists(self, plural: str = "jobs") -> int:
        """Lists of `plural` by label selector (the executor's; the test kubelet's have none)."""
        return sum(
            1
            for r in list(self.handler)
            if r.action is not None
            and r.action.name == "LIST"
            and r.resource.plural == plural
            and "labelSelector" in r.params
        )

    def watches(self, plural: str = "jobs") -> list[str]:
        """The resourceVersion each watch of `plural` was asked from, in order."""
        return [
            r.params.get("resourceVersion", "")
            for r in list(self.handler)
            if r.action is not None and r.action.name == "WATCH" and r.resource.plural == plural
        ]

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
        async with WatchingEmulator() as handler, kmock.Server(handler) as server:
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
    url = box["url"]
    emu = Emulator(url, _kubeconfig(tmp / "kubeconfig", url), box["handler"], box["loop"])
    try:
        yield emu
    finally:
        emu.api.close()
        box["loop"].call_soon_threadsafe(box["handler"].shut)  # (its wait for open watches)
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
            parked = job.spec is not None and job.spec.suspend  # no pod while suspended
            if name not in self.pods and not (job.status and job.status.conditions) and not parked:
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
    passes everything on again; while `down()` is open the server is stopped: every connection
    open then is reset, and each new one too. `kubeconfig` points a client at it."""

    def __init__(self, emu: Emulator, tmp: Path) -> None:
        host, _, port = emu.url.removeprefix("http://").partition(":")
        self.upstream = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.kubeconfig = _kubeconfig(tmp / "kubeconfig-proxy", url)
        self.open = threading.Event()
        self.open.set()
        self.stopped = threading.Event()
        self._conns: set[socket.socket] = set()
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

    @contextlib.contextmanager
    def down(self) -> Iterator[None]:
        self.stopped.set()
        for conn in list(self._conns):
            _reset(conn)
        try:
            yield
        finally:
            self.stopped.clear()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self.stopped.is_set():
                _reset(client)
                continue
            upstream = socket.create_connection(self.upstream)
            self._conns.update((client, upstream))
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
            self._conns.discard(src)

    def close(self) -> None:
        self._stop.set()
        self.open.set()
        self.listener.close()
        self._thread.join()


def _reset(conn: socket.socket) -> None:
    """Close with a reset (no FIN): what a client sees of a server that went away."""
    with contextlib.suppress(OSError):
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.shutdown(socket.SHUT_RDWR)
