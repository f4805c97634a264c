"""`executor: kubernetes`: each resume runs as a Kubernetes Job, through the official client.

The Job's name is the request key's name, so a second submit of the same resume is refused by
the API server (409 AlreadyExists) and returns the Job already there: one Job per resume even
when the daemon crashed between submitting and recording. The daemon finds its Jobs again by
label after a restart, reads each resume's exit code from its pod, and cancels by deleting the
Job. A Job is this daemon's only when its tag annotation (an HMAC with the daemon's secret,
`<state_dir>/executor.key`, over its namespace, name, key and runAsUser) verifies: anyone else's
Job with the same labels or name is ignored and said once. Credentials reach a Job only through
a Secret made with it (and owned by it, so it goes with the Job): its plain env carries only the
harmless variables of `PLAIN_ENV`. Decisions (the manifest, the exit meaning of a Job and its
pods, the options) are pure functions; `KubernetesExecutor` is the hooks of `RemoteExecutor`,
run from its worker thread: the daemon's loop never waits on the API server. What the Jobs do
is learnt by a list and then a watch from the list's resourceVersion (deltad/executors/
kubewatch.py, in a thread of its own): the worker reads that table, and asks the server only
to create, delete, and read an ended Job's pods.

`kubernetes` is an optional dependency (`pip install 'deltad[kubernetes]'`), imported only
when this executor is configured.
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
import signal
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Annotated, Any, Literal
from urllib.parse import quote_from_bytes, unquote_to_bytes

import structlog
from pydantic import AfterValidator, Field, field_validator

from deltad.protocol import exitcodes
from deltad.protocol.printable import show_path

from .kubewatch import JobWatch, _api_words, _error_words, _one_line
from .registry import ExecutorOptions, validate
from .remote import EngineAway, RemoteExecutor, RemoteJob, Seen, daemon_secret, tag, tag_ok
from .seam import Handle, Identity, JobSpec, JobState, RequestKey, SubmitError

if TYPE_CHECKING:
    from kubernetes import client as k8s

log = structlog.get_logger("deltad.executors.kubernetes")

NAME = "kubernetes"
CONTAINER = "resume"
MANAGED_BY = "app.kubernetes.io/managed-by"
DAEMON_LABEL = "deltad.io/daemon"
WORKSPACE_LABEL = "deltad.io/workspace"
KEY_ANNOTATION = "deltad.io/key"
TAG_ANNOTATION = "deltad.io/tag"
WORKSPACE_ANNOTATION = "deltad.io/workspace"
# The longest pause between two looks of the worker at the watched table while nothing changes
# (and at most 32 × poll_every); a watch event wakes it at once.
MAX_INTERVAL = 30.0
# What this executor calls on the API server, by resource: the Role in deploy/kubernetes grants
# exactly this (a test holds the two together, another that the executor calls nothing else).
RBAC_NEEDS: Mapping[str, frozenset[str]] = {
    "batch/jobs": frozenset({"create", "get", "list", "watch", "delete", "patch"}),
    "/pods": frozenset({"list"}),
    "/pods/log": frozenset({"get"}),
    "/secrets": frozenset({"create", "patch", "delete"}),
}
# The only variables a Job's plain env carries (anyone who may read Jobs reads them): nothing
# here can be a credential. Every other one (OPENAI_BASE_URL may hold user:password@, a DSN a
# password, a header a token: names do not tell) goes into the Job's own Secret.
PLAIN_ENV = frozenset(
    {"HOME", "USER", "LOGNAME", "PATH", "SHELL", "LANG", "LANGUAGE", "TZ", "TERM", "TMPDIR"}
    | {exitcodes.RESUMED_BY}
)
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_DNS_1123 = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti|P|Pi|E|Ei)?$")
LOG_LIMIT = 1 << 20  # bytes of a pod's log copied into the resume log


class ExecutorConfigError(ValueError):
    """An option of `executors: {kubernetes: ...}` is wrong; the message is one line."""


Seconds = Annotated[float, Field(ge=0, strict=True)]
DnsName = Annotated[str, AfterValidator(lambda v: _dns_name(v))]


class KubeOptions(ExecutorOptions):
    """The options under `executors: {kubernetes: {...}}` (README and docs/daemon.md)."""

    image: str = Field(min_length=1)
    pvc: DnsName  # a ReadWriteMany claim holding the workspaces
    mount_path: PurePosixPath  # where the claim's root is, on this host and in every pod
    namespace: DnsName = "default"
    daemon_id: str = "deltad"  # a label value: this daemon's Jobs, among others'
    service_account: DnsName | None = None  # the resume pods' account (no API token mounted)
    env_from_secret: DnsName | None = None  # the Secret that carries the model API key etc.
    resources: dict[Literal["requests", "limits"], dict[str, str]] = Field(default_factory=dict)
    node_selector: dict[str, str] = Field(default_factory=dict)
    image_pull_secrets: tuple[Annotated[str, Field(min_length=1)], ...] = ()
    # gids every Job gets besides the owner's own (numeric: no accounts in the image)
    supplemental_groups: tuple[Annotated[int, Field(gt=0, lt=1 << 32, strict=True)], ...] = ()
    fs_group: bool = Field(default=False, strict=True)  # the pod's fsGroup: the owner's gid
    cancel_grace: Seconds = 10.0  # terminationGracePeriodSeconds
    deadline_margin: Seconds = 600.0  # activeDeadlineSeconds = resume timeout + this
    ttl_after_finished: int = Field(default=86400, ge=0, strict=True)  # if no daemon deletes it
    # the worker's look at the watched Jobs while nothing changes (no API call; it doubles up
    # to 30 s while nothing changes); a watch event wakes it at once
    poll_every: float = Field(default=5.0, ge=0.1, strict=True)
    request_timeout: float = Field(default=10.0, ge=0.1, strict=True)  # seconds per API call
    # timeoutSeconds of one watch request (the server ends the stream then; watched again at
    # once from the last resourceVersion)
    watch_timeout: int = Field(default=300, ge=1, le=3600, strict=True)
    # the safety net: a full list this often besides the watch (seconds)
    relist_every: float = Field(default=600.0, ge=10.0, strict=True)
    kubeconfig: str | None = Field(default=None, min_length=1)  # None: in-cluster, or default

    @field_validator("mount_path", mode="before")
    @classmethod
    def _absolute(cls, v: object) -> object:
        if not isinstance(v, str) or not v.startswith("/") or ".." in PurePosixPath(v).parts:
            raise ValueError("expected an absolute path")
        return v

    @field_validator("daemon_id")
    @classmethod
    def _label(cls, v: str) -> str:
        if not _LABEL_VALUE.match(v):
            raise ValueError(f"{v!r} is not a label value (up to 63 of A-Z a-z 0-9 - _ .)")
        return v

    @field_validator("resources", mode="before")
    @classmethod
    def _quantities(cls, v: object) -> object:
        if not isinstance(v, Mapping):
            return v
        parsed: dict[object, object] = {}
        for part, amounts in v.items():
            if not isinstance(amounts, Mapping):
                parsed[part] = amounts  # the model says what it expected
                continue
            shown = {k: str(n) for k, n in amounts.items()}
            bad = [f"{k}={n}" for k, n in shown.items() if not _QUANTITY.match(n)]
            if bad:
                raise ValueError(f"{part}: not a quantity: {', '.join(bad)}")
            parsed[part] = shown
        return parsed


def _dns_name(value: str) -> str:
    if not _DNS_1123.match(value):
        raise ValueError(f"{value!r} is not a Kubernetes name (a-z, 0-9, -)")
    return value


def parse_options(raw: Mapping[str, Any]) -> KubeOptions:
    """The options, checked: a wrong one is a one-line `ExecutorConfigError` naming the key."""
    return validate(KubeOptions, NAME, raw, ExecutorConfigError)


# -- the key, kept in an annotation so a restarted daemon can rebuild it ---------------------


def _quote(text: str) -> str:
    return quote_from_bytes(text.encode("utf-8", "surrogateescape"), safe="/")


def _unquote(text: str) -> str:
    return unquote_to_bytes(text).decode("utf-8", "surrogateescape")


def key_annotation(key: RequestKey) -> str:
    """The full key as ASCII (a workspace path is any bytes: percent-escaped, reversibly)."""
    parts = {
        "workspace": quote_from_bytes(os.fsencode(key.workspace), safe="/"),
        "run_id": _quote(key.run_id),
        "request": _quote(key.request),
        "attempt": key.attempt,
    }
    return json.dumps(parts, sort_keys=True, separators=(",", ":"))


def key_from_annotation(name: str, text: str | None) -> RequestKey | None:
    """The key a Job was made for, or None when its annotation is missing, malformed, or not the
    key its name was made from (a Job edited by hand is not adopted)."""
    try:
        parts = json.loads(text or "")
        key = RequestKey(
            Path(os.fsdecode(unquote_to_bytes(parts["workspace"]))),
            _unquote(parts["run_id"]),
            _unquote(parts["request"]),
            int(parts["attempt"]),
        )
    except (ValueError, TypeError, KeyError):
        return None
    return key if key.name == name else None


# -- the manifest ------------------------------------------------------------------------------


def split_env(env: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """The variables that may go into a Job's plain env (`PLAIN_ENV`, `LC_*`), and the rest,
    which go into its Secret."""
    plain = {k: v for k, v in env.items() if k in PLAIN_ENV or k.startswith("LC_")}
    return plain, {k: v for k, v in env.items() if k not in plain}


def job_tag(secret: bytes, namespace: str, name: str, key: str, uid: int | None) -> str:
    """What marks a Job as this daemon's: an HMAC of where it is, its key and whom it runs as."""
    return tag(secret, "kubernetes", namespace, name, key, str(uid))


