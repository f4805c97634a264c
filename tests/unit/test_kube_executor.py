"""The Kubernetes executor's pure parts: options, the Job manifest, the key annotation, exits.

The manifest is checked as the official client's models and as the JSON the client sends."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from deltad.executors.kubernetes import (
    KEY_ANNOTATION,
    ExecutorConfigError,
    JobView,
    KubeOptions,
    KubernetesExecutor,
    exit_code,
    job_exit,
    job_manifest,
    job_started,
    key_annotation,
    key_from_annotation,
    parse_options,
    pod_ids,
    split_env,
)
from deltad.executors.seam import Identity, JobSpec, RequestKey, SubmitError

k8s = pytest.importorskip("kubernetes.client")

RAW = {"image": "registry.example/deltad:1", "pvc": "workspaces", "mount_path": "/srv/ws"}
OPTIONS = parse_options(RAW)
ALICE = Identity(uid=1001, gid=1001, groups=(1001, 2000))


def spec(
    workspace: str = "/srv/ws/alice/proj",
    identity: Identity = ALICE,
    env: dict[str, str] | None = None,
    timeout: float = 3600,
) -> JobSpec:
    key = RequestKey(Path(workspace), "20261124_010203_abcdef", "r1", 0)
    argv = ["delta", "run", "--work-dir", workspace]
    return JobSpec(key, argv, identity, env or {"LANG": "C.UTF-8"}, timeout)


def sent(options: KubeOptions = OPTIONS, **kw: Any) -> dict[str, Any]:
    """The Job as the client puts it on the wire."""
    body: dict[str, Any] = k8s.ApiClient().sanitize_for_serialization(
        job_manifest(spec(**kw), options)
    )
    return body


def test_one_job_per_resume_named_by_its_key_and_found_by_label() -> None:
    job = job_manifest(spec(), OPTIONS)
    assert isinstance(job, k8s.V1Job)
    key = spec().key
    assert job.metadata.name == key.name and job.metadata.namespace == "default"
    assert job.metadata.labels == {
        "app.kubernetes.io/managed-by": "deltad",
        "deltad.io/daemon": "deltad",
        "deltad.io/workspace": key.workspace_tag,
    }
    assert job.spec.template.metadata.labels == job.metadata.labels
    assert key_from_annotation(key.name, job.metadata.annotations[KEY_ANNOTATION]) == key


def test_the_job_runs_once_as_the_owner_in_the_workspace_at_the_same_path() -> None:
    body = sent()
    js, pod = body["spec"], body["spec"]["template"]["spec"]
    assert js["backoffLimit"] == 0
    assert js["activeDeadlineSeconds"] == 3600 + 600
    assert js["ttlSecondsAfterFinished"] == 86400
    assert pod["restartPolicy"] == "Never"
    assert pod["terminationGracePeriodSeconds"] == 10
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"] == {
        "runAsUser": 1001,
        "runAsGroup": 1001,
        "runAsNonRoot": True,
        "supplementalGroups": [1001, 2000],
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert pod["volumes"] == [
        {"name": "workspace", "persistentVolumeClaim": {"claimName": "workspaces"}}
    ]
    (c,) = pod["containers"]
    assert c["command"] == ["delta", "run", "--work-dir", "/srv/ws/alice/proj"]
    assert c["workingDir"] == "/srv/ws/alice/proj"
    assert c["volumeMounts"] == [
        {"name": "workspace", "mountPath": "/srv/ws/alice/proj", "subPath": "alice/proj"}
    ]
    assert c["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }


@pytest.mark.parametrize(
    ("extra", "path", "expected"),
    [
        ({"namespace": "agents"}, ["metadata", "namespace"], "agents"),
        ({"daemon_id": "east-1"}, ["metadata", "labels", "deltad.io/daemon"], "east-1"),
        ({"cancel_grace": 2.5}, ["spec", "template", "spec", "terminationGracePeriodSeconds"], 3),
        ({"deadline_margin": 0}, ["spec", "activeDeadlineSeconds"], 3600),
        ({"ttl_after_finished": 60}, ["spec", "ttlSecondsAfterFinished"], 60),
        (
            {"service_account": "resumes"},
            ["spec", "template", "spec", "serviceAccountName"],
            "resumes",
        ),
        (
            {"node_selector": {"pool": "cpu"}},
            ["spec", "template", "spec", "nodeSelector"],
            {"pool": "cpu"},
        ),
        (
            {"image_pull_secrets": ["regcred"]},
            ["spec", "template", "spec", "imagePullSecrets"],
            [{"name": "regcred"}],
        ),
        ({"fs_group": True}, ["spec", "template", "spec", "securityContext", "fsGroup"], 1001),
        (
            {"resources": {"limits": {"memory": "1Gi", "cpu": "500m"}}},
            ["spec", "template", "spec", "containers", 0, "resources"],
            {"limits": {"memory": "1Gi", "cpu": "500m"}},
        ),
        (
            {"env_from_secret": "model-api"},
            ["spec", "template", "spec", "containers", 0, "envFrom"],
            [{"secretRef": {"name": "model-api"}}],
        ),
    ],
)
def test_each_option_lands_in_its_field(
    extra: dict[str, Any], path: list[Any], expected: Any
) -> None:
    node: Any = sent(parse_options({**RAW, **extra}))
    for step in path:
        node = node[step]
    assert node == expected


# An account the daemon cannot look up (an image without the site's accounts): tenancy gives
# the owner's uid as its group and no groups at all.
NO_ACCOUNT = Identity(uid=1001, gid=1001, groups=())


@pytest.mark.parametrize(
    ("ident", "workspace_gid", "extra", "ids"),
    [
        # The daemon knows the account: the owner's own groups, as a local resume has them.
        (ALICE, 3000, (), (1001, 1001, (1001, 2000))),
        (ALICE, None, (4000,), (1001, 1001, (1001, 2000, 4000))),
        # It does not: the workspace directory's group, never the uid's number, and no other.
        (NO_ACCOUNT, 3000, (), (1001, 3000, (3000,))),
        (NO_ACCOUNT, 3000, (4000,), (1001, 3000, (3000, 4000))),
        # ...unless the directory is root's group or unreadable: the uid, as before.
        (NO_ACCOUNT, 0, (), (1001, 1001, ())),
        (NO_ACCOUNT, None, (4000,), (1001, 1001, (4000,))),
        # Group 0 is never a supplementary group.
        (Identity(1001, 1001, (0, 1001)), None, (), (1001, 1001, (1001,))),
    ],
)
def test_the_pod_runs_as_numbers_taken_from_the_workspace_and_the_config(
    ident: Identity,
    workspace_gid: int | None,
    extra: tuple[int, ...],
    ids: tuple[int, int, tuple[int, ...]],
) -> None:
    options = parse_options({**RAW, "supplemental_groups": list(extra)})
    found = pod_ids(ident, workspace_gid, options)
    assert (found.user, found.group, found.supplemental) == ids
    body = k8s.ApiClient().sanitize_for_serialization(
        job_manifest(spec(identity=ident), options, workspace_gid=workspace_gid)
    )
    context = body["spec"]["template"]["spec"]["securityContext"]
    assert context["runAsUser"] == ids[0] and context["runAsGroup"] == ids[1]
    assert context.get("supplementalGroups", []) == list(ids[2])


class _Batch:
    """The API server's Job endpoint, recording what is created."""

    def __init__(self) -> None:
        self.created: list[Any] = []

    def create_namespaced_job(self, namespace: str, body: Any, **_: Any) -> Any:
        self.created.append(body)
        return body


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: chgrp to a group it is not in")
def test_the_submitted_job_takes_the_workspace_directorys_group(tmp_path: Path) -> None:
    ws = tmp_path / "alice" / "proj"
    ws.mkdir(parents=True)
    os.chown(ws, -1, 3000)
    options = parse_options({**RAW, "mount_path": str(tmp_path)})
    ex = KubernetesExecutor(options, k8s.ApiClient(), b"k" * 32)
    ex._batch = batch = _Batch()
    try:
        ex.engine_submit(spec(workspace=str(ws), identity=NO_ACCOUNT))  # the worker's hook
    finally:
        ex.close()
    [job] = batch.created
    context = job.spec.template.spec.security_context
    assert (context.run_as_user, context.run_as_group) == (1001, 3000)
    assert context.supplemental_groups == [3000]


