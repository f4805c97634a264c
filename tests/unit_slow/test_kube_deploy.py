"""deploy/kubernetes: every manifest is what the official client's models say it is and valid
against the Kubernetes API schemas of the versions we support (kubernetes-validate, whose
schemas are bundled: no network), the Role grants exactly what the executor calls, and the
pieces name each other consistently."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from deltad.core.config import DaemonConfig
from deltad.executors.kubernetes import RBAC_NEEDS, job_manifest, parse_options
from deltad.executors.seam import Identity, JobSpec, RequestKey

k8s = pytest.importorskip("kubernetes.client")

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "kubernetes"
# The Kubernetes versions the manifests and the executor's Jobs are checked against: the oldest
# and newest supported, and one between (docs/daemon.md, "Kubernetes").
SUPPORTED = ("1.30.0", "1.34.0", "1.37.0")
MODELS = {
    ("v1", "Namespace"): "V1Namespace",
    ("v1", "ServiceAccount"): "V1ServiceAccount",
    ("v1", "PersistentVolumeClaim"): "V1PersistentVolumeClaim",
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("apps/v1", "Deployment"): "V1Deployment",
    ("v1", "Service"): "V1Service",
    ("rbac.authorization.k8s.io/v1", "Role"): "V1Role",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "V1RoleBinding",
}


def kustomization() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    return doc


def objects() -> dict[str, dict[str, Any]]:
    """Every object the kustomization applies, by kind."""
    found = {}
    for name in kustomization()["resources"]:
        for doc in yaml.safe_load_all((DEPLOY / name).read_text()):
            found[doc["kind"]] = doc
    return found


def as_model(doc: dict[str, Any]) -> Any:
    model = MODELS[(doc["apiVersion"], doc["kind"])]
    return k8s.ApiClient()._ApiClient__deserialize(doc, model)


def test_the_kustomization_applies_every_manifest_in_the_directory() -> None:
    listed = set(kustomization()["resources"])
    assert listed == {p.name for p in DEPLOY.glob("*.yaml")} - {"kustomization.yaml"}
    assert kustomization()["namespace"] == "deltad"


@pytest.mark.parametrize("name", sorted(kustomization()["resources"]))
def test_each_manifest_is_its_kinds_model_with_no_field_the_model_lacks(name: str) -> None:
    for doc in yaml.safe_load_all((DEPLOY / name).read_text()):
        model = as_model(doc)
        # What the model kept, serialised again, is the document: a misspelt or misplaced field
        # would have been dropped by the model and shows up here.
        assert k8s.ApiClient().sanitize_for_serialization(model) == doc


def test_the_role_grants_exactly_what_the_executor_calls() -> None:
    role = as_model(objects()["Role"])
    granted: dict[str, set[str]] = {}
    for rule in role.rules:
        for group in rule.api_groups:
            for resource in rule.resources:
                granted.setdefault(f"{group}/{resource}", set()).update(rule.verbs)
    assert granted == {res: set(verbs) for res, verbs in RBAC_NEEDS.items()}


def test_the_daemon_runs_once_as_the_bound_account_with_the_workspaces_at_the_configured_path() -> (
    None
):
    found = objects()
    deployment = as_model(found["Deployment"])
    binding = as_model(found["RoleBinding"])
    account = as_model(found["ServiceAccount"])
    options = parse_options(
        yaml.safe_load(found["ConfigMap"]["data"]["deltad.yaml"])["executors"]["kubernetes"]
    )
    pod = deployment.spec.template.spec
    assert deployment.spec.replicas == 1 and deployment.spec.strategy.type == "Recreate"
    assert pod.service_account_name == account.metadata.name
    assert binding.role_ref.name == found["Role"]["metadata"]["name"]
    assert [(s.kind, s.name, s.namespace) for s in binding.subjects] == [
        ("ServiceAccount", account.metadata.name, kustomization()["namespace"])
    ]
    claims = {
        v.name: v.persistent_volume_claim.claim_name
        for v in pod.volumes
        if v.persistent_volume_claim
    }
    mounts = {m.name: m.mount_path for m in pod.containers[0].volume_mounts}
    workspaces = [name for name, claim in claims.items() if claim == options.pvc]
    assert [mounts[name] for name in workspaces] == [str(options.mount_path)]
    pvc = as_model(_pvc(options.pvc))
    assert pvc.spec.access_modes == ["ReadWriteMany"]
    assert options.namespace == kustomization()["namespace"]
    assert options.env_from_secret  # the API key comes from a Secret, never the Job's env


def _pvc(name: str) -> dict[str, Any]:
    for file in kustomization()["resources"]:
        for doc in yaml.safe_load_all((DEPLOY / file).read_text()):
            if doc["kind"] == "PersistentVolumeClaim" and doc["metadata"]["name"] == name:
                found: dict[str, Any] = doc
                return found
    raise AssertionError(f"no PersistentVolumeClaim {name} in deploy/kubernetes")


def test_the_configmaps_deltad_yaml_is_a_valid_daemon_config() -> None:
    config = yaml.safe_load(objects()["ConfigMap"]["data"]["deltad.yaml"])
    assert config["executor"] == "kubernetes"
    parse_options(config["executors"]["kubernetes"])
    # The executor keys go to the executor registry; the rest is today's daemon config.
    rest = {k: v for k, v in config.items() if k not in ("executor", "executors")}
    daemon = DaemonConfig.model_validate(rest)
    assert daemon.state_dir == Path("/var/lib/deltad")
    state = [
        v
        for v in objects()["Deployment"]["spec"]["template"]["spec"]["containers"][0][
            "volumeMounts"
        ]
        if v["name"] == "state"
    ]
    assert [Path(v["mountPath"]) for v in state] == [daemon.state_dir]


def _documents() -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{name}:{doc['kind']}", doc)
        for name in kustomization()["resources"]
        for doc in yaml.safe_load_all((DEPLOY / name).read_text())
    ]


def _a_job() -> dict[str, Any]:
    options = parse_options(
        yaml.safe_load(objects()["ConfigMap"]["data"]["deltad.yaml"])["executors"]["kubernetes"]
    )
    ws = Path(str(options.mount_path)) / "alice" / "proj"
    key = RequestKey(ws, "20261124_010203_abcdef", "r1", 0)
    spec = JobSpec(key, ["delta", "run", "--work-dir", str(ws)], Identity(1001, 3000), {})
    job: dict[str, Any] = k8s.ApiClient().sanitize_for_serialization(
        job_manifest(spec, options, workspace_gid=3000)
    )
    return job


@pytest.mark.parametrize("version", SUPPORTED)
def test_every_manifest_and_the_executors_job_validate_against_the_api_schemas(
    version: str,
) -> None:
    kv = pytest.importorskip("kubernetes_validate")
    for where, doc in [*_documents(), ("the executor's Job", _a_job())]:
        try:
            kv.validate(doc, version, strict=True)  # strict: no field the schema lacks
        except kv.ValidationError as e:
            problem = f"{e.caught.json_path}: {e.caught.message}"
            raise AssertionError(f"{where}, Kubernetes {version}: {problem}") from None


def test_the_schema_check_can_fail() -> None:
    kv = pytest.importorskip("kubernetes_validate")
    deployment = yaml.safe_load((DEPLOY / "deployment.yaml").read_text())
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}  # misspelt
    with pytest.raises(kv.ValidationError):
        kv.validate(deployment, SUPPORTED[0], strict=True)


def test_the_image_is_the_one_deploy_image_builds_in_the_daemon_and_in_every_job() -> None:
    version = next(
        line.split('"')[1]
        for line in (REPO / "pyproject.toml").read_text().splitlines()
        if line.startswith("version = ")
    )
    containers = objects()["Deployment"]["spec"]["template"]["spec"]["containers"]
    config = yaml.safe_load(objects()["ConfigMap"]["data"]["deltad.yaml"])
    assert {c["image"] for c in containers} == {config["executors"]["kubernetes"]["image"]}
    assert {c["image"] for c in containers} == {f"localhost/deltad:{version}"}


def test_the_inbox_listens_beyond_loopback_behind_the_service_with_probes() -> None:
    found = objects()
    config = yaml.safe_load(found["ConfigMap"]["data"]["deltad.yaml"])
    host, _, port = config["http"]["listen"].rpartition(":")
    assert host == "0.0.0.0"
    container = _container("deltad")  # the core binds the port; the inbox serves on it
    assert container["ports"] == [{"name": "http", "containerPort": int(port)}]
    assert "ports" not in _container("inbox")
    assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "http"}
    assert container["startupProbe"]["httpGet"] == {"path": "/livez", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    service = found["Service"]["spec"]
    pod_labels = found["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert service["selector"].items() <= pod_labels.items()
    assert [(p["port"], p["targetPort"]) for p in service["ports"]] == [(int(port), "http")]


def test_the_workspaces_claim_names_its_storage_class() -> None:
    claim = _pvc("delta-workspaces")
    assert claim["spec"]["storageClassName"] == "nfs-client"  # the documented parameter


def _container(name: str) -> dict[str, Any]:
    containers = objects()["Deployment"]["spec"]["template"]["spec"]["containers"]
    [found] = [c for c in containers if c["name"] == name]
    return dict(found)


def _baked_inbox_ids() -> tuple[str, int, int]:
    """The inbox's account as deploy/image/Containerfile makes it: name, uid, gid."""
    text = (REPO / "deploy" / "image" / "Containerfile").read_text().replace("\\\n", " ")
    [line] = [ln for ln in text.splitlines() if ln.startswith("RUN") and "useradd" in ln]
    uid = re.search(r"--uid (\d+)", line)
    gid = re.search(r"groupadd --system --gid (\d+) (\S+)", line)
    assert uid and gid, line
    assert line.split()[-1] == gid.group(2)  # the user and its group share the name
    return gid.group(2), int(uid.group(1)), int(gid.group(1))