def secret_manifest(spec: JobSpec, options: KubeOptions, values: Mapping[str, str]) -> Any:
    """The Job's own Secret: its credentials, labelled as the Job is."""
    from kubernetes import client as k8s

    return k8s.V1Secret(
        api_version="v1",
        kind="Secret",
        metadata=k8s.V1ObjectMeta(
            name=spec.key.name, namespace=options.namespace, labels=labels_for(spec.key, options)
        ),
        type="Opaque",
        data={k: base64.b64encode(v.encode()).decode() for k, v in values.items()},
    )


def labels_for(key: RequestKey, options: KubeOptions) -> dict[str, str]:
    return {
        MANAGED_BY: "deltad",
        DAEMON_LABEL: options.daemon_id,
        WORKSPACE_LABEL: key.workspace_tag,
    }


def selector(options: KubeOptions) -> str:
    return f"{MANAGED_BY}=deltad,{DAEMON_LABEL}={options.daemon_id}"


def workspace_sub_path(workspace: Path, mount_path: PurePosixPath) -> str:
    """The workspace's path inside the claim; SubmitError when it is not on the claim."""
    try:
        rel = PurePosixPath(os.fsdecode(workspace)).relative_to(mount_path)
        if ".." in rel.parts:
            raise ValueError(rel)
        text = str(rel)
        text.encode("utf-8")  # the API speaks UTF-8 only: a path with other bytes cannot go
    except UnicodeEncodeError as e:  # (a ValueError too: first)
        raise SubmitError(
            f"workspace {show_path(workspace)} is not UTF-8: a Kubernetes volume cannot name it",
            permanent=True,
        ) from e
    except ValueError as e:
        raise SubmitError(
            f"workspace {show_path(workspace)} is not under mount_path {mount_path}",
            permanent=True,
        ) from e
    return "" if text == "." else text