def test_no_fs_group_unless_asked_it_would_chown_a_shared_volume() -> None:
    assert "fsGroup" not in sent()["spec"]["template"]["spec"]["securityContext"]


def test_only_harmless_variables_go_into_the_plain_env_the_rest_into_the_jobs_secret() -> None:
    """Names do not tell a credential: a URL with user:password@, a DSN, an auth header."""
    env = {
        "LANG": "C.UTF-8",
        "LC_ALL": "C",
        "HOME": "/home/alice",
        "OPENAI_API_KEY": "sk-1",
        "OPENAI_BASE_URL": "https://user:pw@llm.example/v1",
        "X_AUTH_HEADER": "Bearer t",
        "DB_DSN": "postgres://u:p@db/x",
    }
    body = sent(parse_options({**RAW, "env_from_secret": "model-api"}), env=env)
    (c,) = body["spec"]["template"]["spec"]["containers"]
    assert [v["name"] for v in c["env"]] == ["HOME", "LANG", "LC_ALL"]
    for value in ("sk-1", "user:pw@", "Bearer t", "u:p@db"):
        assert value not in str(body)
    name = body["metadata"]["name"]
    assert c["envFrom"] == [{"secretRef": {"name": "model-api"}}, {"secretRef": {"name": name}}]
    plain, private = split_env(env)
    assert set(private) == {"OPENAI_API_KEY", "OPENAI_BASE_URL", "X_AUTH_HEADER", "DB_DSN"}
    assert set(plain) == {"LANG", "LC_ALL", "HOME"}


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"identity": Identity(0, 0)}, "owned by root"),
        ({"identity": Identity(1001, 0)}, "owned by root"),
        ({"workspace": "/home/alice/proj"}, "not under mount_path /srv/ws"),
        ({"workspace": "/srv/ws/alice/\udcff"}, "not UTF-8"),
    ],
)
def test_a_resume_that_cannot_be_a_job_is_refused_in_one_line(
    kw: dict[str, Any], words: str
) -> None:
    with pytest.raises(SubmitError, match=words) as e:
        job_manifest(spec(**kw), OPTIONS)
    assert "\n" not in str(e.value)


