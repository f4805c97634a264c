"""The shipped Kubernetes manifests start as shipped: `podman kube play` of deploy/kubernetes's
ConfigMap, PersistentVolumeClaims and Deployment, with the image CI builds, the Deployment's
own security contexts (the root core with CHOWN and DAC_OVERRIDE only, read-only root file
system, no privilege escalation; the inbox container as uid 8470 with no capabilities), volumes
and probes. An answered workspace on the workspaces volume resumes in the pod, and /readyz and
/livez answer 200.

What is not run here, and why (docs/daemon.md, "Kubernetes"): there is no API server, so the
Namespace, ServiceAccount, Role, RoleBinding and Service are not played, and the resume runs
in the pod through the `fresh` executor instead of as a Job. The test's overrides are exactly
these, each stated where it is made:
- the ConfigMap's `executor: fresh` (no API server to make Jobs);
- a third container in the pod, the fake model (`python -m deltad.testing.fakellm`, from the
  image), and the core container's model settings pointing at it (a Job takes them from the
  Secret; the fresh executor passes the daemon's own);
- the HTTP port published on a free port of the host's 127.0.0.1 (podman publishes every
  `containerPort`, on the same port of every address by default; a cluster publishes none).
The pod has its own network namespace (podman's bridge): the probes' URLs are asked from inside
it, on its loopback, as kubelet would ask the pod. Podman 4.3 runs a liveness probe as a health
check and ignores startup and readiness probes; the test asks /readyz and /livez itself.

Required with CI=true (`.ci/run` builds the image first); skipped elsewhere when podman or the
image is missing.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from deltad.testing import FakeLLM
from tests.podman import CONTAINERS_CONF, IMAGE, missing
from tests.support.daemon import metadata_status

from ..conftest import llm_env

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "deploy" / "kubernetes"
PLAYED = ("ConfigMap", "PersistentVolumeClaim", "Deployment")
NOT_PLAYED = ("Namespace", "ServiceAccount", "Role", "RoleBinding", "Service")
DEADLINE = 240.0  # seconds: two containers' start, a scan and a resume on a loaded 2-core host
INBOX_UID = 8470  # deploy/image/Containerfile's deltad-inbox
MODEL_PORT = 18471
MODEL = {"OPENAI_BASE_URL": f"http://127.0.0.1:{MODEL_PORT}/v1", "OPENAI_API_KEY": "fake"}
FAKE_MODEL = ("python3", "-W", "ignore", "-m", "deltad.testing.fakellm", "--port", str(MODEL_PORT),
              "--final", "done")  # fmt: skip
AGENT = """name: probe
llm: {model: fake}
# The image has no bubblewrap (and a container rarely allows its namespaces): the operator's
# choice, said once per run (docs/delta.md, "Tools run sandboxed").
sandbox: {unavailable: unsandboxed}
tools:
  - name: probe
    shell: 'echo "uid=$(id -u)"'
"""
T = TypeVar("T")
PROBE = """import urllib.error, urllib.request
def get(url):
    try:
        return urllib.request.urlopen(url, timeout=5).status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0"""


def _env() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}


def _podman(*args: str, check: bool = True, timeout: float = 180) -> str:
    out = subprocess.run(
        ["podman", *args], env=_env(), capture_output=True, text=True, timeout=timeout
    )
    if check and out.returncode != 0:
        raise AssertionError(f"podman {' '.join(args[:2])} failed: {out.stderr.strip()}")
    return out.stdout + out.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def shipped() -> list[dict[str, Any]]:
    """The kustomization's resources, as shipped, in its order."""
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    docs: list[dict[str, Any]] = []
    for name in kustomization["resources"]:
        docs += [d for d in yaml.safe_load_all((MANIFESTS / name).read_text()) if d]
    return docs