@dataclass(frozen=True)
class PodIds:
    """runAsUser, runAsGroup and supplementalGroups of a Job's pod."""

    user: int
    group: int
    supplemental: tuple[int, ...]


def pod_ids(ident: Identity, workspace_gid: int | None, options: KubeOptions) -> PodIds:
    """Whom a Job's pod runs as, in numbers only, so the image needs no site accounts.

    The user is the workspace's owner (its directory's uid). Where the daemon knows the owner's
    account (its group list, from getgrouplist, is never empty then), the Job gets the owner's
    primary group and groups, as a local resume would. Where it does not (a daemon in an image
    without the site's accounts), the group is the workspace directory's (`workspace_gid`,
    unless root's, then the owner's uid as before) and it is the one supplementary group: the
    owner's files there carry it, a shared workspace's setgid group included. Configured
    `supplemental_groups` are added either way; group 0 never is."""
    extra = set(ident.groups) | set(options.supplemental_groups)
    if ident.groups or not workspace_gid:  # an account the daemon knows; or nothing better
        return PodIds(ident.uid, ident.gid, tuple(sorted(extra - {0})))
    return PodIds(ident.uid, workspace_gid, tuple(sorted((extra | {workspace_gid}) - {0})))


def job_manifest(
    spec: JobSpec, options: KubeOptions, secret: bytes = b"", workspace_gid: int | None = None
) -> k8s.V1Job:
    """One Job for one resume (pure: the client's models only), tagged with `secret`.
    `workspace_gid` is the group of the workspace directory (`pod_ids`). SubmitError
    (permanent) when the resume cannot run as a Job (a root-owned workspace, a workspace off
    the claim)."""
    from kubernetes import client as k8s

    ids = pod_ids(spec.identity, workspace_gid, options)
    if ids.user == 0 or ids.group == 0:
        raise SubmitError(
            f"workspace {show_path(spec.key.workspace)} is owned by root: never run as a Job",
            permanent=True,
        )
    sub_path = workspace_sub_path(spec.key.workspace, options.mount_path)
    workdir = os.fsdecode(spec.key.workspace)
    plain, private = split_env(spec.env)
    sources = [options.env_from_secret] if options.env_from_secret else []
    if private:  # the Job's own Secret, made with it (secret_manifest)
        sources.append(spec.key.name)
    container = k8s.V1Container(
        name=CONTAINER,
        image=options.image,
        command=list(spec.argv),
        working_dir=workdir,
        env=[k8s.V1EnvVar(name=k, value=v) for k, v in sorted(plain.items())] or None,
        env_from=[
            k8s.V1EnvFromSource(secret_ref=k8s.V1SecretEnvSource(name=name)) for name in sources
        ]
        or None,
        resources=k8s.V1ResourceRequirements(
            requests=options.resources.get("requests"), limits=options.resources.get("limits")
        )
        if options.resources
        else None,
        volume_mounts=[k8s.V1VolumeMount(name="workspace", mount_path=workdir, sub_path=sub_path)],
        security_context=k8s.V1SecurityContext(
            allow_privilege_escalation=False,
            capabilities=k8s.V1Capabilities(drop=["ALL"]),
        ),
    )
    pod = k8s.V1PodSpec(
        containers=[container],
        restart_policy="Never",
        termination_grace_period_seconds=math.ceil(options.cancel_grace),
        automount_service_account_token=False,
        service_account_name=options.service_account,
        node_selector=dict(options.node_selector) or None,
        image_pull_secrets=[k8s.V1LocalObjectReference(name=n) for n in options.image_pull_secrets]
        or None,
        security_context=k8s.V1PodSecurityContext(
            run_as_user=ids.user,
            run_as_group=ids.group,
            run_as_non_root=True,
            supplemental_groups=list(ids.supplemental) or None,
            fs_group=ids.group if options.fs_group else None,
            # With the container's settings, what Pod Security "restricted" asks of a pod.
            seccomp_profile=k8s.V1SeccompProfile(type="RuntimeDefault"),
        ),
        volumes=[
            k8s.V1Volume(
                name="workspace",
                persistent_volume_claim=k8s.V1PersistentVolumeClaimVolumeSource(
                    claim_name=options.pvc
                ),
            )
        ],
    )
    labels = labels_for(spec.key, options)
    return k8s.V1Job(
        api_version="batch/v1",
        kind="Job",
        metadata=k8s.V1ObjectMeta(
            name=spec.key.name,
            namespace=options.namespace,
            labels=labels,
            annotations={
                KEY_ANNOTATION: key_annotation(spec.key),
                TAG_ANNOTATION: job_tag(
                    secret, options.namespace, spec.key.name, key_annotation(spec.key), ids.user
                ),
                WORKSPACE_ANNOTATION: show_path(spec.key.workspace),
            },
        ),
        spec=k8s.V1JobSpec(
            backoff_limit=0,  # deltad decides whether a resume is tried again
            # Parked: no pod until the daemon lets it go (`engine_release`) after asking the HA
            # fence once more (remote.py's two-step submit).
            suspend=True,
            active_deadline_seconds=math.ceil(spec.timeout + options.deadline_margin),
            ttl_seconds_after_finished=options.ttl_after_finished,
            template=k8s.V1PodTemplateSpec(metadata=k8s.V1ObjectMeta(labels=labels), spec=pod),
        ),
    )