def test_the_inbox_container_runs_as_the_images_inbox_account_with_nothing_to_gain() -> None:
    name, uid, gid = _baked_inbox_ids()
    config = yaml.safe_load(objects()["ConfigMap"]["data"]["deltad.yaml"])
    assert config["http"].get("user", "deltad-inbox") == name  # whom the core serves
    assert _container("inbox")["securityContext"] == {
        "runAsUser": uid,
        "runAsGroup": gid,
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "seccompProfile": {"type": "RuntimeDefault"},
        "capabilities": {"drop": ["ALL"]},
    }


def test_the_core_switches_no_user_in_the_pod() -> None:
    """No SETUID/SETGID: resumes are Jobs, and the inbox is its own container."""
    sc = _container("deltad")["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN", "DAC_OVERRIDE"]}
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True


def test_the_inbox_connects_to_the_cores_socket_in_a_volume_only_they_share() -> None:
    config = yaml.safe_load(objects()["ConfigMap"]["data"]["deltad.yaml"])
    socket = Path(config["http"]["inbox_socket"])
    pod = objects()["Deployment"]["spec"]["template"]["spec"]
    args = _container("inbox")["args"]
    assert args[:2] == ["deltad", "inbox"]
    assert args[args.index("--connect") + 1] == str(socket)

    def mounted(container: dict[str, Any]) -> str:
        [name] = [
            m["name"] for m in container["volumeMounts"] if m["mountPath"] == str(socket.parent)
        ]
        return str(name)

    assert mounted(_container("deltad")) == mounted(_container("inbox"))
    [volume] = [v for v in pod["volumes"] if v["name"] == mounted(_container("inbox"))]
    assert "emptyDir" in volume  # the pod's own, gone with it


def test_the_inbox_container_holds_no_state_workspace_config_or_api_token() -> None:
    """It parses the network: it mounts the socket's directory and, over the path where the
    kubelet would put the service account's token (which makes Jobs), an empty directory."""
    pod = objects()["Deployment"]["spec"]["template"]["spec"]
    mounts = {m["mountPath"]: m["name"] for m in _container("inbox")["volumeMounts"]}
    token = "/var/run/secrets/kubernetes.io/serviceaccount"
    config = yaml.safe_load(objects()["ConfigMap"]["data"]["deltad.yaml"])
    assert set(mounts) == {str(Path(config["http"]["inbox_socket"]).parent), token}
    [shadow] = [v for v in pod["volumes"] if v["name"] == mounts[token]]
    assert "emptyDir" in shadow
