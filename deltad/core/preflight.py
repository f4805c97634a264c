"""What `deltad serve` would refuse on this host that reading the config cannot see: run by
`deltad check` and by `serve` before it starts, one line per problem, each naming its key.

Nothing here starts anything or changes anything: directories are judged with access(2),
the executor by its factory's `preflight` (a package installed, a client made, Slurm's
commands found), the inbox's address by binding port 0 on it (the configured port may be a
running daemon's own), TLS files and signing secrets by loading them.
"""

from __future__ import annotations

import os
import pwd
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from deltad.core.config import DaemonConfig
from deltad.inbox.config import OidcConfig, Secret
from deltad.validation import dir_problem, printable


def problems(config: DaemonConfig, source: str) -> list[str]:
    """One line per problem: `SOURCE: KEY: what is wrong`."""
    return [printable(f"{source}: {line}") for line in _all(config)]


def _all(config: DaemonConfig) -> Iterator[str]:
    if (state_dir := dir_problem(config.state_dir)) is not None:
        yield f"state_dir: {state_dir}"
    if config.ha is not None:
        yield from _lease(config.ha.lease)
    from deltad.inbox.sealing import problem_of

    # The default key lives in the state dir: one line for the state dir is enough.
    checked = state_dir is None or config.decision_key_file is not None
    if checked and (problem := problem_of(config.decision_key_path())) is not None:
        yield f"decision_key_file: {problem}"
    yield from _executor(config)
    if config.http is not None:
        yield from _http(config)
    if _starts_inbox(config):
        yield from _inbox_user(config)
    if config.notify is not None:
        yield from _secrets(config)
    if config.channels is not None and config.channels.slack is not None:
        yield from _slack(config)
    if config.channels is not None and config.channels.email is not None:
        yield from _email(config)
        yield from _maildir(config)
    if config.channels is not None and config.channels.pagerduty is not None:
        yield from _pagerduty(config)
    if config.channels is not None and config.channels.teams is not None:
        yield from _teams(config)
    if config.traces is not None:
        yield from _traces(config)


def _lease(lease: Path) -> Iterator[str]:
    from deltad.core.lease import lease_problem

    if lease.is_dir() or (lease.exists() and not lease.is_file()):
        yield f"ha.lease: {lease} is not a regular file"
    elif (problem := dir_problem(lease.parent)) is not None:
        yield f"ha.lease: {problem}"
    elif (problem := lease_problem(lease)) is not None:
        # Who may write where it lives decides who acts (OpenSSH's StrictModes, for the lease):
        # a tenant could keep every daemon on standby, or make two actives.
        yield f"ha.lease: {printable(problem)}"


def _executor(config: DaemonConfig) -> Iterator[str]:
    from deltad.executors import registry

    kind = config.executor_kind()
    try:
        registry.preflight(kind, config.executors.get(kind, {}))
    except ValueError as e:
        yield str(e)


def _http(config: DaemonConfig) -> Iterator[str]:
    from deltad.inbox.config import split_listen

    http = config.http
    assert http is not None
    host, _ = split_listen(http.listen)
    try:  # port 0: the address is this host's, whatever holds the port now
        infos = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)
        with socket.socket(infos[0][0], socket.SOCK_STREAM) as sock:
            sock.bind(infos[0][4])
    except OSError as e:
        yield f"http.listen: cannot listen on {host}: {e.strerror or e}"
    if http.tls_cert is not None and http.tls_key is not None:
        for key, path in (("tls_cert", http.tls_cert), ("tls_key", http.tls_key)):
            try:
                with open(path, "rb"):
                    pass
            except OSError as e:
                yield f"http.{key}: {path}: {e.strerror}"
                return
        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
                http.tls_cert, http.tls_key
            )
        except (OSError, ssl.SSLError) as e:
            yield f"http.tls_cert/tls_key: cannot be used: {e}"
    if http.oidc is not None:
        yield from _oidc(http.oidc)