# -- what a Job and its pods say ---------------------------------------------------------------


@dataclass(frozen=True)
class JobView:
    """What `poll` needs of a Job and its pods (plain values, so the decision is pure)."""

    started_at: float | None  # status.startTime
    running: bool  # an active pod
    ended: bool  # a Complete or Failed condition, or the Job is gone
    reason: str = ""  # the Failed condition's reason (DeadlineExceeded, BackoffLimitExceeded)
    terminated: Sequence[tuple[int, int | None, str]] = ()  # pods' (exitCode, signal, reason)
    gone: bool = False  # no such Job any more (deleted, expired by its TTL)


def exit_code(code: int, sig: int | None) -> int:
    """A container's exit as a process's: -signal when it was killed.

    The runtime reports a process killed by signal n as exit code 128+n (and sometimes the
    signal itself). The client's own codes above 128 (130, interrupted) stay as they are."""
    if sig:
        return -sig
    if code > 128 and code not in exitcodes.MEANING and (code - 128) in signal.valid_signals():
        return -(code - 128)
    return code


def job_exit(view: JobView) -> tuple[int | None, bool, str] | None:
    """None while the Job runs; else (rc or None when unknown, timed out, detail)."""
    if not view.ended and not view.gone:
        return None
    timed_out = view.reason == "DeadlineExceeded"
    if view.terminated:
        code, sig, why = view.terminated[-1]
        detail = ", ".join(x for x in (view.reason, why) if x)
        return exit_code(code, sig), timed_out, detail
    # No container ended with a code: the pod was evicted, deleted or never ran.
    return None, timed_out, view.reason or ("job gone" if view.gone else "no exit code")


