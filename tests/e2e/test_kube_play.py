"""The shipped Kubernetes manifests (deploy/kubernetes), played by `podman kube play` with the image
CI builds (deploy/image/build.sh): the daemon's pod starts under the Deployment's own security
context and passes its probes; a workspace paused by `delta` and then answered through the
inbox's HTTP API resumes inside the pod; /livez and /readyz are 200 afterwards.

What is played: the kustomization's PersistentVolumeClaims (as podman volumes), its ConfigMap
and its Deployment's pod as written: both containers with their args, securityContext
(runAsUser, runAsGroup, the capabilities, allowPrivilegeEscalation as no_new_privs,
readOnlyRootFilesystem, RuntimeDefault seccomp: each container's first process is read back
from /proc and podman's inspect, so the run below ran under them), volumes and ports. The image
is `DELTAD_IMAGE`, default `localhost/deltad:<version>`, the Deployment's own; required with
CI=true, skipped elsewhere without podman or the image (tests/podman.py).

The run: the test makes a token in the daemon's container (`podman exec`, as `kubectl exec`
would), pauses a run of examples/hello-agent there with the image's `delta` against the fake
model (examples/fake-model/yes_no.yaml), finds the question with GET /v1/requests on the pod's
IP and answers it with POST .../answer: the inbox's container serves the port the core bound
and relays the answer to the core over their shared socket. The core resumes the run; the test
waits for COMPLETED and the answer in the run's journal.

What differs from a cluster, and why (there is no API server here):
- The Namespace, ServiceAccount, Role, RoleBinding and Service are not played (podman plays
  none of them) and no Job is made: the ConfigMap's `executor: kubernetes` becomes `fresh` (a
  process in the daemon's container), its `executors:` settings are dropped, and the root gets
  `credentials:` naming a file on the state volume with the fake model's address (what a Job
  gets from the Secret `env_from_secret`). That is the whole override: the test checks that
  no other key of the ConfigMap's `deltad.yaml` differs.
- So the resume runs in the pod as the daemon's own uid, root, and the test's workspace is
  root's: the daemon's container has no SETUID (by design: in a cluster each resume is a Job
  under its owner's uid; tests/e2e/test_kube_contract.py, and the opt-in test_kube_cluster.py).
- Probes: podman 4.3 ignores startupProbe and readinessProbe and turns a livenessProbe into a
  health check that runs `curl` (not in the image) on port 0 (it does not resolve a named
  port) from a systemd timer (none here). So the test is the kubelet: it GETs each probe's path
  on the pod's IP and the port the probe names, with the probe's timeoutSeconds, and counts
  200-399 as passing. A kubelet's restarts on failing probes are not exercised.
- The service account's token: podman mounts none, so the inbox container's emptyDir over the
  token's path is not tested against a real token.
- Names get a per-run suffix: kustomize's nameSuffix on the claims and the ConfigMap (and the
  references to them), and on the pod's volume names too, because podman 4.3 makes each
  emptyDir a machine-wide named volume shared by every pod that names it alike. Two runs on one
  machine never meet. The image is replaced by `DELTAD_IMAGE` where that differs.

The pod has its own network namespace on podman's bridge (what `kube play` does); the fake
model runs from the host inside that namespace (nsenter) on its 127.0.0.1, so nothing listens
beyond loopback or the pod. Everything made is removed at the end (`podman kube down`, then the
volumes podman keeps), each step bounded in time.
"""

from __future__ import annotations

import contextlib
import copy
import re
import select
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from deltad.testing.daemon import metadata_status

from ..podman import REPO, call, events, podman, status, the_image
from ..podman import env as podman_env

DEPLOY = REPO / "deploy" / "kubernetes"
SCRIPT = REPO / "examples" / "fake-model" / "yes_no.yaml"
AGENT = REPO / "examples" / "hello-agent"
DEADLINE = 240.0  # seconds: a pod's start, or a resume, on a loaded 2-core machine
PLAYED = {"PersistentVolumeClaim", "ConfigMap", "Deployment"}
NOT_PLAYED = {"Namespace", "ServiceAccount", "Role", "RoleBinding", "Service"}
CONFIG = "/etc/deltad/deltad.yaml"  # where the Deployment mounts the ConfigMap
MODEL_ENV = "model.env"  # on the state volume: the `credentials:` file of the override
# linux/capability.h, in bit order: a container's CapEff is checked against its `add:` list.
# fmt: off
CAPS = (
    "CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID",
    "SETPCAP", "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW",
    "IPC_LOCK", "IPC_OWNER", "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT",
    "SYS_ADMIN", "SYS_BOOT", "SYS_NICE", "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD",
    "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP", "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG",
    "WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF", "CHECKPOINT_RESTORE",
)
# fmt: on
T = TypeVar("T")