def _oidc(oidc: OidcConfig) -> Iterator[str]:
    """The client secret can be read (the core reads it and hands it to the inbox); the
    provider itself is not asked (check reaches no network)."""
    if oidc.client_secret is not None:
        yield from _secret("http.oidc.client_secret", oidc.client_secret, exact=True)


def _starts_inbox(config: DaemonConfig) -> bool:
    """`serve` starts the inbox process for HTTP, and without it for what the inbox sends
    (webhooks, notify commands, the channels' messages)."""
    notify, channels = config.notify, config.channels
    return (
        config.http is not None
        or (notify is not None and bool(notify.webhooks or notify.commands))
        or (
            channels is not None
            and any(
                c is not None
                for c in (channels.email, channels.slack, channels.pagerduty, channels.teams)
            )
        )
    )


def _inbox_user(config: DaemonConfig) -> Iterator[str]:
    """The inbox's user exists, or `serve` can make it (as root it runs `useradd`, which
    cannot write a read-only /etc: deltad.service's ProtectSystem=strict)."""
    from deltad.privsep.core import DEFAULT_USER, account_problem

    if (problem := account_problem(config.http.user if config.http else DEFAULT_USER)) is not None:
        yield problem


def _secrets(config: DaemonConfig) -> Iterator[str]:
    from deltad.outbound import webhooks

    assert config.notify is not None
    for i, hook in enumerate(config.notify.webhooks):
        if hook.signing is None:
            continue
        try:
            webhooks.signing_key(hook.signing.read())
        except OSError as e:
            yield f"notify.webhooks.{i}.signing.secret_file: {e.filename}: {e.strerror}"
        except ValueError as e:
            yield f"notify.webhooks.{i}.signing: {e}"


def _email(config: DaemonConfig) -> Iterator[str]:
    """What the inbox process is handed to send mail: the SMTP password and the CA's
    certificates (read by the core, which alone may read their files)."""
    from deltad.outbound import senders

    assert config.channels is not None and config.channels.email is not None
    smtp = config.channels.email.smtp
    if smtp.password is not None:
        try:
            smtp.password.read()
        except OSError as e:
            yield f"channels.email.smtp.password.secret_file: {e.filename}: {e.strerror}"
        except ValueError as e:
            yield f"channels.email.smtp.password: {e}"
    if smtp.ca_file is not None:
        try:
            senders.ca_text(smtp.ca_file)
        except ValueError as e:
            yield f"channels.{e}"


def _secret(where: str, secret: Secret, *, exact: bool = False) -> Iterator[str]:
    """A channel's secret can be read (the core reads it and hands it to the inbox), and is
    not empty (`exact`: nor has spaces around it, as an integration key never does)."""
    try:
        value = secret.read()
    except OSError as e:
        yield f"{where}.secret_file: {e.filename}: {e.strerror}"
        return
    except ValueError as e:
        yield f"{where}: {e}"
        return
    if not value.strip():
        yield f"{where}: the secret is empty"
    elif exact and value != value.strip():
        yield f"{where}: spaces around it"


def _slack(config: DaemonConfig) -> Iterator[str]:
    """The Slack channel's two secrets can be read, and its interactions have an inbox."""
    assert config.channels is not None and config.channels.slack is not None
    slack = config.channels.slack
    if config.http is None:
        yield "channels.slack: needs http (Slack posts its buttons' clicks to the inbox)"
    yield from _secret("channels.slack.token", slack.token)
    yield from _secret("channels.slack.signing_secret", slack.signing_secret)


def _pagerduty(config: DaemonConfig) -> Iterator[str]:
    """The integration key can be read."""
    assert config.channels is not None and config.channels.pagerduty is not None
    yield from _secret(
        "channels.pagerduty.routing_key", config.channels.pagerduty.routing_key, exact=True
    )