def job_parked(job: Any | None) -> bool:
    """A Job the daemon made parked (`spec.suspend`) and has not let go yet."""
    spec = getattr(job, "spec", None)
    return bool(spec is not None and spec.suspend)


def job_started(view: JobView) -> float | None:
    """When the resume began running (its timeout counts from here), once it has."""
    if view.started_at is not None and (view.running or view.ended or view.terminated):
        return view.started_at
    return None


def _stamp(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def _terminated(pods: Iterable[Any]) -> list[tuple[int, int | None, str]]:
    found = []
    for pod in pods:
        for status in (pod.status and pod.status.container_statuses) or []:
            done = status.state and status.state.terminated
            if status.name == CONTAINER and done:
                found.append((done.exit_code, done.signal, done.reason or ""))
    return found


def view_of(job: Any | None, pods: Sequence[Any]) -> JobView:
    """A `JobView` from the client's V1Job (None: gone) and the Job's V1Pods."""
    if job is None:
        return JobView(None, False, True, terminated=_terminated(pods), gone=True)
    status = job.status
    conditions = (status and status.conditions) or []
    final = [c for c in conditions if c.type in ("Complete", "Failed") and c.status == "True"]
    return JobView(
        started_at=_stamp(status and status.start_time),
        # Ready pods where the server counts them; else active ones (which include pending).
        running=bool(status and (status.ready if status.ready is not None else status.active)),
        ended=bool(final),
        reason=(final[0].reason or "") if final else "",
        terminated=_terminated(pods),
    )


# -- the executor ------------------------------------------------------------------------------


class KubernetesExecutor(RemoteExecutor):
    """The `JobExecutor` for Kubernetes: the hooks of `RemoteExecutor`, run from its worker."""

    name = NAME
    parks = True  # made with spec.suspend, then let go by a patch (remote.py's two-step submit)

    def __init__(self, options: KubeOptions, api: Any, secret: bytes) -> None:
        from kubernetes import client as k8s

        self.options = options
        self._secret = secret
        self._api = api
        self._batch = k8s.BatchV1Api(api)
        self._core = k8s.CoreV1Api(api)
        self._k8s = k8s
        self._last_pod: dict[str, str] = {}  # Job name -> its last pod (where the log is)
        self._foreign: set[str] = set()  # Jobs not this daemon's, already said
        self._vanished: set[str] = set()  # Jobs gone from the list (deleted, expired)
        self._ended: dict[str, tuple[str, Seen]] = {}  # an ended Job's version -> its pods' word
        self._watch = JobWatch(
            self._batch.list_namespaced_job,
            options.namespace,
            selector(options),
            self.poke,
            request_timeout=options.request_timeout,
            watch_timeout=options.watch_timeout,
            relist_every=options.relist_every,
        )
        super().__init__(options.poll_every, min(MAX_INTERVAL, 32 * options.poll_every))
        self._watch.start()

    def submit(self, spec: JobSpec) -> Handle:
        # a resume that cannot be a Job says so now, not from the worker
        job_manifest(spec, self.options, self._secret, _workspace_gid(spec.key.workspace))
        return super().submit(spec)

    # The hooks (the worker thread) --------------------------------------------------------------

    def engine_list(self) -> list[Seen]:
        """This daemon's Jobs as the watch last said (no API call), and the pods of each newly
        ended one (its exit code is there: read once per version of the Job)."""
        found = self._watch.jobs()
        seen = []
        ended: dict[str, tuple[str, Seen]] = {}
        for job in found:
            key = self._key_of(job)
            if key is None:
                continue  # (a Job being deleted is listed: its pods end first)
            view = view_of(job, [])
            if not view.ended:
                seen.append(self._seen(key, job, view, []))
                continue
            version = str(job.metadata.resource_version or "")
            known = self._ended.get(key.name)
            if known is None or known[0] != version or not version:
                pods = self._pods(key.name)
                known = (version, self._seen(key, job, view_of(job, pods) if pods else view, pods))
            ended[key.name] = known
            seen.append(known[1])
        self._ended = ended
        return seen

    def counts(self) -> dict[str, int]:
        """The watch's lists, re-lists, watch requests and restarts, events, failures."""
        return self._watch.counts()

    def _key_of(self, job: Any) -> RequestKey | None:
        """The key of a Job this daemon made; None (said once) for anyone else's."""
        meta = job.metadata
        mine = {MANAGED_BY: "deltad", DAEMON_LABEL: self.options.daemon_id}
        if not mine.items() <= (meta.labels or {}).items():  # the server's filter, checked
            return None
        notes = meta.annotations or {}
        key = key_from_annotation(meta.name, notes.get(KEY_ANNOTATION))
        pod = job.spec and job.spec.template and job.spec.template.spec
        context = pod and pod.security_context
        uid = context.run_as_user if context is not None else None
        ok = key is not None and tag_ok(
            self._secret,
            notes.get(TAG_ANNOTATION) or "",
            "kubernetes",
            self.options.namespace,
            meta.name,
            notes.get(KEY_ANNOTATION) or "",
            str(uid),
        )
        if not ok:
            if meta.name not in self._foreign:
                self._foreign.add(meta.name)
                log.warning(
                    "kubernetes_foreign_job_ignored",
                    job=meta.name,
                    why="no valid tag of this daemon",
                )
            return None
        return key

    def _seen(self, key: RequestKey, job: Any | None, view: JobView, pods: Sequence[Any]) -> Seen:
        meta = getattr(job, "metadata", None)
        ref = (meta and meta.uid) or key.name
        if pods:
            self._last_pod[key.name] = pods[-1].metadata.name
        ended = job_exit(view)
        start = job_started(view)
        if ended is None:
            state = JobState.RUNNING if start is not None else JobState.QUEUED
            return Seen(key, ref, state, start, parked=job_parked(job))
        rc, timed_out, detail = ended
        return Seen(key, ref, JobState.ENDED, start, rc, timed_out, detail)

    def engine_missing(self, jobs: list[RemoteJob]) -> dict[str, Seen]:
        """Jobs gone from the list (deleted, expired by their TTL): what their pods said."""
        found = {}
        for job in jobs:
            name = job.handle.key.name
            self._vanished.add(name)  # nothing to delete once it ended
            pods = self._pods(name)
            found[name] = self._seen(job.handle.key, None, view_of(None, pods), pods)
        return found

    def engine_submit(self, spec: JobSpec) -> str:
        name = spec.key.name
        manifest = job_manifest(
            spec, self.options, self._secret, _workspace_gid(spec.key.workspace)
        )
        _, private = split_env(spec.env)
        if private:
            self._create_secret(spec, private)
            log.info("kubernetes_env_in_secret", job=name, names=sorted(private))
        try:
            made = self._batch.create_namespaced_job(
                self.options.namespace, manifest, _request_timeout=self._timeout
            )
            how = "created"
        except self._k8s.ApiException as e:
            if e.status != 409:
                raise SubmitError(self._refusal(name, e)) from e
            made, how = self._existing(name), "already_submitted"
        except Exception as e:  # no answer at all (no connection, a timeout): no refusal
            raise EngineAway(f"kubernetes: job {name} not submitted: {_one_line(e)}") from e
        self._watch.made(made)  # in the table now, before its watch event
        uid = getattr(made.metadata, "uid", None)
        if private and uid:  # the Secret goes with its Job (the garbage collector)
            self._own_secret(name, uid)
        log.info("kubernetes_job_submitted", job=name, how=how)
        return str(uid or name)

    def _create_secret(self, spec: JobSpec, values: Mapping[str, str]) -> None:
        try:
            self._core.create_namespaced_secret(
                self.options.namespace,
                secret_manifest(spec, self.options, values),
                _request_timeout=self._timeout,
            )
        except self._k8s.ApiException as e:
            if e.status != 409:  # 409: made by an earlier try of this very key
                raise SubmitError(self._refusal(spec.key.name, e)) from e
        except Exception as e:  # no answer at all: no refusal
            raise EngineAway(f"kubernetes: secret {spec.key.name} not made: {_one_line(e)}") from e

    def _own_secret(self, name: str, uid: str) -> None:
        owner = {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": uid}
        try:
            self._core.patch_namespaced_secret(
                name,
                self.options.namespace,
                {"metadata": {"ownerReferences": [owner]}},
                _request_timeout=self._timeout,
            )
        except Exception as e:  # deleted with the Job by engine_ended meanwhile
            log.warning("kubernetes_secret_not_owned", job=name, error=_error_words(e))

    def engine_release(self, job: RemoteJob, fence: Callable[[], bool] | None) -> None:
        """Let a parked Job run (`spec.suspend: false`), the fence asked right before the call
        (a daemon frozen after it sends the patch on waking, but its Job was then made before
        the freeze: the new active found it parked and let it go itself; the patch changes
        nothing)."""
        name = job.handle.key.name
        if fence is not None and not fence():
            raise SubmitError(f"kubernetes: job {name}: fenced before its release")
        try:
            patched = self._batch.patch_namespaced_job(
                name,
                self.options.namespace,
                {"spec": {"suspend": False}},
                _request_timeout=self._timeout,
            )
        except self._k8s.ApiException as e:
            raise SubmitError(self._refusal(name, e)) from e
        self._watch.updated(patched)  # no second release before the watch's own event
        log.info("kubernetes_job_released", job=name)

    def engine_cancel(self, job: RemoteJob, force: bool) -> None:
        """Delete the Job: its pods get TERM and `cancel_grace` (KILL at once when forced)."""
        name = job.handle.key.name
        grace = 0 if force else math.ceil(self.options.cancel_grace)
        try:
            self._batch.delete_namespaced_job(
                name,
                self.options.namespace,
                propagation_policy="Foreground",  # the pods go before the Job does
                grace_period_seconds=grace,
                _request_timeout=self._timeout,
            )
        except Exception as e:
            if getattr(e, "status", None) != 404:  # 404: gone already, which is what was asked
                raise
        log.info("kubernetes_job_cancelled", job=name, grace=grace)

    def engine_ended(self, job: RemoteJob) -> None:
        """Keep the pod's output in the resume log, then delete the Job and its Secret."""
        name = job.handle.key.name
        pod = self._last_pod.pop(name, None)
        if job.spec is not None and job.spec.log is not None and pod is not None:
            self._save_log(pod, job.spec.log)
        deletes: list[Any] = []
        if name not in self._vanished:
            deletes.append(self._batch.delete_namespaced_job)
        self._vanished.discard(name)
        if job.spec is None or split_env(job.spec.env)[1]:  # it has a Secret of its own
            deletes.append(self._core.delete_namespaced_secret)
        for delete in deletes:
            try:
                delete(
                    name,
                    self.options.namespace,
                    propagation_policy="Background",
                    _request_timeout=self._timeout,
                )
            except Exception as e:  # the Job's TTL removes it later (and its Secret with it)
                if getattr(e, "status", None) != 404:
                    log.warning("kubernetes_delete_failed", job=name, error=_error_words(e))

    def engine_words(self, e: BaseException) -> str:
        if isinstance(e, SubmitError):
            return str(e)
        return _error_words(e) if isinstance(e, Exception) else str(e)

    def close(self) -> None:
        super().close()
        self._watch.stop()
        self._api.close()

    # Talking to the API server -----------------------------------------------------------------

    @property
    def _timeout(self) -> float:
        return self.options.request_timeout

    def _existing(self, name: str) -> Any:
        """The Job a 409 said exists, when it is this daemon's (else someone took the name)."""
        try:
            job = self._batch.read_namespaced_job(
                name, self.options.namespace, _request_timeout=self._timeout
            )
        except Exception as e:
            raise SubmitError(
                f"kubernetes: job {name} exists but cannot be read: {_one_line(e)}"
            ) from e
        if self._key_of(job) is None:
            raise SubmitError(f"kubernetes: a job named {name} exists and is not this daemon's")
        return job

    def _pods(self, name: str) -> list[Any]:
        found: list[Any] = self._core.list_namespaced_pod(
            self.options.namespace,
            label_selector=f"job-name={name}",
            _request_timeout=self._timeout,
        ).items
        return [p for p in found if (p.metadata.labels or {}).get("job-name") == name]

    def _save_log(self, pod: str, path: Path) -> None:
        try:
            text = self._core.read_namespaced_pod_log(
                pod,
                self.options.namespace,
                container=CONTAINER,
                limit_bytes=LOG_LIMIT,
                _request_timeout=self._timeout,
            )
            with open(path, "a", encoding="utf-8", errors="replace") as f:
                f.write(text if isinstance(text, str) else str(text))
        except Exception as e:  # the log is a courtesy: the exit code is what counts
            log.warning("kubernetes_log_unavailable", pod=pod, error=_one_line(e))

    def _refusal(self, name: str, e: Any) -> str:
        return f"kubernetes refused job {name}: {_api_words(e)}"


def _workspace_gid(workspace: Path) -> int | None:
    """The workspace directory's group, as the daemon sees it on the claim (None: unreadable;
    the Job then gets the owner's group as the daemon knows it)."""
    try:
        return os.stat(workspace, follow_symlinks=False).st_gid
    except OSError:
        return None


# -- making one from the config ----------------------------------------------------------------


def api_client(options: KubeOptions) -> Any:
    """A client for the cluster: the kubeconfig named, in-cluster in a pod, else the default."""
    from kubernetes import client as k8s
    from kubernetes import config

    try:
        if options.kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config()  # type: ignore[no-untyped-call]
            return k8s.ApiClient()
        return config.new_client_from_config(config_file=options.kubeconfig)  # type: ignore[no-untyped-call]
    except Exception as e:
        raise ExecutorConfigError(
            f"executors.kubernetes.kubeconfig: no cluster to talk to: {_one_line(e)}"
        ) from e


def _need_the_package() -> None:
    try:
        import kubernetes  # noqa: F401
    except ImportError as e:
        raise ExecutorConfigError(
            "executor: kubernetes needs the kubernetes package: pip install 'deltad[kubernetes]'"
        ) from e


def preflight(options: KubeOptions) -> None:
    """What `serve` would fail on, checked without calling the cluster: the package, and a
    client made from the kubeconfig (or the pod's service account)."""
    _need_the_package()
    api_client(options)


class KubernetesFactory:
    """`executors: {kubernetes: OPTIONS}`: validated through `options_model` when the config
    is read, checked against the host by `preflight`, built with the daemon's state dir (its
    signing key); ExecutorConfigError (one line) when it cannot be."""

    options_model = KubeOptions

    def check_options(self, options: KubeOptions | Mapping[str, Any]) -> None:
        _parsed(options)

    def preflight(self, options: KubeOptions | Mapping[str, Any]) -> None:
        preflight(_parsed(options))

    def build(
        self, options: KubeOptions | Mapping[str, Any], state_dir: Path
    ) -> KubernetesExecutor:
        parsed = _parsed(options)
        _need_the_package()
        return KubernetesExecutor(parsed, api_client(parsed), daemon_secret(state_dir))


make_kubernetes_executor = KubernetesFactory()


def _parsed(options: KubeOptions | Mapping[str, Any]) -> KubeOptions:
    return options if isinstance(options, KubeOptions) else parse_options(options)