def test_the_workspace_itself_may_be_the_claims_root() -> None:
    (c,) = sent(workspace="/srv/ws")["spec"]["template"]["spec"]["containers"]
    assert c["volumeMounts"] == [{"name": "workspace", "mountPath": "/srv/ws", "subPath": ""}]


@pytest.mark.parametrize(
    "key",
    [
        RequestKey(Path("/srv/ws/a"), "run", "r1", 0),
        RequestKey(Path('/srv/ws/caf\udce9 "x"%2F'), "run\n1", "r/\u202e", 3),
    ],
)
def test_the_key_annotation_is_ascii_and_gives_the_key_back(key: RequestKey) -> None:
    text = key_annotation(key)
    assert text.isascii()
    assert key_from_annotation(key.name, text) == key


@pytest.mark.parametrize("text", [None, "", "{", '{"workspace": "/a"}', "[1]"])
def test_a_job_without_a_readable_key_is_not_adopted(text: str | None) -> None:
    assert key_from_annotation("deltad-x", text) is None


def test_a_key_that_is_not_the_jobs_name_is_not_adopted() -> None:
    key = RequestKey(Path("/srv/ws/a"), "run", "r1", 0)
    other = RequestKey(Path("/srv/ws/b"), "run", "r1", 0)
    assert key_from_annotation(other.name, key_annotation(key)) is None


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ({}, "image: required"),
        ({**RAW, "imagee": "x"}, "imagee: unknown option; did you mean 'image'"),
        ({**RAW, "mount_path": "srv/ws"}, "mount_path: expected an absolute path"),
        ({**RAW, "pvc": "Work_Spaces"}, "pvc: 'Work_Spaces' is not a Kubernetes name"),
        ({**RAW, "namespace": ""}, "namespace: '' is not a Kubernetes name"),
        ({**RAW, "daemon_id": "a b"}, "daemon_id: 'a b' is not a label value"),
        ({**RAW, "poll_every": 0}, "poll_every: Input should be greater than or equal to 0.1"),
        ({**RAW, "watch_timeout": 0}, "watch_timeout: Input should be greater than or equal to 1"),
        ({**RAW, "watch_timeout": 1.5}, "watch_timeout: Input should be a valid integer"),
        ({**RAW, "watch_timeout": 7200}, "watch_timeout: Input should be less than or equal"),
        ({**RAW, "relist_every": 1}, "relist_every: Input should be greater than or equal to 10"),
        ({**RAW, "relist_evry": 60}, "relist_evry: unknown option; did you mean 'relist_every'"),
        ({**RAW, "cancel_grace": "10"}, "cancel_grace: Input should be a valid number"),
        ({**RAW, "fs_group": "yes"}, "fs_group: Input should be a valid boolean"),
        ({**RAW, "supplemental_groups": ["staff"]}, "supplemental_groups.0: Input should be"),
        ({**RAW, "supplemental_groups": [0]}, "supplemental_groups.0: Input should be greater"),
        ({**RAW, "supplemental_groups": 2000}, "supplemental_groups: Input should be a list"),
        ({**RAW, "node_selector": ["a"]}, "node_selector: Input should be a map"),
        ({**RAW, "image_pull_secrets": "regcred"}, "image_pull_secrets: Input should be a list"),
        ({**RAW, "resources": {"limit": {}}}, "resources.limit: Input should be 'requests' or"),
        ({**RAW, "resources": {"limits": {"memory": "lots"}}}, "not a quantity: memory=lots"),
    ],
)
def test_a_wrong_option_is_a_one_line_config_error(raw: dict[str, Any], words: str) -> None:
    with pytest.raises(ExecutorConfigError, match=words) as e:
        parse_options(raw)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("code", "sig", "rc"),
    [
        (0, None, 0),
        (101, None, 101),
        (75, None, 75),
        (130, None, 130),  # the client's own "interrupted", not SIGINT
        (137, None, -signal.SIGKILL),  # the runtime's 128+n for a killed process
        (143, None, -signal.SIGTERM),
        (143, 15, -15),
        (1, 9, -9),  # a signal the runtime reports wins
        (255, None, 255),  # 128+127 is no signal
    ],
)
def test_a_containers_exit_as_a_processs(code: int, sig: int | None, rc: int) -> None:
    assert exit_code(code, sig) == rc