def played(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What podman plays: the kinds it runs, with the overrides the module docstring lists."""
    kinds = {d["kind"] for d in docs}
    assert kinds <= {*PLAYED, *NOT_PLAYED}, kinds - {*PLAYED, *NOT_PLAYED}
    out = [d for d in docs if d["kind"] in PLAYED]
    for d in out:
        if d["kind"] == "ConfigMap":
            config = yaml.safe_load(d["data"]["deltad.yaml"])
            config["executor"] = "fresh"  # override: no API server to make Jobs
            config.pop("executors", None)
            config["log_format"] = "json"
            d["data"]["deltad.yaml"] = yaml.safe_dump(config)
        if d["kind"] == "Deployment":
            pod = d["spec"]["template"]["spec"]
            for c in pod["containers"]:
                c["image"] = IMAGE
                for port in c.get("ports", []):  # override: podman's publishing (see above)
                    port |= {"hostIP": "127.0.0.1", "hostPort": _free_port()}
                if c["name"] == "deltad":  # override: the model's settings (a Job's Secret)
                    c["env"] = [{"name": k, "value": v} for k, v in MODEL.items()]
            pod["containers"].append(  # override: the model, in the pod (no way out of it)
                {
                    "name": "model",
                    "image": IMAGE,
                    "args": [*FAKE_MODEL],
                    "securityContext": {"runAsUser": 65534, "readOnlyRootFilesystem": True},
                }
            )
    return out


def _poll(cond: Callable[[], T], what: str, logs: Callable[[], str]) -> T:
    end = time.monotonic() + DEADLINE
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {DEADLINE}s waiting for {what}:\n{logs()}")
        time.sleep(0.25)


def _proc_status(match: str) -> dict[str, str] | None:
    """/proc/PID/status of the one process whose command line has `match`."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if match.encode() in b" ".join(argv):
                lines = Path(f"/proc/{pid}/status").read_text().splitlines()
                return dict(line.split(":\t", 1) for line in lines if ":\t" in line)
    return None


def _missing(why: str) -> None:
    missing("the Kubernetes manifests' test", why)


@pytest.fixture
def image() -> str:
    if shutil.which("podman") is None:
        _missing("podman is not installed (apt-get install podman runc mmdebstrap)")
    if subprocess.run(["podman", "image", "exists", IMAGE], env=_env(), check=False).returncode:
        _missing(f"no image {IMAGE}: build it with deploy/image/build.sh")
    return IMAGE


@contextlib.contextmanager
def _volumes(claims: list[dict[str, Any]], at: Path) -> Iterator[dict[str, Path]]:
    """The claims played first, on their own: podman makes a volume of each."""
    names = [c["metadata"]["name"] for c in claims]
    for n in names:
        _podman("volume", "rm", "--force", n, check=False)
    at.write_text(yaml.safe_dump_all(claims))
    _podman("kube", "play", str(at))
    paths = {
        n: Path(_podman("volume", "inspect", "--format", "{{.Mountpoint}}", n).strip())
        for n in names
    }
    try:
        yield paths
    finally:
        for n in names:
            _podman("volume", "rm", "--force", n, check=False)


@pytest.mark.timeout(
    3 * DEADLINE + 180
)  # the claims, the pause, two waits, podman's start and stop
def test_the_shipped_manifests_start_and_an_answered_workspace_resumes(
    image: str, fake: FakeLLM, tmp_path: Path
) -> None:
    docs = shipped()
    claims = [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
    [deployment] = [d for d in docs if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    mounts = {
        m["name"]: m["mountPath"] for c in pod["containers"] for m in c.get("volumeMounts", [])
    }
    claim_of = {
        v["name"]: v["persistentVolumeClaim"]["claimName"]
        for v in pod["volumes"]
        if "persistentVolumeClaim" in v
    }
    root = next(m for name, m in mounts.items() if claim_of.get(name) == "delta-workspaces")
    fake.call("ask_human", {"prompt": "go?"}, id="q")  # the pause; the pod's model says "done"
    model = {k: v for k, v in llm_env(fake).items() if k in ("OPENAI_BASE_URL", "OPENAI_API_KEY")}
    manifest = tmp_path / "played.yaml"
    manifest.write_text(
        yaml.safe_dump_all([d for d in played(docs) if d["kind"] in PLAYED[:1] + PLAYED[2:]])
    )

    with _volumes(claims, tmp_path / "claims.yaml") as volumes:
        # A paused, answered run on the workspaces volume, made with the image's own `delta`
        # at the path the pod sees (its journal names its agent by that path).
        (volumes["delta-workspaces"] / "agent").mkdir()
        (volumes["delta-workspaces"] / "agent" / "config.yaml").write_text(AGENT)
        (volumes["delta-workspaces"] / "agent" / "system_prompt.md").write_text("Probe.\n")
        ws = f"{root}/ws1"

        def delta(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                ["podman", "run", "--rm", "--network=host",
                 f"--volume=delta-workspaces:{root}",
                 *[f"--env={k}={v}" for k, v in model.items()],
                 image, "delta", *args],
                env=_env(), capture_output=True, text=True, timeout=180,
            )  # fmt: skip

        paused = delta("run", "--agent", f"{root}/agent", "--task", "t", "-w", ws)
        assert paused.returncode == 101, paused.stdout + paused.stderr
        assert delta("respond", "-w", ws, "yes").returncode == 0
        host_ws = volumes["delta-workspaces"] / "ws1"

        try:
            _podman("kube", "play", "--replace", str(manifest))  # a pod a killed run left goes
            name = f"{deployment['metadata']['name']}-pod-0"

            def logs() -> str:
                return "\n".join(
                    f"-- {c}:\n" + _podman("logs", f"{name}-{c}", check=False)[-4000:]
                    for c in ("deltad", "inbox", "model")
                )

            def probe(path: str) -> int:
                """What kubelet's httpGet gets: asked in the pod's network namespace."""
                ask = f"{PROBE}\nprint(get('http://127.0.0.1:8470{path}'))"
                out = _podman("exec", f"{name}-inbox", "python3", "-c", ask, check=False)
                return int(out.strip().splitlines()[-1]) if out.strip()[-3:].isdigit() else 0

            _poll(lambda: metadata_status(host_ws) == "COMPLETED", "the resume to complete", logs)
            journal = (host_ws / ".delta" / "runs").rglob("journal.jsonl")
            assert any('"yes"' in j.read_text() for j in journal)
            _poll(lambda: probe("/readyz") == 200, "/readyz 200", logs)
            assert probe("/livez") == 200
            # The network is parsed by the inbox container's process: its uid, no capability.
            inbox = _proc_status("deltad inbox --connect")
            assert inbox is not None, logs()
            assert inbox["Uid"].split()[:2] == [str(INBOX_UID)] * 2
            assert int(inbox["CapEff"], 16) == 0 and inbox["NoNewPrivs"].strip() == "1"
            core = _proc_status("deltad serve --config /etc/deltad/deltad.yaml")
            assert core is not None and core["Uid"].split()[0] == "0"
            events = [json.loads(x) for x in logs().splitlines() if x.startswith("{")]
            assert "inbox_spawn_failed" not in {e.get("event") for e in events}
        finally:
            _podman("kube", "down", str(manifest), check=False)