@pytest.fixture
def image() -> str:
    return the_image("the Kubernetes manifests' run")


def shipped() -> list[dict[str, Any]]:
    """Every object the kustomization applies, in its order."""
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    return [
        doc
        for name in kustomization["resources"]
        for doc in yaml.safe_load_all((DEPLOY / name).read_text())
    ]


def overridden(config_text: str) -> dict[str, Any]:
    """The ConfigMap's deltad.yaml with the executor run in the pod (the module's docstring)."""
    config: dict[str, Any] = yaml.safe_load(config_text)
    assert config.pop("executor") == "kubernetes"
    config.pop("executors")
    config["executor"] = "fresh"
    [root] = config["roots"]
    assert "credentials" not in root
    root["credentials"] = f"{config['state_dir']}/{MODEL_ENV}"
    return config


def rendered(suffix: str, image: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The claims, then the ConfigMap and the Deployment, as played here."""
    docs = shipped()
    kinds = {d["kind"] for d in docs}
    assert kinds == PLAYED | NOT_PLAYED, (
        f"deploy/kubernetes has {sorted(kinds - PLAYED - NOT_PLAYED)}: say here whether podman"
        " plays it"
    )
    claims, rest = [], []
    for doc in copy.deepcopy([d for d in docs if d["kind"] in PLAYED]):
        doc["metadata"]["name"] += suffix
        if doc["kind"] == "PersistentVolumeClaim":
            claims.append(doc)
        elif doc["kind"] == "ConfigMap":
            before = yaml.safe_load(doc["data"]["deltad.yaml"])
            after = overridden(doc["data"]["deltad.yaml"])
            changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
            assert changed == {"executor", "executors", "roots"}
            doc["data"]["deltad.yaml"] = yaml.safe_dump(after, sort_keys=False)
            rest.append(doc)
        else:
            pod = doc["spec"]["template"]["spec"]
            for volume in pod["volumes"]:
                volume["name"] += suffix
                if "persistentVolumeClaim" in volume:
                    volume["persistentVolumeClaim"]["claimName"] += suffix
                if "configMap" in volume:
                    volume["configMap"]["name"] += suffix
            for container in pod["containers"]:
                container["image"] = image
                for mount in container.get("volumeMounts", []):
                    mount["name"] += suffix
            rest.append(doc)
    return claims, rest


@dataclass
class Pod:
    name: str
    ip: str
    netns: str  # /proc/PID/ns/net of the pod's infra container
    containers: dict[str, str]  # the manifest's container name -> podman's


def _poll(cond: Callable[[], T], what: str, logs: Callable[[], str]) -> T:
    end = time.monotonic() + DEADLINE
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {DEADLINE}s waiting for {what}:\n{logs()}")
        time.sleep(0.25)


def _write_yaml(path: Path, docs: list[dict[str, Any]]) -> Path:
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return path


def _volume_dir(name: str) -> Path:
    return Path(podman("volume", "inspect", "--format", "{{.Mountpoint}}", name).strip())


def _pod(pod_id: str, spec: dict[str, Any]) -> Pod:
    fmt = "{{.Name}} {{.InfraContainerID}}"
    name, infra = podman("pod", "inspect", "--format", fmt, pod_id).split()
    fmt = "{{.State.Pid}} {{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}"
    pid, ip = podman("inspect", "--format", fmt, infra).split()
    containers = {c["name"]: f"{name}-{c['name']}" for c in spec["containers"]}
    return Pod(name, ip, f"/proc/{pid}/ns/net", containers)


@contextlib.contextmanager
def _kube(path: Path, volumes: list[str]) -> Iterator[str]:
    """`podman kube play` of a file (its output); at the end `kube down` and the volumes
    podman made for it removed (it keeps them)."""
    try:
        yield podman("kube", "play", str(path), timeout=DEADLINE)
    finally:
        podman("kube", "down", str(path), check=False, timeout=DEADLINE)
        for volume in volumes:
            podman("volume", "rm", "--force", volume, check=False)


def _proc_status(container: str) -> dict[str, str]:
    pid = podman("inspect", "--format", "{{.State.Pid}}", container).strip()
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}


def _caps(names: list[str]) -> int:
    return sum(1 << CAPS.index(n) for n in names)


def _check_security_context(pod: Pod, spec: dict[str, Any]) -> None:
    """What the kernel says of each container's first process is what its securityContext
    asks: podman applied it, so the run below ran under it."""
    for c in spec["containers"]:
        sc = c["securityContext"]
        proc = _proc_status(pod.containers[c["name"]])
        ids = f"{sc['runAsUser']}\t{sc['runAsUser']}\t{sc['runAsUser']}\t{sc['runAsUser']}"
        assert proc["Uid"] == ids, (c["name"], proc["Uid"])
        if "runAsGroup" in sc:
            assert proc["Gid"].split("\t")[0] == str(sc["runAsGroup"])
        assert sc["capabilities"]["drop"] == ["ALL"]
        want = _caps(sc["capabilities"].get("add", []))
        assert int(proc["CapEff"], 16) == want, (c["name"], proc["CapEff"])
        assert int(proc["CapBnd"], 16) == want, (c["name"], proc["CapBnd"])
        assert sc["allowPrivilegeEscalation"] is False and proc["NoNewPrivs"] == "1"
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"} and proc["Seccomp"] == "2"
        rofs = podman(
            "inspect", "--format", "{{.HostConfig.ReadonlyRootfs}}", pod.containers[c["name"]]
        )
        assert sc["readOnlyRootFilesystem"] is True and rofs.strip() == "true"


def _probes(pod: Pod, spec: dict[str, Any]) -> dict[str, int]:
    """Each probe as the kubelet makes it: its status, 0 when nothing answered in time."""
    found = {}
    for c in spec["containers"]:
        ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
        for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
            if (probe := c.get(kind)) is None:
                continue
            get = probe["httpGet"]
            port = ports.get(get["port"], get["port"])
            url = f"http://{pod.ip}:{port}{get['path']}"
            found[f"{c['name']}.{kind}"] = status(url, timeout=probe.get("timeoutSeconds", 1))
    return found


def _all_pass(pod: Pod, spec: dict[str, Any]) -> dict[str, int] | None:
    got = _probes(pod, spec)
    return got if got and all(200 <= s < 400 for s in got.values()) else None


@contextlib.contextmanager
def _fake_model(pod: Pod) -> Iterator[str]:
    """The fake model in the pod's network namespace, on its loopback: its URL."""
    argv = ["nsenter", f"--net={pod.netns}", "--", sys.executable, "-W", "ignore::RuntimeWarning"]
    argv += ["-m", "deltad.testing.fakellm", "--script", str(SCRIPT)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        url = proc.stdout.readline().strip() if ready else ""
        assert url.startswith("http://127.0.0.1:"), f"the fake model did not start: {url!r}"
        yield url
    finally:
        proc.kill()
        proc.wait(10)


def _exec(
    container: str, *argv: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    opts = [f"--env={k}={v}" for k, v in (env or {}).items()]
    return subprocess.run(
        ["podman", "exec", *opts, container, *argv],
        env=podman_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _mounted(spec: dict[str, Any], path: str) -> str:
    """The claim mounted at `path` in the pod."""
    claims = {
        v["name"]: v["persistentVolumeClaim"]["claimName"]
        for v in spec["volumes"]
        if "persistentVolumeClaim" in v
    }
    [claim] = {
        claims[m["name"]]
        for c in spec["containers"]
        for m in c.get("volumeMounts", [])
        if m["mountPath"] == path
    }
    return claim


@pytest.mark.timeout(6 * DEADLINE + 120)
def test_the_shipped_manifests_start_the_daemon_and_resume_an_answered_workspace_in_the_pod(
    image: str, tmp_path: Path
) -> None:
    if shutil.which("nsenter") is None:
        pytest.fail("nsenter (util-linux) is needed to run the fake model in the pod's network")
    claims, rest = rendered(f"-t{uuid.uuid4().hex[:8]}", image)
    [configmap] = [d for d in rest if d["kind"] == "ConfigMap"]
    [deployment] = [d for d in rest if d["kind"] == "Deployment"]
    spec = deployment["spec"]["template"]["spec"]
    config = yaml.safe_load(configmap["data"]["deltad.yaml"])
    [root] = config["roots"]
    # What podman makes of the pod's other volumes: an emptyDir by its volume's name, a
    # configMap by the ConfigMap's (removed with the claims' at the end).
    pod_volumes = [v["name"] for v in spec["volumes"] if "emptyDir" in v]
    pod_volumes += [v["configMap"]["name"] for v in spec["volumes"] if "configMap" in v]
    with contextlib.ExitStack() as stack:
        # The claims first, as volumes: the agent goes on the workspaces' (the pod sees it
        # under the root), the model's address on the state volume (once the model runs).
        claimed = _write_yaml(tmp_path / "claims.yaml", claims)
        stack.enter_context(_kube(claimed, [c["metadata"]["name"] for c in claims]))
        workspaces = _volume_dir(_mounted(spec, root["path"]))
        state = _volume_dir(_mounted(spec, config["state_dir"]))
        shutil.copytree(AGENT, workspaces / "agent")

        out = stack.enter_context(_kube(_write_yaml(tmp_path / "pod.yaml", rest), pod_volumes))
        [pod_id] = re.findall(r"^Pod:\n([0-9a-f]{64})$", out, re.M)
        pod = _pod(pod_id, spec)
        core = pod.containers["deltad"]

        def logs() -> str:
            return "\n".join(
                f"--- {name}:\n" + podman("logs", "--tail", "40", ctr, check=False)
                for name, ctr in pod.containers.items()
            )

        _poll(lambda: _all_pass(pod, spec), "every probe to pass", logs)
        _check_security_context(pod, spec)
        # The port is served by the inbox's container, connected as its own uid.
        [inbox] = [c for c in spec["containers"] if c["args"][:2] == ["deltad", "inbox"]]
        connected = events(podman("logs", core), "inbox_connected")
        assert [e["uid"] for e in connected] == [inbox["securityContext"]["runAsUser"]]

        url = stack.enter_context(_fake_model(pod))
        model = state / MODEL_ENV
        model.write_text(f"OPENAI_BASE_URL={url}\nOPENAI_API_KEY=fake\n")
        model.chmod(0o600)

        # An operator's token, made as the docs say (`kubectl exec ... deltad token add`).
        made = _exec(core, "deltad", "token", "add", "tester", "--config", CONFIG)
        assert made.returncode == 0, made.stderr
        token = made.stdout.strip().splitlines()[-1]
        # Paused in the pod by the image's `delta`, as root (the module's docstring).
        ws = f"{root['path']}/ws1"
        model_env = {"OPENAI_BASE_URL": url, "OPENAI_API_KEY": "fake"}
        agent = f"{root['path']}/agent"
        paused = _exec(
            core, "delta", "run", "--agent", agent, "--task", "t", "-w", ws, env=model_env
        )
        assert paused.returncode == 101, paused.stdout + paused.stderr

        # Answered through the inbox: the HTTP port the core bound, served by the inbox's
        # container, whose calls reach the core over the Unix socket they share.
        [port] = [p["containerPort"] for c in spec["containers"] for p in c.get("ports", [])]
        api = f"http://{pod.ip}:{port}"

        def waiting() -> list[dict[str, Any]]:
            code, body = call("GET", f"{api}/v1/requests", token)
            return list(body["requests"]) if code == 200 else []

        [request] = _poll(waiting, "the question in the inbox", logs)
        answer = {"answer": "yes"}
        code, body = call(
            "POST", f"{api}/v1/requests/{request['request_id']}/answer", token, answer
        )
        assert code == 202, body

        host_ws = workspaces / "ws1"
        _poll(lambda: metadata_status(host_ws) == "COMPLETED", "the resume to complete", logs)
        [spawned] = events(podman("logs", core), "resume_spawned")
        assert spawned["uid"] == 0 and spawned["executor"] == "fresh"
        # The model was told the answer given on the inbox (the script's last step).
        [journal] = host_ws.glob(".delta/runs/*/execution/journal.jsonl")
        assert "Slow tests: yes." in journal.read_text()
        after = _probes(pod, spec)
        assert after and set(after.values()) == {200}, after
