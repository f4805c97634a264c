"""Opt-in: the Kubernetes executor against a real cluster (kind, k3s, a cloud one).

What the emulator cannot show runs here: a real Job controller and kubelet — the pod runs as
the owner's uid in its workspace on the claim, its exit code comes back, a cancel's TERM arrives,
`activeDeadlineSeconds` fires. Skipped unless `DELTAD_TEST_KUBECONFIG` names a kubeconfig.

    DELTAD_TEST_KUBECONFIG=~/.kube/config        the cluster (required)
    DELTAD_TEST_KUBE_NAMESPACE=default           where the test's claim and Jobs go
    DELTAD_TEST_KUBE_IMAGE=busybox:1.36          any image with `sh`
    DELTAD_TEST_KUBE_STORAGE_CLASS=              a class for the test's claim (RWO is enough
                                                 on a one-node cluster); default: the cluster's

Needs no container runtime here; the cluster pulls the image. Everything it makes is labelled
with a fresh daemon id and deleted at the end.
"""

from __future__ import annotations

import os
import select
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deltad.executors.kubernetes import KubernetesExecutor, make_kubernetes_executor
from deltad.executors.seam import Event, Exit, Identity, JobSpec, RequestKey, Started
from tests.support.daemon import wait_for

KUBECONFIG = os.environ.get("DELTAD_TEST_KUBECONFIG")
pytestmark = pytest.mark.skipif(
    not KUBECONFIG,
    reason="needs a real cluster: set DELTAD_TEST_KUBECONFIG to a kubeconfig (kind, k3s, ...)",
)
NAMESPACE = os.environ.get("DELTAD_TEST_KUBE_NAMESPACE", "default")
IMAGE = os.environ.get("DELTAD_TEST_KUBE_IMAGE", "busybox:1.36")
MOUNT = "/srv/deltad-test"
DEADLINE = 600.0  # a cold cluster pulls the image and binds the claim first


@pytest.fixture(scope="module")
def claim() -> Iterator[str]:
    k8s = pytest.importorskip("kubernetes.client")
    from kubernetes import config

    api = config.new_client_from_config(config_file=KUBECONFIG)
    name = f"deltad-test-{uuid.uuid4().hex[:8]}"
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "64Mi"}}},
    }
    if cls := os.environ.get("DELTAD_TEST_KUBE_STORAGE_CLASS"):
        body["spec"]["storageClassName"] = cls
    core = k8s.CoreV1Api(api)
    core.create_namespaced_persistent_volume_claim(NAMESPACE, body)
    try:
        yield name
    finally:
        core.delete_namespaced_persistent_volume_claim(name, NAMESPACE)
        api.close()


@pytest.fixture
def executor(claim: str, tmp_path: Path) -> Iterator[KubernetesExecutor]:
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o700)
    ex = make_kubernetes_executor.build(
        {
            "image": IMAGE,
            "pvc": claim,
            "mount_path": MOUNT,
            "namespace": NAMESPACE,
            "daemon_id": f"test-{uuid.uuid4().hex[:8]}",
            "kubeconfig": KUBECONFIG,
            "poll_every": 1,
            "cancel_grace": 5,
            "deadline_margin": 0,
            "ttl_after_finished": 600,
        },
        state_dir,
    )
    try:
        yield ex
    finally:
        for handle in list(ex.tracked().values()):
            ex.cancel(handle.handle, True)
        ex.close()


def job(argv: list[str], timeout: float = DEADLINE) -> JobSpec:
    # The claim's root is the workspace: a fresh claim is writable by root only, so the script
    # writes nothing; it reports its uid and working directory through its exit code and log.
    key = RequestKey(Path(MOUNT), uuid.uuid4().hex, "r1")
    return JobSpec(key, argv, Identity(1000, 1000, (1000,)), {"LANG": "C.UTF-8"}, timeout)


def until_exit(ex: KubernetesExecutor) -> tuple[list[Event], Exit]:
    seen: list[Event] = []

    def ended() -> Exit | None:
        select.select(ex.fds(), [], [], 0.2)
        seen.extend(ex.poll(time.monotonic()))
        return next((e for e in seen if isinstance(e, Exit)), None)

    return seen, wait_for(ended, "the Job's exit", DEADLINE)


def test_a_job_runs_as_the_owner_in_the_workspace_and_its_exit_code_comes_back(
    executor: KubernetesExecutor, tmp_path: Path
) -> None:
    script = f'[ "$(id -u)" = 1000 ] && [ "$(pwd)" = {MOUNT} ] && echo ran && exit 101; exit 3'
    spec = job(["sh", "-c", script])
    log = tmp_path / "resume.log"
    spec = JobSpec(spec.key, spec.argv, spec.identity, spec.env, spec.timeout, log)
    handle = executor.submit(spec)
    assert executor.submit(spec) == handle
    seen, done = until_exit(executor)
    assert any(isinstance(e, Started) for e in seen)
    assert (done.rc, done.meaning) == (101, "waiting")
    assert "ran" in log.read_text()


def test_a_cancelled_job_gets_term_and_ends(executor: KubernetesExecutor) -> None:
    handle = executor.submit(job(["sh", "-c", "trap 'exit 143' TERM; while :; do sleep 1; done"]))
    wait_for(
        lambda: any(isinstance(e, Started) for e in executor.poll(time.monotonic())),
        "the Job to start",
        DEADLINE,
    )
    executor.cancel(handle, False)
    _, done = until_exit(executor)
    assert done.rc in (-15, None)  # the pod's code while it is deleted, else unknown


def test_a_job_past_its_deadline_is_a_timeout(executor: KubernetesExecutor) -> None:
    executor.submit(job(["sh", "-c", "sleep 600"], timeout=5))
    _, done = until_exit(executor)
    assert done.timed_out
