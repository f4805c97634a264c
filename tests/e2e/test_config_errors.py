"""A bad config is one line and exit 2, from `deltad check` and from `deltad serve` alike: real
processes, one table. Each line names the key; none is a traceback; `serve` refuses before it
starts anything, so no daemon stays up (each case is two short processes, parallel-friendly).

What only starting can find (the inbox's port taken by another process: `check` binds port 0,
since the configured port may be a running daemon's own) is `serve`'s alone, below the table.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.daemon import DELTAD

from ..users import executable_by_all, shared_tmp
from .test_executor_registry import toy_installed  # noqa: F401 - a fixture

Settings = Callable[[Path], dict[str, Any]]


@dataclass(frozen=True)
class Case:
    settings: Settings  # merged over a good config (roots, state_dir) made in the test's dir
    says: str  # in the one line: the key (and what is wrong)
    env: dict[str, str] = field(default_factory=dict)
    raw: str | None = None  # the config file's text as is (settings unused)
    as_nobody: bool = False  # run as an unprivileged user
    etc_read_only: bool = False  # /etc read-only, no deltad-inbox in it (ProtectSystem=strict)


def _file_in_the_way(tmp: Path) -> Path:
    (tmp / "file").write_text("not a directory\n")
    return tmp / "file"


def _hide_kubernetes(tmp: Path) -> None:
    # First on PYTHONPATH: `import kubernetes` fails as when the package is not installed.
    (tmp / "hide" / "kubernetes").mkdir(parents=True, exist_ok=True)
    (tmp / "hide" / "kubernetes" / "__init__.py").write_text(
        "raise ImportError(\"No module named 'kubernetes'\")\n"
    )


def _hide_opentelemetry(tmp: Path) -> None:
    # First on PYTHONPATH: `import opentelemetry...` fails as when the extra is not installed.
    (tmp / "hide" / "opentelemetry").mkdir(parents=True, exist_ok=True)
    (tmp / "hide" / "opentelemetry" / "__init__.py").write_text(
        "raise ImportError(\"No module named 'opentelemetry'\")\n"
    )


# The hiding directory first, then whatever the tests run with (a checkout's own code).
_HIDING = os.pathsep.join(["{tmp}/hide", *filter(None, [os.environ.get("PYTHONPATH")])])
OTLP = "http://127.0.0.1:4318/v1/traces"


def _garbage_tls(tmp: Path) -> dict[str, Any]:
    (tmp / "cert.pem").write_text("not a certificate\n")
    (tmp / "key.pem").write_text("not a key\n")
    return {"http": {"tls_cert": str(tmp / "cert.pem"), "tls_key": str(tmp / "key.pem")}}


def _oidc(**over: Any) -> dict[str, Any]:
    return {"issuer": "https://idp.example.org", "client_id": "deltad", **over}


def _email(**over: Any) -> dict[str, Any]:
    email = {"from_address": "d@d.example", "reply_domain": "d.example", "maildir": "/nonexistent"}
    return {"channels": {"email": {**email, **over}}}


def _email_ca(tmp: Path) -> dict[str, Any]:
    (tmp / "ca.pem").write_text("not a certificate\n")
    return _email(smtp={"ca_file": str(tmp / "ca.pem")})


def _slack(**over: Any) -> dict[str, Any]:
    return {
        "token": {"secret_env": "DELTAD_TEST_SLACK"},  # set by the case (`env`)
        "signing_secret": {"secret_file": "/nonexistent/slack-signing"},
        "channel": "C0123ABCD",
        **over,
    }  # the key's own checks (an inline token, ids, URLs): tests/unit/test_channels_slack.py


def _teams(**over: Any) -> dict[str, Any]:
    teams = {
        "app_id": "6d4c8a2e-1f0b-4c3a-9e7d-5b2a1c0d9e8f",
        "app_password": {"secret_file": "/nonexistent/teams-password"},
        "service_url": "https://smba.trafficmanager.net/amer/",
        "conversations": ["19:abc@thread.tacv2"],
    }
    return {k: v for k, v in {**teams, **over}.items() if v is not None}


def _root_only_maildir(tmp: Path) -> str:
    box = tmp / "Maildir"  # root's, 0700: what the MTA made before the operator's step
    for sub in ("new", "cur", "tmp"):
        (box / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
    box.chmod(0o700)
    return str(box)


# What deltad.service's ProtectSystem=strict does to /etc, in a mount namespace of the test's
# own (nothing outside it changes): read-only, and the inbox's user not in passwd and group.
# $1: a scratch directory; the rest: the command.
# $1: a scratch directory, $2: "ro" or "rw"; the rest: the command.
WITHOUT_INBOX_USER = r"""
# Private before anything is mounted; where / is no mount point (.ci/py313's chroot, itself in
# a private namespace already) it cannot be, nor need be.
mount --make-rprivate / 2>/dev/null || ! mountpoint -q /
# A copy of /etc mounted over it, not a file bound over /etc/passwd: a useradd beside us (another
# test making its user) replaces /etc/passwd by a rename, and the kernel then detaches a mount
# on the old file in every other namespace: deltad-inbox would be back mid-run. What vanishes
# while it is copied (useradd's passwd+ and locks) is not needed.
mkdir "$1/etc"; cp -a /etc/. "$1/etc" 2>/dev/null || true
grep -v '^deltad-inbox:' /etc/passwd > "$1/etc/passwd"
grep -v '^deltad-inbox:' /etc/group > "$1/etc/group"
mount --bind "$1/etc" /etc
if [ "$2" = ro ]; then mount -o remount,ro,bind /etc; fi
shift 2; exec "$@"
"""


def without_inbox_user(argv: list[str], scratch: Path, read_only: bool = True) -> list[str]:
    """argv run where `deltad-inbox` does not exist and /etc is read-only (or not)."""
    unshare = ["unshare", "--mount", "--propagation", "unchanged"]  # made private inside
    mode = "ro" if read_only else "rw"
    return [*unshare, "sh", "-euc", WITHOUT_INBOX_USER, "sh", str(scratch), mode, *argv]


KUBE = {"image": "registry.example/deltad:1", "pvc": "workspaces", "mount_path": "/srv/ws"}


def _slurm(**options: Any) -> Settings:
    return lambda tmp: {"executor": "slurm", "executors": {"slurm": options}}


def _kube(**options: Any) -> Settings:
    return lambda tmp: {"executor": "kubernetes", "executors": {"kubernetes": {**KUBE, **options}}}


def _webhook(signing: dict[str, str]) -> Settings:
    return lambda tmp: {
        "notify": {"webhooks": [{"url": "http://127.0.0.1:9/hook", "signing": signing}]}
    }


def _key_file(text: str | None, mode: int) -> Settings:
    """A `decision_key_file` holding `text` (None: a real Ed25519 key) with `mode`."""

    def settings(tmp: Path) -> dict[str, Any]:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        path = tmp / "decision-key"
        if text is None:
            path.write_bytes(
                Ed25519PrivateKey.generate().private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                )
            )
        else:
            path.write_text(text)
        path.chmod(mode)
        return {"decision_key_file": str(path)}

    return settings


CASES: dict[str, Case] = {
    # the key answers are signed with (docs/inbox.md, "Decisions only the daemon can sign")
    "decision key readable by others": Case(
        _key_file(None, 0o644), "decision_key_file: decision key /"
    ),
    "decision key not a key": Case(
        _key_file("not a key\n", 0o600), "not an Ed25519 private key in PEM"
    ),
    "trusted decision key malformed": Case(
        lambda tmp: {"decision_keys_trusted": ["rsa:AAAA"]},
        "decision_keys_trusted: not an ed25519 public key: 'rsa:AAAA'",
    ),
    # executors: each one's options are a model (extra keys forbidden, a did-you-mean)
    "slurm without options": Case(_slurm(), "executors.slurm.log_dir: required"),
    "slurm misspelt": Case(
        _slurm(log_dir="/tmp/l", partiton="hitl"),
        "executors.slurm.partiton: unknown option; did you mean 'partition'?",
    ),
    "slurm relative log_dir": Case(_slurm(log_dir="logs"), "executors.slurm.log_dir: an absolute"),
    "slurm poll_every a word": Case(
        _slurm(log_dir="/tmp/l", poll_every="fast"), "executors.slurm.poll_every: "
    ),
    "slurm log_dir unwritable": Case(
        lambda tmp: _slurm(log_dir=str(_file_in_the_way(tmp) / "logs"))(tmp),
        "executors.slurm.log_dir: ",
    ),
    "kubernetes not installed": Case(
        lambda tmp: (_hide_kubernetes(tmp), _kube()(tmp))[1],
        "executor: kubernetes needs the kubernetes package: pip install 'deltad[kubernetes]'",
        env={"PYTHONPATH": "{tmp}/hide"},
    ),
    "kubernetes misspelt": Case(
        _kube(namespce="x"), "executors.kubernetes.namespce: unknown option; did you mean"
    ),
    "kubernetes bad quantity": Case(
        _kube(resources={"limits": {"memory": "lots"}}), "executors.kubernetes.resources: "
    ),
    "kubernetes no cluster": Case(
        lambda tmp: _kube(kubeconfig=str(tmp / "missing"))(tmp),
        "executors.kubernetes.kubeconfig: no cluster to talk to",
    ),
    "fresh takes no options": Case(
        lambda tmp: {"executor": "fresh", "executors": {"fresh": {"colour": "red"}}},
        "executors.fresh: takes no options (got colour)",
    ),
    "auto's executor takes no options": Case(
        lambda tmp: {"executors": {"fork": {"x": 1}, "command": {"x": 1}}},
        "takes no options (got x)",
    ),
    "unknown executor": Case(lambda tmp: {"executor": "nope"}, "executor: unknown executor 'nope'"),
    "third-party misspelt": Case(
        lambda tmp: {"executor": "toy", "executors": {"toy": {"jurnal": "/j"}}},
        "executors.toy.jurnal: unknown option; did you mean 'journal'?",
    ),
    # the daemon's own keys
    "top-level misspelt": Case(
        lambda tmp: {"max_paralel_resumes": 3},
        "max_paralel_resumes: unknown key; did you mean 'max_parallel_resumes'?",
    ),
    "root key misspelt": Case(
        lambda tmp: {"roots": [{"path": str(tmp / "root"), "pollng": True}]},
        "roots.0.pollng: unknown key; did you mean 'polling'?",
    ),
    "no slots": Case(lambda tmp: {"max_parallel_resumes": 0}, "max_parallel_resumes: "),
    "no placeholder": Case(
        lambda tmp: {"resume_command": ["delta", "run"]}, "resume_command: must contain"
    ),
    "log level": Case(lambda tmp: {"log_level": "verbose"}, "log_level: "),
    "unknown owner": Case(
        lambda tmp: {"trusted_owners": ["no-such-user-dt"]},
        "trusted_owners: no user 'no-such-user-dt'",
    ),
    "roots a string": Case(lambda tmp: {"roots": "/srv/ws"}, "roots: must be a list"),
    "not YAML": Case(lambda tmp: {}, "line 2 is not valid YAML", raw="roots: [/a\nb: ]: c\n"),
    # directories this daemon must write
    "state_dir unwritable": Case(
        lambda tmp: {"state_dir": str(_file_in_the_way(tmp) / "state")}, "state_dir: "
    ),
    "lease directory unwritable": Case(
        lambda tmp: {"ha": {"lease": str(_file_in_the_way(tmp) / "lease")}}, "ha.lease: "
    ),
    "lease a directory": Case(lambda tmp: {"ha": {"lease": str(tmp)}}, "ha.lease: "),
    # a backend impossible under this process's privileges
    "fanotify unprivileged": Case(
        lambda tmp: {"roots": [{"path": str(tmp / "root"), "backend": "fanotify"}]},
        "roots.0: backend: fanotify is impossible here",
        as_nobody=True,
    ),
    # channels: slack (the secrets read, the inbox its interactions need)
    "slack secret file missing": Case(
        lambda tmp: {"http": {"listen": "127.0.0.1:0"}, "channels": {"slack": _slack()}},
        "channels.slack.signing_secret.secret_file: /nonexistent/slack-signing",
        env={"DELTAD_TEST_SLACK": "xoxb-test"},
    ),
    "slack without http": Case(
        lambda tmp: {
            "channels": {"slack": _slack(signing_secret={"secret_env": "DELTAD_TEST_SLACK"})}
        },
        "channels.slack: needs http",
        env={"DELTAD_TEST_SLACK": "xoxb-test"},
    ),
    # http.oidc (sign-in through an OpenID provider; its client secret read by the core)
    "oidc issuer not https": Case(
        lambda tmp: {"http": {"oidc": {"issuer": "http://idp.example.org", "client_id": "d"}}},
        "http.oidc.issuer: must be an https:// URL",
    ),
    "oidc client_id empty": Case(
        lambda tmp: {"http": {"oidc": {"issuer": "https://idp.example.org", "client_id": ""}}},
        "http.oidc.client_id",
    ),
    "oidc secret file missing": Case(
        lambda tmp: {"http": {"oidc": _oidc(client_secret={"secret_file": "/nonexistent/s"})}},
        "http.oidc.client_secret.secret_file: /nonexistent/s",
    ),
    "oidc secret env unset": Case(
        lambda tmp: {"http": {"oidc": _oidc(client_secret={"secret_env": "DELTAD_TEST_NO"})}},
        "http.oidc.client_secret: environment variable DELTAD_TEST_NO is not set",
    ),
    "oidc secret both file and env": Case(
        lambda tmp: {
            "http": {"oidc": _oidc(client_secret={"secret_env": "X", "secret_file": "/x"})}
        },
        "http.oidc.client_secret",
    ),
    "oidc redirect_url not a URL": Case(
        lambda tmp: {"http": {"oidc": _oidc(redirect_url="inbox.example.org/cb")}},
        "http.oidc.redirect_url",
    ),
    "oidc scopes without openid": Case(
        lambda tmp: {"http": {"oidc": _oidc(scopes=["email"])}}, "http.oidc.scopes"
    ),
    "oidc groups_claim empty": Case(
        lambda tmp: {"http": {"oidc": _oidc(groups_claim="")}}, "http.oidc.groups_claim"
    ),
    "oidc role unknown": Case(lambda tmp: {"http": {"oidc": _oidc(role="root")}}, "http.oidc.role"),
    "oidc workspaces a bad glob": Case(
        lambda tmp: {"http": {"oidc": _oidc(workspaces=["relative/*"])}}, "http.oidc.workspaces"
    ),
    "oidc audience empty": Case(
        lambda tmp: {"http": {"oidc": _oidc(audience="")}}, "http.oidc.audience"
    ),
    "oidc cache_seconds zero": Case(
        lambda tmp: {"http": {"oidc": _oidc(cache_seconds=0)}}, "http.oidc.cache_seconds"
    ),
    # traces (OpenTelemetry, OTLP/HTTP): each key in one line
    "traces endpoint not a URL": Case(
        lambda tmp: {"traces": {"otlp_endpoint": "collector:4318"}},
        "traces.otlp_endpoint: must be an http:// or https:// URL",
    ),
    "traces endpoint with a credential": Case(
        lambda tmp: {"traces": {"otlp_endpoint": "https://user:pw@collector.example/v1/traces"}},
        "traces.otlp_endpoint: no credentials in the URL: put them in headers_file",
    ),
    "traces endpoint missing": Case(
        lambda tmp: {"traces": {"service_name": "deltad"}}, "traces.otlp_endpoint"
    ),
    "traces key misspelt": Case(
        lambda tmp: {"traces": {"otlp_endpoint": OTLP, "service": "x"}}, "traces.service"
    ),
    "traces queue of none": Case(
        lambda tmp: {"traces": {"otlp_endpoint": OTLP, "max_queue": 0}}, "traces.max_queue"
    ),
    "traces headers file missing": Case(
        lambda tmp: {"traces": {"otlp_endpoint": OTLP, "headers_file": "/nonexistent/h"}},
        "traces.headers_file: /nonexistent/h: No such file or directory",
    ),
    "traces headers file not headers": Case(
        lambda tmp: (
            (tmp / "headers").write_text("Bearer abc\n"),
            {"traces": {"otlp_endpoint": OTLP, "headers_file": str(tmp / "headers")}},
        )[1],
        "traces.headers_file: line 1 is not `Name: value`",
    ),
    "traces not installed": Case(
        lambda tmp: (_hide_opentelemetry(tmp), {"traces": {"otlp_endpoint": OTLP}})[1],
        "traces: the OpenTelemetry packages are not installed (pip install 'deltad[traces]')",
        env={"PYTHONPATH": _HIDING},
    ),
    # channels: pagerduty (the integration key read by the core)
    "pagerduty routing key file missing": Case(
        lambda tmp: {
            "channels": {"pagerduty": {"routing_key": {"secret_file": "/nonexistent/pd-key"}}}
        },
        "channels.pagerduty.routing_key.secret_file: /nonexistent/pd-key",
    ),
    "pagerduty severity unknown": Case(
        lambda tmp: {
            "channels": {
                "pagerduty": {"routing_key": {"secret_env": "PD_KEY"}, "severity": "urgent"}
            }
        },
        "channels.pagerduty.severity",
    ),
    # channels: teams (the app password read by the core, each key checked in one line)
    "teams app password file missing": Case(
        lambda tmp: {"http": {"listen": "127.0.0.1:0"}, "channels": {"teams": _teams()}},
        "channels.teams.app_password.secret_file: /nonexistent/teams-password",
    ),
    "teams without http": Case(
        lambda tmp: {
            "channels": {"teams": _teams(app_password={"secret_env": "DELTAD_TEST_TEAMS"})}
        },
        "channels.teams: needs http",
        env={"DELTAD_TEST_TEAMS": "pw"},
    ),
    "teams app id missing": Case(
        lambda tmp: {"channels": {"teams": _teams(app_id=None)}}, "channels.teams.app_id"
    ),
    "teams service url not a url": Case(
        lambda tmp: {"channels": {"teams": _teams(service_url="smba.example")}},
        "channels.teams.service_url",
    ),
    "teams openid metadata url not a url": Case(
        lambda tmp: {"channels": {"teams": _teams(openid_metadata_url="ftp://x")}},
        "channels.teams.openid_metadata_url",
    ),
    "teams token url not a url": Case(
        lambda tmp: {"channels": {"teams": _teams(token_url="token")}},
        "channels.teams.token_url",
    ),
    "teams no conversation": Case(
        lambda tmp: {"channels": {"teams": _teams(conversations=[])}},
        "channels.teams.conversations",
    ),
    "teams person not an entra object id": Case(
        lambda tmp: {"channels": {"teams": _teams(people={"alice@example.org": "alice"})}},
        "channels.teams.people",
    ),
    # channels: email (the inbox's user reads the Maildir, never root)
    "maildir the inbox cannot read": Case(
        lambda tmp: _email(maildir=_root_only_maildir(tmp)), "channels.email.maildir: "
    ),
    # channels: email (what the inbox process is handed to send mail, read by the core)
    "email ca_file not a certificate": Case(_email_ca, "channels.email.smtp.ca_file: "),
    "email password env unset": Case(
        lambda tmp: _email(smtp={"username": "u", "password": {"secret_env": "DELTAD_TEST_NO"}}),
        "channels.email.smtp.password: environment variable DELTAD_TEST_NO is not set",
    ),
    # the inbox
    "http.user unknown": Case(
        lambda tmp: {"http": {"listen": "127.0.0.1:0", "user": "no-such-user-dt"}},
        "http.user no-such-user-dt: no such user",
    ),
    "inbox user unmakeable": Case(  # systemd/sysusers.d/deltad.conf makes it
        lambda tmp: {"http": {"listen": "127.0.0.1:0"}},
        "http.user deltad-inbox does not exist and cannot be made (/etc is read-only): make it",
        etc_read_only=True,
    ),
    "inbox user unmakeable, webhooks only": Case(
        lambda tmp: {"notify": {"webhooks": [{"url": "http://127.0.0.1:9/hook"}]}},
        "http.user deltad-inbox does not exist and cannot be made (/etc is read-only)",
        etc_read_only=True,
    ),
    "http key misspelt": Case(
        lambda tmp: {"http": {"lisen": "127.0.0.1:0"}},
        "http.lisen: unknown key; did you mean 'listen'?",
    ),
    "http in clear": Case(lambda tmp: {"http": {"listen": "0.0.0.0:0"}}, "http: listen 0.0.0.0"),
    "http address not ours": Case(
        lambda tmp: {"http": {"listen": "192.0.2.1:8470", "allow_insecure_remote": True}},
        "http.listen: cannot listen on 192.0.2.1",
    ),
    "tls files missing": Case(
        lambda tmp: {"http": {"tls_cert": str(tmp / "c.pem"), "tls_key": str(tmp / "k.pem")}},
        "http.tls_cert: ",
    ),
    "tls files not pem": Case(_garbage_tls, "http.tls_cert/tls_key: cannot be used"),
    "mcp path taken": Case(
        lambda tmp: {"http": {"listen": "127.0.0.1:0", "mcp": {"path": "/v1/mcp"}}},
        "http.mcp.path: must not be under a path the inbox already serves",
    ),
    "webhook secret file missing": Case(
        _webhook({"secret_file": "/nonexistent/secret"}),
        "notify.webhooks.0.signing.secret_file: /nonexistent/secret",
    ),
    "webhook secret env unset": Case(
        _webhook({"secret_env": "DELTAD_TEST_UNSET_SECRET"}),
        "notify.webhooks.0.signing: environment variable DELTAD_TEST_UNSET_SECRET is not set",
    ),
}


def _write(base: Path, case: Case) -> Path:
    (base / "root").mkdir(exist_ok=True)
    config = base / "deltad.yaml"
    if case.raw is not None:
        config.write_text(case.raw)
    else:
        good = {"roots": [str(base / "root")], "state_dir": str(base / "state")}
        config.write_text(yaml.safe_dump({**good, **case.settings(base)}))
    os.chmod(config, 0o644)
    return config


def _run(cmd: str, config: Path, case: Case, tmp: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DELTAD_", "STATE_DIR"))}
    env |= {k: v.format(tmp=tmp) for k, v in case.env.items()}
    argv = [DELTAD, cmd, "--config", str(config)]
    if case.as_nobody:
        argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv]
    if case.etc_read_only:
        argv = without_inbox_user(argv, tmp)
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)


def _one_line(out: subprocess.CompletedProcess[str], config: Path, says: str) -> None:
    lines = out.stderr.splitlines()
    assert "Traceback" not in out.stderr, out.stderr
    assert out.returncode == 2, out.stderr
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(f"deltad: error: {config}: ") and says in lines[0], lines[0]


@pytest.mark.parametrize("cmd", ["check", "serve"])
@pytest.mark.parametrize("name", list(CASES))
def test_a_bad_config_is_one_line_and_exit_2(
    tmp_path: Path,
    name: str,
    cmd: str,
    toy_installed: None,  # noqa: F811
) -> None:
    case = CASES[name]
    if (case.as_nobody or case.etc_read_only) and os.geteuid() != 0:
        pytest.skip("runs deltad as another user or in a mount namespace: needs root")
    if case.as_nobody:
        with executable_by_all(), shared_tmp() as base:  # pytest's tmp dirs are 0700
            config = _write(base, case)
            out = _run(cmd, config, case, base)
    else:
        config = _write(tmp_path, case)
        out = _run(cmd, config, case, tmp_path)
    _one_line(out, config, case.says)


def test_the_table_is_long_enough() -> None:
    assert len(CASES) >= 20


def test_serve_says_in_one_line_that_its_port_is_taken(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        case = Case(lambda tmp: {"http": {"listen": f"127.0.0.1:{port}"}}, "")
        config = _write(tmp_path, case)
        assert _run("check", config, case, tmp_path).returncode == 0  # it may be ours, running
        out = _run("serve", config, case, tmp_path)
    _one_line(out, config, f"http.listen: cannot listen on 127.0.0.1:{port}: Address already")


def test_check_passes_a_missing_inbox_user_that_serve_can_make(tmp_path: Path) -> None:
    """/etc writable: `serve` makes deltad-inbox itself (useradd), so `check` does not refuse."""
    if os.geteuid() != 0:
        pytest.skip("a mount namespace: needs root")
    case = Case(lambda tmp: {"http": {"listen": "127.0.0.1:0"}}, "")
    config = _write(tmp_path, case)
    argv = without_inbox_user([DELTAD, "check", "--config", str(config)], tmp_path, False)
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