def _teams(config: DaemonConfig) -> Iterator[str]:
    """The app password can be read, and the activities Teams posts have an inbox to reach."""
    assert config.channels is not None and config.channels.teams is not None
    if config.http is None:
        yield "channels.teams: needs http (Teams posts its cards' actions to the inbox)"
    yield from _secret("channels.teams.app_password", config.channels.teams.app_password)


def _traces(config: DaemonConfig) -> Iterator[str]:
    """The exporter can be made: the packages are installed, the headers file reads."""
    from deltad import tracing

    assert config.traces is not None
    try:
        tracing.headers_of(config.traces.headers_file)
    except OSError as e:
        yield f"traces.headers_file: {e.filename}: {e.strerror}"
    except (ValueError, UnicodeDecodeError) as e:
        yield f"traces.headers_file: {e}"
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        yield "traces: the OpenTelemetry packages are not installed (pip install 'deltad[traces]')"


# Run as the inbox's user (its uid, its group, no other group: as the inbox runs): can it list
# new/, read a message there, and move one to cur/? One line on stdout when not.
MAILDIR_PROBE = r"""
import errno, os, sys
box, user = sys.argv[1], sys.argv[2]
try:
    os.stat(box)
except FileNotFoundError:
    sys.exit(0)  # not made yet: the MTA makes it on first mail (the inbox says if it cannot)
except OSError as e:
    print(f"{box}: the inbox's user {user} cannot reach it ({e.strerror})")
    sys.exit(1)
for sub in ("new", "cur"):
    d = os.path.join(box, sub)
    if os.path.isdir(d) and not os.access(d, os.R_OK | os.W_OK | os.X_OK):
        print(f"{d}: the inbox's user {user} cannot read and write it")
        sys.exit(1)
new = os.path.join(box, "new")
try:
    names = sorted(n for n in os.listdir(new) if not n.startswith("."))
except FileNotFoundError:
    sys.exit(0)
except OSError as e:
    print(f"{new}: the inbox's user {user} cannot list it ({e.strerror})")
    sys.exit(1)
for n in names[:1]:
    try:
        os.close(os.open(os.path.join(new, n), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK))
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EPERM):
            print(f"{new}/{n}: the inbox's user {user} cannot read it (delivered as another user)")
            sys.exit(1)
"""


def _maildir(config: DaemonConfig) -> Iterator[str]:
    """The inbox process reads the email channel's Maildir as its own user, never as root: that
    user must be able to (docs/inbox.md, "Email": the operator's one step)."""
    from deltad.privsep.core import DEFAULT_USER

    assert config.channels is not None and config.channels.email is not None
    box = config.channels.email.maildir
    user = config.http.user if config.http is not None else DEFAULT_USER
    how = 'give it the Maildir (docs/inbox.md, "Email")'
    if not os.path.lexists(box):
        return  # not made yet: the MTA makes it on first mail (the inbox says if it cannot)
    ids: dict[str, object] = {}
    if os.geteuid() == 0:
        try:
            pw = pwd.getpwnam(user)
        except KeyError:
            yield (
                f"channels.email.maildir: the inbox's user {user} does not exist: make it "
                f"(useradd --system --user-group {user}) and {how}"
            )
            return
        ids = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}
    else:
        try:  # not root: the inbox runs as this user
            user = pwd.getpwuid(os.geteuid()).pw_name
        except KeyError:  # a uid without a name (a container)
            user = str(os.geteuid())
    argv = [sys.executable, "-I", "-S", "-c", MAILDIR_PROBE, str(box), user]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=30, check=False, cwd="/", **ids
        )  # type: ignore[call-overload]
    except (OSError, subprocess.TimeoutExpired) as e:
        yield f"channels.email.maildir: cannot check it as {user}: {e}"
        return
    if done.returncode != 0:
        said = (done.stdout.strip() or done.stderr.strip()).splitlines()
        yield f"channels.email.maildir: {said[-1] if said else 'unusable'}; {how}"