@pytest.mark.parametrize(
    ("view", "expected"),
    [
        (JobView(None, False, False), None),  # queued
        (JobView(1.0, True, False), None),  # running
        (JobView(1.0, False, True, terminated=[(101, None, "Error")]), (101, False, "Error")),
        (JobView(1.0, False, True, terminated=[(0, None, "Completed")]), (0, False, "Completed")),
        (
            JobView(1.0, False, True, "DeadlineExceeded", [(143, None, "Error")]),
            (-15, True, "DeadlineExceeded, Error"),
        ),
        (JobView(1.0, False, True, "DeadlineExceeded"), (None, True, "DeadlineExceeded")),
        (JobView(1.0, False, True, "PodFailurePolicy"), (None, False, "PodFailurePolicy")),
        (JobView(None, False, True, gone=True), (None, False, "job gone")),  # evicted, deleted
        (
            JobView(None, False, True, terminated=[(143, None, "Error")], gone=True),
            (-15, False, "Error"),
        ),  # cancelled: the pod said how it ended before the Job went
    ],
)
def test_what_a_job_and_its_pods_say_about_the_exit(
    view: JobView, expected: tuple[int | None, bool, str] | None
) -> None:
    assert job_exit(view) == expected


@pytest.mark.parametrize(
    ("view", "at"),
    [
        (JobView(None, False, False), None),
        (JobView(5.0, False, False), None),  # the Job started, its pod is still pending
        (JobView(5.0, True, False), 5.0),
        (JobView(5.0, False, True, terminated=[(0, None, "")]), 5.0),  # ran and ended between polls
    ],
)
def test_when_a_job_counts_as_started(view: JobView, at: float | None) -> None:
    assert job_started(view) == at


def test_mount_path_is_kept_as_a_posix_path() -> None:
    assert OPTIONS.mount_path == PurePosixPath("/srv/ws")


def test_without_the_kubernetes_package_the_config_error_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from deltad.executors.kubernetes import make_kubernetes_executor

    monkeypatch.setitem(sys.modules, "kubernetes", None)  # as if not installed
    with pytest.raises(ExecutorConfigError, match=r"pip install 'deltad\[kubernetes\]'"):
        make_kubernetes_executor.build(RAW, tmp_path)


def test_a_kubeconfig_that_cannot_be_read_is_a_one_line_config_error(tmp_path: Path) -> None:
    from deltad.executors.kubernetes import make_kubernetes_executor

    with pytest.raises(ExecutorConfigError, match="no cluster to talk to") as e:
        make_kubernetes_executor.build({**RAW, "kubeconfig": str(tmp_path / "missing")}, tmp_path)
    assert "\n" not in str(e.value)
